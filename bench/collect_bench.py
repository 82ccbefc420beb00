"""Collector throughput, end to end: ``ng_collect_rollouts`` against the bundled servers.

The servers run as ``ng_run`` would start them (the simulated policy with its latency set to 0,
so what is measured is the overhead of collection itself: the collector, the agent's three
calls, the model and resources servers). The collector runs as its own process under
``/usr/bin/time``; throughput is completed rollouts / the command's wall time (interpreter
start-up and materialization included). CPU seconds of every process are reported too.

    .venv/bin/python -m bench.collect_bench --tasks 4000 --repeats 5 --parallel 64 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import orjson

from bench.measure import measure
from rewardstream.gym_servers.math_env import generate
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, ServerGroup, load_config
from rewardstream.kafka.local import free_port

POLICY = "+policy_model.responses_api_models.simulated_model.simulated_policy"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


async def _bench(args: argparse.Namespace, work: Path) -> list[float]:
    problems = work / "problems.jsonl"
    problems.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in generate(args.tasks, 1)))
    overrides = [f"+config_paths=[{BUNDLED_CONFIG}]", f"+head_server.port={free_port()}"]
    overrides += [f"{POLICY}.latency_s=0", f"{POLICY}.seconds_per_token=0"]
    rates = []
    with (work / "servers.log").open("wb") as log:
        async with ServerGroup(load_config(overrides), log) as servers:
            for run in range(args.runs):
                out = work / f"run{run}" / "rollouts.jsonl"
                cmd = [sys.executable, "-m", "rewardstream.producers.gym.collect"]
                cmd += [f"+input_jsonl_fpath={problems}", f"+output_jsonl_fpath={out}"]
                cmd += [f"+num_repeats={args.repeats}", "+num_repeats_add_seed=true"]
                cmd += [f"+num_samples_in_parallel={args.parallel}", "+quiet=true"]
                cmd += [f"+head_server_url={servers.head_url}"]
                cmd += ["+disable_aggregation=true"] if args.no_aggregation else []
                load = os.getloadavg()[0]
                before = {n: _cpu_seconds(p.pid) for n, p in servers.procs.items()}
                m = await asyncio.to_thread(measure, cmd)
                if m.returncode != 0:
                    raise SystemExit(f"collector failed:\n{m.stderr}")
                done = out.read_bytes().count(b"\n")
                cpu = {n: _cpu_seconds(p.pid) - before[n] for n, p in servers.procs.items()}
                rates.append(done / m.wall_s)
                servers_cpu = ", ".join(f"{n} {s:.1f}s" for n, s in cpu.items())
                print(
                    f"run {run + 1}: {done} rollouts in {m.wall_s:.2f}s = {done / m.wall_s:,.0f}/s;"
                    f" CPU: collector {m.cpu_s:.1f}s, {servers_cpu}; RSS {m.max_rss_mb:.0f} MB;"
                    f" load before {load:.2f}",
                    flush=True,
                )
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--no-aggregation", action="store_true", help="+disable_aggregation=true (no metrics file)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rates = asyncio.run(_bench(args, Path(work)))
    print(f"median {statistics.median(rates):,.0f} rollouts/s over {len(rates)} runs")


if __name__ == "__main__":
    main()
