"""Benchmark ``ng_reward_profile`` on a generated collection: wall time and peak memory, as a
ratio to the floor measured in the same run.

    python -m bench.profile_bench [--tasks 100000] [--repeats 8] [--runs 1] [--shape hidden]
        [--reader lean|reference|both]

Generates ``bench/data/bench_<tasks>x<repeats>[_hidden]*`` once (bench/generate.py), then runs
the real console script under ``/usr/bin/time -v``. Peak memory is reported twice: GNU time's
maximum RSS (largest single process) and the peak of the summed RSS of the whole process tree,
sampled every 50 ms, since the parser uses one worker process per core; and the largest process's
peak anonymous RSS, what it needs (:class:`bench.measure.Measured`). The floor, run right
after each run: one process ``orjson.loads`` every line of both files (reading them whole,
nothing kept), what any profiler that parses its input pays on one core. ``--reader`` sets
``REWARDSTREAM_READER`` (rewardstream/infra/readers.py); ``both`` alternates the two readers,
each run followed by its own floor.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.measure import Measured, measure

HERE = Path(__file__).resolve().parent


def run_once(inputs: Path, rollouts: Path, reader: str = "lean") -> Measured:
    exe = Path(sys.executable).parent / "ng_reward_profile"
    m = measure(
        [
            str(exe),
            f"+materialized_inputs_jsonl_fpath={inputs}",
            f"+rollouts_jsonl_fpath={rollouts}",
            "+quiet=true",
        ],
        env={"REWARDSTREAM_READER": reader},
    )
    if m.returncode:
        raise SystemExit(f"ng_reward_profile failed:\n{m.stderr}")
    return m


_FLOOR = """
import orjson, sys
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        for line in fh:
            orjson.loads(line)
"""


def floor(inputs: Path, rollouts: Path) -> Measured:
    m = measure([sys.executable, "-c", _FLOOR, str(inputs), str(rollouts)])
    if m.returncode:
        raise SystemExit(f"the floor failed:\n{m.stderr}")
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--shape", choices=("nemo", "hidden"), default="nemo")
    ap.add_argument("--reader", choices=("lean", "reference", "both"), default="lean")
    a = ap.parse_args()
    suffix = "" if a.shape == "nemo" else f"_{a.shape}"
    stem = HERE / "data" / f"bench_{a.tasks}x{a.repeats}{suffix}"
    rollouts = stem.with_name(stem.name + ".jsonl")
    inputs = stem.with_name(stem.name + "_materialized_inputs.jsonl")
    if not rollouts.exists():
        subprocess.run(
            [
                sys.executable,
                str(HERE / "generate.py"),
                "--tasks",
                str(a.tasks),
                "--repeats",
                str(a.repeats),
                "--out",
                str(stem),
                "--shape",
                a.shape,
            ],
            check=True,
        )
    size = (rollouts.stat().st_size + inputs.stat().st_size) / 1e9
    print(f"data: {a.tasks} tasks x {a.repeats} rollouts, {size:.2f} GB")
    readers = ("lean", "reference") if a.reader == "both" else (a.reader,)
    ratios: dict[str, list[float]] = {reader: [] for reader in readers}
    for i in range(a.runs):
        for reader in readers:
            r = run_once(inputs, rollouts, reader)
            f = floor(inputs, rollouts)
            ratios[reader].append(r.wall_s / f.wall_s)
            print(
                f"run {i + 1} ({reader} reader): wall {r.wall_s:.1f} s, cpu {r.cpu_s:.1f} s, "
                f"max RSS (time -v) {r.max_rss_mb:.0f} MB (anonymous {r.anon_peak_mb:.0f} MB), "
                f"process-tree peak RSS {r.tree_peak_mb:.0f} MB; floor {f.wall_s:.1f} s, "
                f"ratio {ratios[reader][-1]:.2f}"
            )
    for reader, found in ratios.items():
        print(f"median ratio to the floor ({reader}): {sorted(found)[len(found) // 2]:.2f}")


if __name__ == "__main__":
    main()
