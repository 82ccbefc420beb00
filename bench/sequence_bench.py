"""The cost of folding the agent sequences in dispatch order, per rollout, against its floor.

    python -m bench.sequence_bench [--tasks 25000] [--repeats 8] [--in-flight 256] [--every 2000]

A collection of ``tasks x repeats`` rows (one agent, 0/1 rewards) whose results come out of
order, as a collector with ``--in-flight`` rollouts in flight returns them, is added to a
:class:`~rewardstream.processors.core.state.ProfileState` ``--every`` results at a time, and
after each batch a processor's summary work is timed: :class:`SequenceFold` reading the new
rows and results, folding what it can in dispatch order and moving its ladder up to the cut
(what a member record or the whole-run view does). The floor, in the same run on the same
batches, is what the processors did before: :meth:`Tally.add_many` over each batch's rewards
in arrival order (an interval that right-first arrivals tilt). Reported: microseconds per
rollout of each, their ratio, and whether the fold saw every row (a fold that stalls or skips
one fails the run, exit 1).

Then an update with nothing new, as every summary makes between results, with ``--gone`` rows
(of ``tasks x repeats``) that will never have a result (failed for good, skipped) and a row
still waiting before them: microseconds per update, and its ratio to the floor's cost per
batch in the first run (a no-op update must not cost what is gone: a finding above 1).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.sequence import SequenceFold
from rewardstream.processors.core.state import ProfileState


def measure(
    tasks: int, repeats: int, in_flight: int, every: int, seed: int = 0
) -> dict[str, float]:
    """One run: per rollout, the fold's and the floor's microseconds, and rows folded."""
    rng = np.random.default_rng(seed)
    n = tasks * repeats
    state = ProfileState()
    for line in range(n):
        row = {"_ng_task_index": line // repeats, "_ng_rollout_index": line % repeats}
        state.add_input({**row, "agent_ref": {"name": "a"}}, 0, line)
    rewards = (rng.random(n) < 0.5).astype(np.float64)
    latency = rng.lognormal(0.0, 0.5, n) * (1 + 2 * (1 - rewards))  # wrong ones 3x slower
    arrival = np.argsort(np.arange(n) * (float(latency.mean()) / in_flight) + latency)
    fold, floor = SequenceFold(False), Tally()
    spent = floor_spent = 0.0
    for lo in range(0, n, every):
        batch = arrival[lo : lo + every].tolist()
        records = []
        for line in batch:
            task, rollout = divmod(line, repeats)
            result = {
                "_ng_task_index": task,
                "_ng_rollout_index": rollout,
                "reward": float(rewards[line]),
            }
            records.append(extract_result(result, task, rollout))
        state.add_records(
            [line // repeats for line in batch],
            [line % repeats for line in batch],
            records,
            ["a"] * len(batch),
        )
        began = time.perf_counter()
        fold.update(state, state, rows_known=True)
        frontier = fold.ladders()["a"].frontier
        fold.ladders({"a": math.inf if frontier is None else frontier})
        spent += time.perf_counter() - began
        began = time.perf_counter()
        floor.add_many(rewards[arrival[lo : lo + every]])
        floor_spent += time.perf_counter() - began
    folded = fold.ladders()["a"].at(math.inf)[0]
    return {
        "rollouts": n,
        "fold_us": 1e6 * spent / n,
        "floor_us": 1e6 * floor_spent / n,
        "ratio": spent / floor_spent,
        "folded": folded,
    }


def idle(tasks: int, repeats: int, gone_rows: int, updates: int = 20) -> float:
    """Seconds an update with nothing new takes (the median of ``updates``), with
    ``gone_rows`` rows gone after row 0, which is still waiting (so nothing is folded)."""
    state = ProfileState()
    n = tasks * repeats
    for line in range(n):
        row = {"_ng_task_index": line // repeats, "_ng_rollout_index": line % repeats}
        state.add_input({**row, "agent_ref": {"name": "a"}}, 0, line)
    gone = [divmod(line, repeats) for line in range(1, 1 + min(gone_rows, n - 1))]
    fold = SequenceFold(False)
    fold.update(state, state, gone, rows_known=True)  # reads them: once
    took = []
    for _ in range(updates):
        began = time.perf_counter()
        fold.update(state, state, gone, rows_known=True)
        fold.ladders({"a": 0.0})
        took.append(time.perf_counter() - began)
    return float(np.median(took))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=25_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--every", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gone", type=int, default=100_000)
    args = ap.parse_args(argv)
    runs = [
        measure(args.tasks, args.repeats, args.in_flight, args.every, seed)
        for seed in range(args.runs)
    ]
    med = {
        key: float(np.median([r[key] for r in runs])) for key in ("fold_us", "floor_us", "ratio")
    }
    print(
        f"{runs[0]['rollouts']:,} rollouts, {args.in_flight} in flight, a summary every "
        f"{args.every}: dispatch-order fold {med['fold_us']:.3f} us per rollout, arrival-order "
        f"floor {med['floor_us']:.3f} us, ratio {med['ratio']:.2f} (median of {args.runs})"
    )
    short = [r for r in runs if r["folded"] != r["rollouts"]]
    for r in short:
        print(f"FINDING: the fold saw {r['folded']} of {r['rollouts']} rollouts", file=sys.stderr)
    batch = runs[0]["floor_us"] * min(args.every, runs[0]["rollouts"]) / 1e6  # s per batch
    gone = min(args.gone, args.tasks * args.repeats - 1)
    still = idle(args.tasks, args.repeats, gone)
    print(
        f"an update with nothing new, {gone:,} rows gone: {1e6 * still:.1f} us, "
        f"{still / batch:.2f} x the floor's cost per batch of {args.every}"
    )
    if still > batch:
        print("FINDING: a no-op update costs more than the floor's batch", file=sys.stderr)
    return 1 if short or still > batch else 0


if __name__ == "__main__":
    sys.exit(main())
