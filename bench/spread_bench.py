"""State spread over processors that share nothing but Kafka: snapshot time, and recovery after
a pod loss, as functions of the run's size.

    python -m bench.spread_bench [--tasks 25000 100000] [--repeats 8] [--runs 3]

For each size, a generated collection (``--tasks`` x ``--repeats``, one rollout per task held
back so the run stays open) is written to fresh topics with 4 partitions, and two
``rewardstream stream`` processes of one group, each with its own ``--state-dir``, consume it
(half the partitions each). Then:

1. once the commits of every partition name a checkpoint at the partition's end (the members
   write them when due: :mod:`rewardstream.processors.stream.changelog`),
   ``rewardstream snapshot`` (a separate process, as a user runs it) against the first member,
   end to end: the peer's parts fetched over HTTP, merged, built, rendered, files written;
2. the second member is killed (``kill -9``) with its state folder deleted, a third one starts
   on a fresh folder, and the bench times, from the kill: the replacement's partition
   assignment (mostly the group's session timeout: the dead member is only evicted then), and
   the moment the group again holds every rollout (the replacement held its half again from
   the checkpoints). The rebuild time is the difference, reported per million rollouts
   rebuilt, beside the floor: a bare consumer reading the same partitions' events, timed
   right after.

Without ``--bootstrap`` it starts its own broker from the Maven jars.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.generate import generate
from bench.measure import kafka_workspace
from bench.stream_bench import prefill
from rewardstream.contract.events import RunStarted, Topics, encode
from rewardstream.producers.events import WireEvent, input_events, rollout_events
from tests.processes import Processor, make_topics

PARTITIONS = 4


def member(bootstrap: str, prefix: str, work: Path, name: str) -> Processor:
    """``rewardstream stream`` as a child process with a state folder of its own."""
    extra = ["--state-dir", str(work / name / "state")]
    return Processor(bootstrap, prefix, work / name / "out", work / f"{name}.log", 5.0, extra)


def counts_of(p: Processor) -> tuple[int, int]:
    """The run's inputs and rollouts as this member knows them (its own and its peers')."""
    run = p.runs().get("run", {})
    inputs, rollouts = run.get("inputs", 0), run.get("rollouts", 0)
    return (inputs if isinstance(inputs, int) else 0, rollouts if isinstance(rollouts, int) else 0)


def wait(condition: Callable[[], object], what: str, timeout: float = 600.0) -> float:
    """Poll ``condition()`` every 50 ms; the time it became true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def named_at(bootstrap: str, group: str, topics: Topics) -> int:
    """The positions of the checkpoints the group's commits name, summed over the data
    partitions (0 for a partition whose commit names none)."""

    async def go() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        named = (
            (orjson.loads(m.metadata).get("checkpoint") or {}).get("position", 0)
            for tp, m in offsets.items()
            if tp.topic in (topics.inputs, topics.rollouts) and m.metadata
        )
        return sum(named)

    return asyncio.run(go())


async def bare_read(bootstrap: str, topics: Topics, units: list[str]) -> float:
    """Seconds a bare consumer takes to read ``units``' partitions from their start to their
    end, doing nothing with the records (the floor of a rebuild)."""
    by_kind = {"input": topics.inputs, "rollout": topics.rollouts}
    tps = [TopicPartition(by_kind[u.rpartition("-")[0]], int(u.rpartition("-")[2])) for u in units]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        began = time.monotonic()
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        left = set(tps)
        while left:
            await consumer.getmany(timeout_ms=200, max_records=10_000)
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
        return time.monotonic() - began
    finally:
        await consumer.stop()


def one_size(bootstrap: str, tasks: int, repeats: int, runs: int, work: Path) -> None:
    work.mkdir(parents=True)
    generate(tasks, repeats, work / "r", text_bytes=64, seed=0)
    inputs = list(input_events(work / "r_materialized_inputs.jsonl", "run"))
    rollouts = list(rollout_events(work / "r.jsonl", "run"))
    last = {e.key: i for i, e in enumerate(rollouts)}  # each task's last stays out: a partial run
    kept = [e for i, e in enumerate(rollouts) if last[e.key] != i]
    del rollouts, last
    started = RunStarted(run_id="run", expected_rollouts=len(inputs), output_stem="r")
    prefix = f"spread-{uuid.uuid4().hex[:8]}"
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(bootstrap, topics, PARTITIONS))
    control = WireEvent("control", b"run", encode(started))
    asyncio.run(prefill(bootstrap, topics, [*inputs, *kept, control]))
    n = len(kept)
    print(f"{tasks:,} tasks x {repeats}: {len(inputs):,} inputs + {n:,} rollouts in 4 partitions")
    a, b = member(bootstrap, prefix, work, "a"), member(bootstrap, prefix, work, "b")
    try:
        wait(lambda: len({*a.units(), *b.units()}) == 2 * PARTITIONS, "split")
        everything = (len(inputs), n)  # a rollout may be folded before its input: wait for both
        wait(lambda: counts_of(a) == everything, "both members folded their halves")
        group, ends = f"{prefix}-profiler", len(inputs) + n
        wait(lambda: named_at(bootstrap, group, topics) == ends, "checkpoints at the log ends")
        out = work / "snap"
        cli = [sys.executable, "-m", "rewardstream.commands.cli", "snapshot", "--run-id", "run"]
        cli += ["--url", a.url, "--out", str(out)]
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            done = subprocess.run(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if done.returncode:
                raise SystemExit(f"snapshot failed: {done.stderr.decode().strip()}")
            times.append(time.perf_counter() - t0)
        mib = sum(f.stat().st_size for f in out.iterdir()) / 2**20
        print(
            f"  snapshot over 2 processors ({mib:.0f} MiB): "
            + " / ".join(f"{t:.2f}" for t in times)
            + f" s, median {statistics.median(times):.2f} s"
        )
        killed = time.monotonic()
        b.kill(signal.SIGKILL)
        shutil.rmtree(work / "b", ignore_errors=True)  # the pod's disk goes with it
        c = member(bootstrap, prefix, work, "c")
        try:
            assigned = wait(lambda: len(c.units()) > 0, "the replacement's assignment")
            whole = wait(lambda: counts_of(c) == everything, "the group holding every event again")
            share = n * len(c.units()) / (2 * PARTITIONS)  # about its half
            rebuild = whole - assigned
            floor = asyncio.run(bare_read(bootstrap, topics, list(c.units())))
            said = (work / "c.log").read_text().splitlines()
            restored = [line.rpartition(" in ")[2] for line in said if "held again from" in line]
            print(f"  {len(restored)} of {len(c.units())} units restored: {', '.join(restored)}")
            print(
                f"  pod loss: replacement assigned {assigned - killed:.1f} s after the kill, "
                f"whole again {whole - killed:.1f} s after it; rebuild {rebuild:.1f} s for "
                f"~{share:,.0f} rollouts (+ as many inputs) = "
                f"{rebuild / share * 1e6:.1f} s per million rollouts; a bare consumer reads "
                f"those partitions in {floor:.1f} s: rebuild {rebuild / floor:.2f}x the floor"
            )
        finally:
            c.kill(signal.SIGTERM)
    finally:
        a.kill(signal.SIGTERM)
        b.kill(signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[25_000, 100_000])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap", default=None)
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        for tasks in a.tasks:
            one_size(bootstrap, tasks, a.repeats, a.runs, work / f"t{tasks}")


if __name__ == "__main__":
    main()
