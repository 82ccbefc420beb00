"""What the live page and the whole-run view cost at the issue's scale (100,000 tasks x 8).

    python -m bench.page_bench [--tasks 100000] [--repeats 8] [--units 8]

Feeds a generated collection through the processor's :class:`Pipeline` in process, split over
``--units`` partitions by task as Kafka splits it, then measures:

- the parts' task figures (what each part's summary recomputes while rollouts come, at most
  every 2 s and within 5% of a core for all parts together), against the floor: the same
  figures over the whole state at once (what ``/metrics`` computes at a scrape);
- the member record: its size with every unit's live summary, and the time to encode it and to
  decode it back into summaries (a peer does that for every record it reads);
- ``GET /runs/<id>``'s view (merge of the summaries) and one page push (runs, the run's view,
  a full history of 720 points): time and bytes.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.generate import generate
from rewardstream.contract.engine import MemberRecord, UnitProgress, decode_member, encode_record
from rewardstream.contract.events import RunStarted, encode
from rewardstream.processors.core.passk import curve_ks
from rewardstream.processors.core.profile import live_figures
from rewardstream.processors.engine.live import AgentLive, History
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import FIGURES_COST, FIGURES_EVERY
from rewardstream.processors.http.page import HISTORY_EVERY, LiveView
from rewardstream.producers.events import input_events, rollout_events


def _best(f: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--units", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate(a.tasks, a.repeats, work / "r", text_bytes=64, seed=0)
        with Pipeline(work / "out") as pipeline:
            inputs = 0
            for e in input_events(work / "r_materialized_inputs.jsonl", "run"):
                pipeline.handle(e.kind, e.value, f"input-{int(e.key) % a.units}")
                inputs += 1
            started = RunStarted(run_id="run", expected_rollouts=inputs, output_stem="r")
            pipeline.handle("control", encode(started))
            for e in rollout_events(work / "r.jsonl", "run"):
                pipeline.handle(e.kind, e.value, f"rollout-{int(e.key) % a.units}")
            run = pipeline.runs["run"]
            parts = [p for n, p in run.parts.items() if n.startswith("rollout-")]
            print(f"{a.tasks:,} tasks x {a.repeats} in {len(parts)} partitions")

            floor = _best(lambda: live_figures([p.state for p in parts], curve_ks), 3)
            took = [_best(functools.partial(live_figures, [p.state], curve_ks), 3) for p in parts]
            waits = [max(FIGURES_EVERY, FIGURES_COST * len(parts) * t) for t in took]
            load = sum(t / w for t, w in zip(took, waits, strict=True))
            print(
                f"task figures: all parts one by one {sum(took) * 1e3:.0f} ms vs the whole state "
                f"at once (floor) {floor * 1e3:.0f} ms = {sum(took) / floor:.2f}x; renewed "
                f"every {max(waits):.1f} s at most while rollouts come: {load * 100:.1f}% of a core"
            )

            now = time.monotonic()
            units = {
                name: UnitProgress(
                    position=0,
                    runs={"run": (part.inputs, part.rollouts)},
                    live={"run": {k: s.to_wire() for k, s in part.summary(now).items()}},
                )
                for name, part in run.parts.items()
            }
            record = MemberRecord(
                prefix="p", group="g", member="m", generation=1, url=None, units=units, at=0.0
            )
            raw = encode_record(record)
            enc = _best(lambda: encode_record(record))

            def decode() -> None:
                got = decode_member(raw, "p")
                for unit in got.units.values():
                    for agents in unit.live.values():
                        {a: AgentLive.from_wire(w) for a, w in agents.items()}

            dec = _best(decode)
            print(
                f"member record: {len(raw):,} B for {len(units)} units x 1 run x "
                f"{len(run.whole(now))} agents; encode {enc * 1e3:.2f} ms, "
                f"decode {dec * 1e3:.2f} ms"
            )

            view = LiveView(pipeline)
            history = view.histories["run"] = History(HISTORY_EVERY)
            history.points = [
                {
                    "at": float(i),
                    "rollouts": i,
                    "failed": 0,
                    "agents": {a: [i, 0.5, 0.5, 0.0, 1.0] for a in run.whole(now)},
                }
                for i in range(history.limit)
            ]
            detail = _best(lambda: view.detail(run))
            body = orjson.dumps({"runs": view.runs(), "run": view.detail(run), "history": []})
            full = orjson.dumps(
                {"runs": view.runs(), "run": view.detail(run), "history": history.points}
            )
            print(
                f"GET /runs/<id> view: {detail * 1e3:.2f} ms; a page push {len(body):,} B, "
                f"the first one (720 history points) {len(full):,} B"
            )


if __name__ == "__main__":
    main()
