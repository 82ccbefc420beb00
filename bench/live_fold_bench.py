"""CPU per rollout of the live figures' lazy fold (``ProfileState.live()``), in process.

    python bench/live_fold_bench.py [--tasks 20000] [--repeats 8]

Feeds a generated collection through the processor's :class:`Pipeline` and calls the rollout
part's ``live()`` after every 2,048 rollouts, as a processor's summaries (page, metrics,
member records) read it; only those calls are timed. Run as a script, it measures whichever
tree ``PYTHONPATH`` names, so the code before a change is timed with the same script
(BENCHMARKS.md: the confidence sequences' fold, issue 27).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from bench.generate import generate
from rewardstream.contract.events import RunStarted, encode
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.producers.events import WireEvent, input_events, rollout_events

_EVERY = 2048


def _fed(pipeline: Pipeline, events: Iterable[WireEvent], part: str) -> Iterator[int]:
    """Hand each event to ``pipeline`` as ``part``'s; yield how many so far after each."""
    for n, e in enumerate(events, 1):
        pipeline.handle(e.kind, e.value, part)
        yield n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stem = Path(tmp) / "r"
        generate(a.tasks, a.repeats, stem, text_bytes=64, seed=0)
        with Pipeline(Path(tmp) / "out") as pipeline:
            rows = input_events(stem.with_name("r_materialized_inputs.jsonl"), "run")
            inputs = max(_fed(pipeline, rows, "input-0"))
            # one rollout more than there are, so the run never completes and retires
            started = RunStarted(run_id="run", expected_rollouts=inputs + 1, output_stem="r")
            pipeline.handle("control", encode(started))
            part = pipeline.runs["run"].parts
            spent = 0.0
            for n in _fed(pipeline, rollout_events(stem.with_suffix(".jsonl"), "run"), "rollout-0"):
                if n % _EVERY == 0 or n == inputs:
                    t0 = time.process_time()
                    part["rollout-0"].live()
                    spent += time.process_time() - t0
            print(f"live fold: {spent / inputs * 1e6:.3f} us CPU per rollout over {inputs:,}")


if __name__ == "__main__":
    main()
