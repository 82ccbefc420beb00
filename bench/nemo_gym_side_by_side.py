"""Side-by-side benchmark: NeMo Gym's own ``gym eval profile`` vs our ``ng_reward_profile``.

    .venv/bin/python -m bench.nemo_gym_side_by_side \\
        --nemo-python NEMO_VENV/bin/python --data DATA/r10k [--runs 3]

``--data STEM`` names a collection made by ``bench/generate.py --out STEM``: ``STEM.jsonl``
(rollouts) and ``STEM_materialized_inputs.jsonl``. ``--nemo-python`` is the python (or the
``gym`` console script) of a separate environment with ``nemo-gym`` installed; NeMo Gym needs
Python 3.13, so it cannot share our 3.11 virtualenv.

Each run of each tool gets a fresh copy of the data folder (both tools write their outputs next
to the rollouts file, NeMo Gym also writes a Hydra ``outputs/`` folder into its working
directory), and runs under ``/usr/bin/time -v``. Runs alternate between the tools so that a
change in machine load hits both alike. Reported per run: wall seconds, GNU time's maximum RSS
(largest single process; our parser forks one worker per core), the peak summed RSS of the
whole process tree, sampled every 50 ms, and CPU seconds (user + system, children included).
The three profiler outputs

    STEM_reward_profiling.jsonl  STEM_agent_metrics.json  STEM_repeat_level_metrics.json

are hashed after every run and must be byte-identical across all runs of both tools; the script
exits 1 if they are not. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import measure

HERE = Path(__file__).resolve().parent
OURS_DEFAULT = HERE.parent / ".venv" / "bin" / "ng_reward_profile"
OUTPUT_SUFFIXES = ("_reward_profiling.jsonl", "_agent_metrics.json", "_repeat_level_metrics.json")
# What the ``gym`` console script does; used when the environment has no ``gym`` executable.
GYM_SHIM = "import sys; from nemo_gym.cli.main import main; sys.argv[0] = 'gym'; sys.exit(main())"


@dataclass
class Run:
    wall_s: float
    cpu_s: float  # user + system, all processes
    time_max_rss_mb: float
    tree_peak_rss_mb: float
    digests: dict[str, str]


@dataclass
class Tool:
    name: str
    argv: list[str]  # command prefix; inputs/rollouts arguments are appended per run
    style: str  # "nemo" (--inputs/--rollouts) or "ours" (Hydra-style +key=value)
    runs: list[Run] = field(default_factory=list)

    def command(self, inputs: Path, rollouts: Path) -> list[str]:
        if self.style == "nemo":
            nemo = ["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts)]
            return [*self.argv, *nemo]
        return [
            *self.argv,
            f"+materialized_inputs_jsonl_fpath={inputs}",
            f"+rollouts_jsonl_fpath={rollouts}",
            "+quiet=true",
        ]


def nemo_argv(path: Path) -> list[str]:
    """Command prefix for NeMo Gym's CLI, given its environment's python or ``gym`` script."""
    if not path.name.startswith("python"):
        return [str(path)]
    gym = path.parent / "gym"
    return [str(gym)] if gym.exists() else [str(path), "-c", GYM_SHIM]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def run_once(tool: Tool, inputs: Path, rollouts: Path, workdir: Path) -> Run:
    """Copy the data into ``workdir``, run ``tool`` there under GNU time, hash its outputs."""
    workdir.mkdir(parents=True)
    my_inputs = workdir / inputs.name
    my_rollouts = workdir / rollouts.name
    shutil.copyfile(inputs, my_inputs)
    shutil.copyfile(rollouts, my_rollouts)
    cmd = tool.command(my_inputs, my_rollouts)
    with (workdir / "stdout.txt").open("wb") as out:
        m = measure(cmd, cwd=workdir, stdout=out)
    (workdir / "stderr.txt").write_text(m.stderr)
    if m.returncode:
        raise SystemExit(
            f"{tool.name} failed (exit {m.returncode}): {' '.join(cmd)}\n{m.stderr[-4000:]}"
        )
    if not m.max_rss_mb:
        raise SystemExit(f"no GNU time report in {tool.name}'s stderr:\n{m.stderr[-4000:]}")
    stem = rollouts.name.removesuffix(".jsonl")
    digests: dict[str, str] = {}
    for suffix in OUTPUT_SUFFIXES:
        out_path = workdir / f"{stem}{suffix}"
        if not out_path.exists():
            raise SystemExit(f"{tool.name} wrote no {out_path.name} in {workdir}")
        digests[out_path.name] = sha256(out_path)
    return Run(m.wall_s, m.cpu_s, m.max_rss_mb, m.tree_peak_mb, digests)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nemo-python", type=Path, required=True, help="side env's python or gym")
    ap.add_argument("--data", type=Path, required=True, help="collection stem (generate.py --out)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each tool (default 3)")
    ap.add_argument("--ours", type=Path, default=OURS_DEFAULT, help="our ng_reward_profile")
    ap.add_argument("--workdir", type=Path, default=None, help="where run copies go (tmp dir)")
    ap.add_argument("--keep", action="store_true", help="keep each run's folder")
    args = ap.parse_args(argv)

    rollouts = args.data.with_name(args.data.name + ".jsonl")
    inputs = args.data.with_name(args.data.name + "_materialized_inputs.jsonl")
    for p in (rollouts, inputs, args.nemo_python, args.ours):
        if not p.exists():
            raise SystemExit(f"not found: {p}")

    tools = [
        Tool("nemo-gym", nemo_argv(args.nemo_python), "nemo"),
        Tool("ours", [str(args.ours)], "ours"),
    ]
    base = Path(tempfile.mkdtemp(prefix="side_by_side_", dir=args.workdir))
    print(f"data: {rollouts} ({rollouts.stat().st_size / 1e6:.1f} MB), {inputs.name}")
    for tool in tools:
        print(f"{tool.name}: {' '.join(tool.command(Path('<M>'), Path('<R>')))}")
    print(f"run folders under {base}")
    print(f"load average before: {loadavg()}", flush=True)
    try:
        for i in range(args.runs):
            for tool in tools:
                workdir = base / f"{tool.name}_{i}"
                run = run_once(tool, inputs, rollouts, workdir)
                tool.runs.append(run)
                print(
                    f"  run {i + 1} {tool.name:8s} wall {run.wall_s:7.2f} s  "
                    f"cpu {run.cpu_s:7.2f} s  "
                    f"max RSS {run.time_max_rss_mb:7.1f} MB  "
                    f"tree peak {run.tree_peak_rss_mb:7.1f} MB"
                    f"  (load {loadavg()})",
                    flush=True,
                )
                if not args.keep:
                    shutil.rmtree(workdir)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"load average after: {loadavg()}")

    print()
    header = f"{'tool':10s} {'wall median':>12s} {'wall min':>9s} {'wall max':>9s}"
    header += f" {'cpu median':>11s} {'max RSS MB':>11s} {'tree peak MB':>13s}"
    print(header)
    medians: dict[str, float] = {}
    for tool in tools:
        walls = [r.wall_s for r in tool.runs]
        medians[tool.name] = statistics.median(walls)
        print(
            f"{tool.name:10s} {medians[tool.name]:11.2f}s {min(walls):8.2f}s {max(walls):8.2f}s"
            f" {statistics.median(r.cpu_s for r in tool.runs):10.2f}s"
            f" {max(r.time_max_rss_mb for r in tool.runs):11.1f}"
            f" {max(r.tree_peak_rss_mb for r in tool.runs):13.1f}"
        )
    ratio = medians["nemo-gym"] / medians["ours"]
    print(f"\nspeed ratio (nemo-gym median wall / ours): {ratio:.2f}x")

    reference = tools[0].runs[0].digests
    identical = all(r.digests == reference for t in tools for r in t.runs)
    for name, digest in reference.items():
        print(f"  {name}: {digest[:16]}")
    if not identical:
        for tool in tools:
            for i, r in enumerate(tool.runs, 1):
                diff = sorted(k for k in reference if r.digests[k] != reference[k])
                if diff:
                    print(f"  DIFFERS: {tool.name} run {i}: {', '.join(diff)}")
        print("outputs: NOT byte-identical")
        return 1
    print("outputs: byte-identical across all runs of both tools")
    return 0


if __name__ == "__main__":
    sys.exit(main())
