"""Snapshot latency and memory held per rollout, at the issue's scale (100,000 tasks x 8).

    python -m bench.snapshot_bench [--tasks 100000] [--repeats 8] [--runs 3] [--aggregates]
                                   [--stages]

Feeds a generated collection through the processor's :class:`Pipeline` in process (the
snapshot is processor-side work; Kafka adds nothing to it), then times the snapshot built in
process, and ``rewardstream snapshot`` (a separate process, as a user runs it) against the real
HTTP endpoint, end to end (state copy, profile build, ``sample`` read-back, rendering, response,
files written), while the run is incomplete (one rollout per task is held back, so it is a
partial profile), and what ``rewardstream compare`` does with it for the task flips (its task
rows read, the flips counted: run against itself). Memory held per rollout is the RSS growth while
ingesting, divided by the rollouts ingested (inputs included: the state needs them too).
With ``--aggregates`` the run asks for the aggregate and difficulty files (pass@k, avg-of-k
and majority@k over ``extracted_answer``), which the snapshot then carries too.
With ``--stages`` the snapshot's work is also timed stage by stage in this process, serially
(no fork, no helper): the profile build, the task rows rendered with their samples and framed,
and the agent metrics, each as CPU seconds (what a loaded machine does not inflate as it does
wall time) and, for the rows, CPU per row: where the time of a snapshot goes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.generate import generate
from bench.measure import tree_rss_kb
from rewardstream.commands.live_compare import task_rows
from rewardstream.contract.events import RunStarted, encode
from rewardstream.kafka.local import free_port
from rewardstream.processors.core.compare import task_flips
from rewardstream.processors.core.profile import build_profile
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app, serve
from rewardstream.processors.http.snapshot import SnapshotJob, SnapshotLimits, _task_frames
from rewardstream.producers.events import input_events, rollout_events
from rewardstream.sinks.snapshot_wire import receive


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--aggregates", action="store_true", help="with pass@k and difficulty")
    ap.add_argument("--stages", action="store_true", help="also time each stage, serially")
    a = ap.parse_args(argv)
    answer_key = "extracted_answer" if a.aggregates else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate(a.tasks, a.repeats, work / "r", text_bytes=64, seed=0)
        # Events are streamed from the files, never held: a list of 1.5M event objects would
        # make every garbage collection in the snapshot walk them (it did: ~2 s of the old number).
        rollouts = functools.partial(rollout_events, work / "r.jsonl", "run", answer_key)
        last = {e.key: i for i, e in enumerate(rollouts())}
        held_back = set(last.values())  # the last rollout of each task stays out: a partial run
        with Pipeline(work / "out") as pipeline:
            gc.collect()
            before = tree_rss_kb(os.getpid()) * 1024
            t0 = time.perf_counter()
            inputs = 0
            for e in input_events(work / "r_materialized_inputs.jsonl", "run"):
                pipeline.handle(e.kind, e.value)
                inputs += 1
            started = RunStarted(
                run_id="run",
                expected_rollouts=inputs,
                output_stem="r",
                aggregate_metrics=a.aggregates,
                answer_key=answer_key,
            )
            pipeline.handle("control", encode(started))
            kept = 0
            for i, e in enumerate(rollouts()):
                if i not in held_back:
                    pipeline.handle(e.kind, e.value)
                    kept += 1
            del last, held_back
            ingest = time.perf_counter() - t0
            gc.collect()
            held = tree_rss_kb(os.getpid()) * 1024 - before
            print(
                f"ingested {inputs:,} inputs + {kept:,} rollouts in {ingest:.1f} s; "
                f"RSS growth {held / 2**20:,.0f} MiB = {held / kept:,.0f} B per rollout"
            )
            for _ in range(a.runs if a.stages else 0):
                _stages(pipeline)
            for _ in range(a.runs):
                t0 = time.perf_counter()
                job = SnapshotJob(pipeline, "run")
                with open(job.fd, "rb") as fh:
                    receive(fh, work / "snap-in-process", "bench")
                assert job.wait() == 0
                print(
                    f"snapshot in process (fork, build, files written): "
                    f"{time.perf_counter() - t0:.2f} s"
                )
            asyncio.run(_snapshots(pipeline, a.runs, kept, work / "snap"))


def _stages(pipeline: Pipeline) -> None:
    """One snapshot's work in this process, serially, as CPU seconds per stage."""
    source = pipeline.snapshot_source("run", {}, {})
    t0 = time.process_time()
    profile = build_profile(source.merged.state, allow_partial=True)
    t1 = time.process_time()
    rows = profile.task_rows
    size = sum(map(len, _task_frames(rows, source.merged.sample)))
    t2 = time.process_time()
    agents = len(profile.agent_metrics) + len(profile.repeat_metrics)
    t3 = time.process_time()
    print(
        f"stages (CPU, serial): build {t1 - t0:.2f} s, {len(rows):,} task rows "
        f"({size / 2**20:.0f} MiB) {t2 - t1:.2f} s = {(t2 - t1) / max(len(rows), 1) * 1e6:.1f} "
        f"us a row, {agents} agent metric rows {t3 - t2:.2f} s"
    )


async def _snapshots(pipeline: Pipeline, runs: int, rollouts: int, out: Path) -> None:
    port = free_port()
    # the limit a server is started with (10 s) ends a build of this size on a loaded machine
    # (it did, 14 s in process at load 10): a bench times the build, it does not bound it
    limits = SnapshotLimits(timeout=600.0)
    runner, _ = await serve(make_app(pipeline, None, limits=limits), "127.0.0.1", port)
    cli = [sys.executable, "-m", "rewardstream.commands.cli", "snapshot", "--run-id", "run"]
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
        t0 = time.perf_counter()
        rows = task_rows(out)
        flips = [task_flips(tasks, tasks) for tasks in rows.values()]
        tasks = sum(f.common_task_count for f in flips)
        print(f"compare's flips of {tasks:,} tasks: {time.perf_counter() - t0:.2f} s")
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    main()
