"""A real collection that stops early: ``ng_run``'s servers, ``ng_collect_rollouts``, a Kafka
broker and a stream processor, against the same collection run in full.

The bundled servers answer with the simulated policy, seeded per request
(``+num_repeats_add_seed=true``), so a row gets the same reward in both collections and their
decisions can be compared: the full collection and the early-stopped one (``+early_stop.band``,
decided by the processor and published on ``<prefix>.decisions``) are each profiled with
``ng_reward_profile`` (the early one with ``++allow_partial_rollouts=True``) and curated with
the band. The judge checks that the stop was honoured (rows skipped, each listed once, the
rest collected) and that the curated tasks are the same; ``--plant`` curates the early run with
a band the rule did not use, which the judge must report.

    .venv/bin/python -m bench.early_stop_real --tasks 500 --repeats 16 --band 0.1 0.9
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import Topics
from rewardstream.gym_servers.math_env import generate
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, ServerGroup, load_config
from rewardstream.kafka.local import free_port, provide_broker
from rewardstream.processors.stream import StreamProcessor
from rewardstream.sinks.curate import Criteria, curate

POLICY = "+policy_model.responses_api_models.simulated_model.simulated_policy"


def _keys(path: Path) -> list[tuple[int, int]]:
    rows = (orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip())
    return sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)


async def _collect(out: Path, args: argparse.Namespace, head: str, *extra: str) -> float:
    cmd = [sys.executable, "-m", "rewardstream.producers.gym.collect"]
    cmd += [f"+input_jsonl_fpath={out.parent.parent / 'problems.jsonl'}"]
    cmd += [f"+output_jsonl_fpath={out}", f"+head_server_url={head}"]
    cmd += [f"+num_repeats={args.repeats}", "+num_repeats_add_seed=true", "+quiet=true"]
    cmd += [f"+num_samples_in_parallel={args.parallel}", "+disable_aggregation=true", *extra]
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"collector failed:\n{err.decode()}")
    return time.perf_counter() - began


def _curated(folder: Path, band: tuple[float, float], *flags: str) -> bytes:
    argv = [f"+materialized_inputs_jsonl_fpath={folder / 'r_materialized_inputs.jsonl'}"]
    argv += [f"+rollouts_jsonl_fpath={folder / 'r.jsonl'}", "+quiet=true", *flags]
    if ng_reward_profile(argv) != 0:
        raise SystemExit(f"ng_reward_profile failed on {folder}")
    curate(folder / "r_reward_profiling.jsonl", folder / "curated.jsonl", Criteria(band, None))
    return (folder / "curated.jsonl").read_bytes()


def judge(full: Path, early: Path, curated: tuple[bytes, bytes]) -> list[str]:
    """What is wrong with the early run against the full one (empty: nothing)."""
    problems = []
    rows, collected = _keys(full / "r.jsonl"), _keys(early / "r.jsonl")
    skipped = _keys(early / "r_skipped.jsonl") if (early / "r_skipped.jsonl").exists() else []
    if not skipped:
        problems.append("the stop was not honoured: no row skipped")
    if sorted(collected + skipped) != rows:
        problems.append("collected and skipped rows are not the materialized rows, once each")
    if curated[0] != curated[1]:
        problems.append("the curated tasks differ from the full collection's")
    return problems


async def run(args: argparse.Namespace, work: Path, bootstrap: str) -> dict[str, Any]:
    problems = work / "problems.jsonl"
    problems.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in generate(args.tasks, 1)))
    prefix = f"stopbench-{os.getpid()}-{int(time.time())}"
    overrides = [f"+config_paths=[{BUNDLED_CONFIG}]", f"+head_server.port={free_port()}"]
    overrides += [f"{POLICY}.latency_s={args.latency}", f"{POLICY}.seconds_per_token=0"]
    band = (args.band[0], args.band[1])
    processor = StreamProcessor(bootstrap, work / "state", Topics.for_prefix(prefix))
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    try:
        with (work / "servers.log").open("wb") as log:
            async with ServerGroup(load_config(overrides), log) as servers:
                full_s = await _collect(work / "full" / "r.jsonl", args, servers.head_url)
                kafka = [f"+kafka_bootstrap_servers={bootstrap}", f"+kafka_topic_prefix={prefix}"]
                kafka += [f"+early_stop.band=[{band[0]},{band[1]}]"]
                early_s = await _collect(work / "early" / "r.jsonl", args, servers.head_url, *kafka)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    early_band = (band[0], (band[0] + band[1]) / 2) if args.plant else band
    curated = (
        _curated(work / "full", band),
        _curated(work / "early", early_band, "++allow_partial_rollouts=True"),
    )
    rows = len(_keys(work / "full" / "r.jsonl"))
    collected = len(_keys(work / "early" / "r.jsonl"))
    return {
        "tasks": args.tasks,
        "repeats": args.repeats,
        "band": list(band),
        "rows": rows,
        "collected": collected,
        "saved": 1 - collected / rows,
        "kept_tasks": curated[0].count(b"\n"),
        "full_s": round(full_s, 2),
        "early_s": round(early_s, 2),
        "problems": judge(work / "full", work / "early", curated),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--band", type=float, nargs=2, default=(0.1, 0.9))
    parser.add_argument("--latency", type=float, default=0.0, help="the policy's, seconds")
    parser.add_argument("--plant", action="store_true", help="curate the early run wrongly")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(provide_broker())
        result = asyncio.run(run(args, Path(work), bootstrap))
    print(orjson.dumps(result).decode())
    if result["problems"]:
        raise SystemExit("; ".join(result["problems"]))


if __name__ == "__main__":
    main()
