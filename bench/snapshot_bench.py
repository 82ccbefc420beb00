"""Snapshot latency and memory held per rollout, at the issue's scale (100,000 tasks x 8).

    python -m bench.snapshot_bench [--tasks 100000] [--repeats 8] [--runs 3]

Feeds a generated collection through the processor's :class:`Pipeline` in process (the
snapshot is processor-side work; Kafka adds nothing to it), then times the snapshot built in
process, and ``rewardstream snapshot`` (a separate process, as a user runs it) against the real
HTTP endpoint, end to end (state copy, profile build, ``sample`` read-back, rendering, response,
files written), while the run is incomplete (one rollout per task is held back, so it is a
partial profile). Memory held per rollout is the RSS growth while
ingesting, divided by the rollouts ingested (inputs included: the state needs them too).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.generate import generate
from bench.measure import tree_rss_kb
from processors.http import make_app, serve
from processors.pipeline import Pipeline
from producers.events import input_events, rollout_events
from rewardstream.contract import RunStarted, encode
from rewardstream.kafka_local import free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate(a.tasks, a.repeats, work / "r", text_bytes=64, seed=0)
        inputs = list(input_events(work / "r_materialized_inputs.jsonl", "run"))
        rollouts = [e for e in rollout_events(work / "r.jsonl", "run")]
        held_back = {e.key for e in rollouts}  # one rollout per task stays out: a partial run
        kept = []
        for e in reversed(rollouts):
            if e.key in held_back:
                held_back.discard(e.key)
            else:
                kept.append(e)
        with Pipeline(work / "out") as pipeline:
            gc.collect()
            before = tree_rss_kb(os.getpid()) * 1024
            t0 = time.perf_counter()
            for e in inputs:
                pipeline.handle(e.kind, e.value)
            started = RunStarted(run_id="run", expected_rollouts=len(inputs), output_stem="r")
            pipeline.handle("control", encode(started))
            for e in kept:
                pipeline.handle(e.kind, e.value)
            ingest = time.perf_counter() - t0
            gc.collect()
            held = tree_rss_kb(os.getpid()) * 1024 - before
            print(
                f"ingested {len(inputs):,} inputs + {len(kept):,} rollouts in {ingest:.1f} s; "
                f"RSS growth {held / 2**20:,.0f} MiB = {held / len(kept):,.0f} B per rollout"
            )
            for _ in range(a.runs):
                t0 = time.perf_counter()
                pipeline.snapshot_job("run")()
                print(f"snapshot built in process (no HTTP): {time.perf_counter() - t0:.2f} s")
            asyncio.run(_snapshots(pipeline, a.runs, len(kept), work / "snap"))


async def _snapshots(pipeline: Pipeline, runs: int, rollouts: int, out: Path) -> None:
    port = free_port()
    runner = await serve(make_app(pipeline, None), "127.0.0.1", port)
    cli = [sys.executable, "-m", "rewardstream.cli", "snapshot", "--run-id", "run"]
    cli += ["--url", f"http://127.0.0.1:{port}", "--out", str(out)]
    try:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            child = await asyncio.create_subprocess_exec(*cli, stdout=asyncio.subprocess.DEVNULL)
            assert await child.wait() == 0
            times.append(time.perf_counter() - t0)
            size = sum(f.stat().st_size for f in out.iterdir())
            mib = size / 2**20
            print(f"rewardstream snapshot of {rollouts:,}: {times[-1]:.2f} s, {mib:.0f} MiB")
        print(f"median {statistics.median(times):.2f} s over {runs} runs")
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    main()
