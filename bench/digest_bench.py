"""The content digest's cost in the processor's fold: ``Pipeline.handle_rollouts`` per rollout
with :func:`rewardstream.contract.events.content_digest` (XXH3) against the same fold with a blake2b
digest of the same packed bytes (what it used before), interleaved in one session.

    .venv/bin/python -m bench.digest_bench [--tasks 20000] [--repeats 8] [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import rewardstream.processors.engine.runs as runs_module
from rewardstream.contract.events import Input, Rollout, content_bytes, content_digest, encode
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.engine.pipeline import Pipeline

SLICE = 2_048  # events per handle_* call, as the processor applies them

Digest = Callable[[Input | Rollout], int]


def blake2b_digest(event: Input | Rollout) -> int:
    """The baseline: the same packed content, hashed with blake2b (8 bytes)."""
    return int.from_bytes(hashlib.blake2b(content_bytes(event), digest_size=8).digest())


def events(tasks: int, repeats: int) -> tuple[list[bytes], list[bytes]]:
    """Input and rollout events of one run, binary rewards, a small int field."""
    inputs, rollouts = [], []
    for t in range(tasks):
        for r in range(repeats):
            row = {"_ng_task_index": t, "_ng_rollout_index": r, "q": "x"}
            inputs.append(encode(Input(run_id="r", line=t * repeats + r, row=row)))
            result = {"reward": float((t + r) % 2), "_ng_task_index": t, "_ng_rollout_index": r}
            record = extract_result({**result, "n": t % 7}, t, r)
            event = Rollout(run_id="r", task=t, rollout=r, record=record, published_at=0.0)
            rollouts.append(encode(event))
    return inputs, rollouts


def fold_us(digest: Digest, inputs: list[bytes], rollouts: list[bytes]) -> float:
    """Microseconds per rollout of ``handle_rollouts`` (the rows applied first, untimed)."""
    setattr(runs_module, "content_digest", digest)  # noqa: B010 (the one name the fold calls)
    with tempfile.TemporaryDirectory() as folder, Pipeline(Path(folder)) as pipeline:
        for i in range(0, len(inputs), SLICE):
            chunk = inputs[i : i + SLICE]
            pipeline.handle_inputs(chunk, "input-0", range(i, i + len(chunk)))
        began = time.perf_counter()
        for i in range(0, len(rollouts), SLICE):
            chunk = rollouts[i : i + SLICE]
            if pipeline.handle_rollouts(chunk, "rollout-0", range(i, i + len(chunk))) is None:
                raise SystemExit("a slice left the fast path: the bench measures the wrong thing")
        return (time.perf_counter() - began) / len(rollouts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    inputs, rollouts = events(args.tasks, args.repeats)
    found: dict[str, list[float]] = {"blake2b": [], "xxh3": []}
    for _ in range(args.runs):  # interleaved: the machine's drift hits both alike
        found["blake2b"].append(fold_us(blake2b_digest, inputs, rollouts))
        found["xxh3"].append(fold_us(content_digest, inputs, rollouts))
    for name, times in found.items():
        print(f"{name}: best {min(times):.2f} us, median {statistics.median(times):.2f} us")
    ratio = min(found["xxh3"]) / min(found["blake2b"])
    print(f"xxh3 / blake2b (best of {args.runs}): {ratio:.2f}")


if __name__ == "__main__":
    main()
