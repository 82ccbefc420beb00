"""Benchmark ``ng_reward_profile`` on a generated collection: wall time and peak memory.

    python bench/profile_bench.py [--tasks 100000] [--repeats 8] [--runs 1]

Generates ``bench/data/bench_<tasks>x<repeats>*`` once (bench/generate.py), then runs the real
console script under ``/usr/bin/time -v``. Peak memory is reported twice: GNU time's maximum
RSS (largest single process) and the peak of the summed RSS of the whole process tree, sampled
every 50 ms, since the parser uses one worker process per core.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _tree_rss_kb(root: int) -> int:
    """Summed RSS of ``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        m = re.search(r"VmRSS:\s+(\d+)", status)
        rss[int(entry)] = int(m.group(1)) if m else 0
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_once(inputs: Path, rollouts: Path) -> dict[str, float]:
    exe = Path(sys.executable).parent / "ng_reward_profile"
    cmd = [
        "/usr/bin/time",
        "-v",
        str(exe),
        f"+materialized_inputs_jsonl_fpath={inputs}",
        f"+rollouts_jsonl_fpath={rollouts}",
        "+quiet=true",
    ]
    peak = 0
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"ng_reward_profile failed:\n{err}")
    max_rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))  # type: ignore[union-attr]
    return {"wall_s": wall, "time_max_rss_mb": max_rss / 1024, "tree_peak_rss_mb": peak / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    stem = HERE / "data" / f"bench_{a.tasks}x{a.repeats}"
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
            ],
            check=True,
        )
    size = (rollouts.stat().st_size + inputs.stat().st_size) / 1e9
    print(f"data: {a.tasks} tasks x {a.repeats} rollouts, {size:.2f} GB")
    for i in range(a.runs):
        r = run_once(inputs, rollouts)
        print(
            f"run {i + 1}: wall {r['wall_s']:.1f} s, "
            f"max RSS (time -v) {r['time_max_rss_mb']:.0f} MB, "
            f"process-tree peak RSS {r['tree_peak_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
