"""``ng_aggregate_rollouts`` on a generated collection split into shards, against its floor
and 0.7.0's own metrics computation.

    .venv/bin/python -m bench.aggregate_bench --data bench/data/r10k [--shards 4] [--runs 3] \\
        [--nemo-python .nemo-gym/venv/bin/python]

``--data STEM`` is a collection made by ``bench/generate.py --out STEM`` (made here when
missing, 10,000 tasks x 8). Its rollouts are dealt into ``--shards`` shards. Reported per run,
under GNU time: our ``ng_aggregate_rollouts`` (merged rollouts and ``_aggregate_metrics.json``,
no servers), and the floor measured in the same run: one process reading every shard line
with ``orjson.loads``. With ``--nemo-python`` (a nemo-gym 0.7.0 environment), also 0.7.0's
``compute_aggregate_metrics`` on the same rows, timed inside its process after loading (the
work 0.7.0's servers do per ``ng_aggregate_rollouts``; its client adds the reading and the
POST), and its metrics checked equal to ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from bench.measure import measure

HERE = Path(__file__).resolve().parent
OURS = HERE.parent / ".venv" / "bin" / "ng_aggregate_rollouts"
_FLOOR = "import orjson,sys\nfor p in sys.argv[1:]:\n    [orjson.loads(x) for x in open(p,'rb')]"
_NEMO = """
import json, sys, time, orjson
from nemo_gym.reward_profile import compute_aggregate_metrics
BULK = ("response", "responses_create_params", "ng_agent_observations")
def entry(r):  # what 0.7.0's collector sends /aggregate_metrics of a row
    out = {k: v for k, v in r.items() if k not in BULK}
    resp = r.get("response") or {}
    extra = {k: resp[k] for k in ("usage", "incomplete_details") if resp.get(k) is not None}
    return out | ({"response": extra} if extra else {})
rows = [orjson.loads(x) for p in sys.argv[1:] for x in open(p, "rb")]
rows.sort(key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
groups = {}
for r in rows:
    groups.setdefault(r["agent_ref"]["name"], []).append(entry(r))
began = time.perf_counter()
out = {a: compute_aggregate_metrics(g).model_dump(mode="json")["agent_metrics"]
       for a, g in groups.items()}
print(json.dumps({"seconds": time.perf_counter() - began, "agents": out}))
"""


def _shards(stem: Path, count: int, folder: Path) -> list[Path]:
    lines = Path(f"{stem}.jsonl").read_bytes().splitlines(True)
    paths = [folder / f"s{i}.jsonl" for i in range(count)]
    for i, path in enumerate(paths):
        path.write_bytes(b"".join(lines[i::count]))
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "data" / "r10k")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nemo-python", type=Path)
    args = ap.parse_args()
    if not Path(f"{args.data}.jsonl").exists():
        cmd = [sys.executable, str(HERE / "generate.py"), "--tasks", "10000", "--repeats", "8"]
        subprocess.run([*cmd, "--out", str(args.data)], check=True)
    with tempfile.TemporaryDirectory(prefix="aggregate-bench-") as tmp:
        folder = Path(tmp)
        shards = _shards(args.data, args.shards, folder)
        size = sum(p.stat().st_size for p in shards) / 1e6
        print(f"{len(shards)} shards, {size:.0f} MB")
        ours, floor = [], []
        for run in range(args.runs):
            out = folder / f"out{run}" / "r.jsonl"
            done = measure(
                [str(OURS), f"+input_glob={folder}/s*.jsonl", f"+output_jsonl_fpath={out}"]
            )
            assert done.returncode == 0, done.stderr
            base = measure([sys.executable, "-c", _FLOOR, *map(str, shards)])
            ours.append(done)
            floor.append(base)
            print(
                f"run {run}: ours {done.wall_s:.2f} s ({done.max_rss_mb:.0f} MB), "
                f"floor {base.wall_s:.2f} s, ratio {done.wall_s / base.wall_s:.2f}"
            )
        ratios = [o.wall_s / f.wall_s for o, f in zip(ours, floor, strict=True)]
        print(
            f"median: ours {statistics.median(m.wall_s for m in ours):.2f} s, floor "
            f"{statistics.median(m.wall_s for m in floor):.2f} s, ratio "
            f"{statistics.median(ratios):.2f}"
        )
        if args.nemo_python:
            proc = subprocess.run(
                [str(args.nemo_python), "-c", _NEMO, *map(str, shards)],
                capture_output=True,
                text=True,
                check=True,
            )
            theirs = json.loads(proc.stdout.splitlines()[-1])
            mine = orjson.loads((folder / "out0" / "r_aggregate_metrics.json").read_bytes())
            same = {e["agent_ref"]["name"]: e["agent_metrics"] for e in mine} == theirs["agents"]
            print(
                f"0.7.0 compute_aggregate_metrics: {theirs['seconds']:.2f} s "
                f"(agent metrics equal to ours: {same})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
