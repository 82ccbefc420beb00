"""Recovery from checkpoints, as the processor writes and restores them
(:mod:`rewardstream.processors.stream.changelog`): what restoring a unit's state in bulk costs
against replaying its events, per million rollouts, as a function of the run's size.

    python -m bench.checkpoint_bench [--tasks 25000 100000] [--repeats 8] [--runs 3]
                                     [--bootstrap HOST:PORT]
    python -m bench.checkpoint_bench --self-test

For each size, a generated collection (``--tasks`` x ``--repeats``, each task's last rollout
held back so the run stays open) is written to fresh topics of one partition (one input unit,
one rollout unit). Then, in one process, alternating, ``--runs`` times:

1. **floor**: a bare ``AIOKafkaConsumer`` reading both topics and doing nothing with them;
2. **replay**: what a new owner does without a checkpoint: the same reads, each batch applied
   in slices of 2,000 (:meth:`Pipeline.apply`), inputs first (the best case for replay);
3. **checkpoint**: each replayed unit written by the processor's :class:`Changelog` to a
   compacted topic (encoded, produced in chunks, acknowledged), then **restored** by a new
   :class:`Changelog` into a new pipeline, as a new owner restores the checkpoint its commit
   names (read, CRC-checked, decoded, held again: :meth:`Pipeline.restore`).

Each restore is judged: the restored units must have the replayed position, export the same
columns, carry the same digests, counts, held rollouts and keys, and keep no more
``rollout_infos`` entries in memory than the replayed ones (the rest belong in their spills:
a view of the checkpoint kept would keep all of it). ``--self-test`` plants
faults in what the writer sends (a chunk under another key, a flipped byte: both must be
refused; another group's records among the chunks: skipped, the restore exact) and a
restored part keeping a view of its checkpoint in memory (found), and fails unless each is
caught.

Without ``--bootstrap`` it starts its own broker from the Maven jars.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.generate import generate
from bench.measure import kafka_workspace
from bench.stream_bench import prefill
from rewardstream.contract.events import EventKind, RunStarted, Topics, encode
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.engine.checkpoints import encode_unit
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Part, key_columns
from rewardstream.processors.stream.changelog import Changelog
from rewardstream.producers.events import input_events, rollout_events
from tests.processes import make_topics

SLICE = 2_000


class Timed(NamedTuple):
    """Seconds of wall clock and of this process's CPU."""

    wall: float
    cpu: float


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
    )


async def read_all(bootstrap: str, topics: Topics, pipeline: Pipeline | None) -> Timed:
    """Both data topics from their start, inputs first, each batch applied to ``pipeline`` in
    slices of 2,000 (None: read only, the floor)."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    wall, cpu = time.monotonic(), time.process_time()
    try:
        kinds: tuple[tuple[EventKind, str], ...] = (
            ("input", topics.inputs),
            ("rollout", topics.rollouts),
        )
        for kind, topic in kinds:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            unit, at = f"{kind}-0", 0
            while at < end:
                records = (await consumer.getmany(timeout_ms=200, max_records=10_000)).get(tp, [])
                if pipeline is not None:  # None: read only, the floor
                    for lo in range(0, len(records), SLICE):
                        chunk = records[lo : lo + SLICE]
                        raws = [r.value for r in chunk]
                        pipeline.apply(kind, raws, unit, [r.offset for r in chunk])
                if records:
                    at = records[-1].offset + 1
        return Timed(time.monotonic() - wall, time.process_time() - cpu)
    finally:
        await consumer.stop()


async def make_changelog(bootstrap: str, topic: str) -> None:
    """A checkpoints topic as the processor's (compacted, one partition)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"cleanup.policy": "compact"}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
    finally:
        await admin.close()


class _Planting:
    """The processor's producer with a fault planted in what it sends of a checkpoint (the
    self-test's): ``missing`` sends chunk 1 under another checkpoint's key, ``corrupt`` flips a
    byte of chunk 1, ``foreign`` sends another group's record before each chunk (a topic
    shared with other groups: those must be skipped, not read as chunks)."""

    def __init__(self, producer: AIOKafkaProducer, plant: str) -> None:
        self.producer, self.plant = producer, plant

    async def send(self, topic: str, value: bytes | None, key: bytes) -> Any:
        if self.plant == "foreign":
            await self.producer.send(topic, b"not ours", key=b"other-group/" + key)
        elif key.endswith(b"/1") and self.plant == "missing":
            key = key[: key.rindex(b"/", 0, key.rindex(b"/"))] + b"/0000000000000000/1"
        elif key.endswith(b"/1") and value and self.plant == "corrupt":
            value = value[:100] + bytes([value[100] ^ 0x40]) + value[101:]
        return await self.producer.send(topic, value, key=key)


def _export(part: Part) -> bytes:
    _, sections = part.state.export_columns(part.taken_infos())
    return b"".join(bytes(s) for s in sections)


def _counts(part: Part) -> tuple[int, int, int, int, int, int]:
    return (
        *(part.inputs, part.rollouts, part.duplicates, part.conflicts, part.foreign),
        part.first_offset,
    )


def in_memory(pipeline: Pipeline) -> int:
    """Bytes of ``rollout_infos`` entries its parts hold in memory (the rest are in spills)."""
    return sum(
        sum(map(len, part.state.info_segments()))
        for unit in pipeline.units.values()
        for part in unit.parts.values()
    )


def judge(replayed: Pipeline, restored: Pipeline) -> list[str]:
    """How the restored units differ from the replayed ones (empty: none), in memory too: a
    restored unit keeps no more ``rollout_infos`` entries there than a replayed one."""
    findings = []
    if (kept := in_memory(restored)) > in_memory(replayed):
        findings.append(f"restored units keep {kept:,} B of rollout infos in memory")
    for name, unit in replayed.units.items():
        again = restored.units.get(name)
        if again is None or again.position != unit.position:
            findings.append(f"{name}: not restored to position {unit.position}")
            continue
        for run, part in unit.parts.items():
            other = again.parts.get(run)
            if other is None:
                findings.append(f"{name}/{run}: not restored")
                continue
            if _export(other) != _export(part):
                findings.append(f"{name}/{run}: restored columns differ")
            if other.contents.digests != part.contents.digests:
                findings.append(f"{name}/{run}: digests differ")
            if _counts(other) != _counts(part) or other.unmatched != part.unmatched:
                findings.append(f"{name}/{run}: counts {_counts(other)}, replayed {_counts(part)}")
            if other.keys.missing(*key_columns(part.state)):
                findings.append(f"{name}/{run}: keys missing from the restored key set")
    return findings


class Round(NamedTuple):
    """Every unit checkpointed and restored once: the times, the bytes, the refusals (the
    processor's warnings) and the findings."""

    written: Timed
    restored: Timed
    size: int
    kept: tuple[int, int]  # rollout infos in memory: restored units', replayed units' (bytes)
    refused: list[str]
    findings: list[str]


async def checkpoint_round(
    bootstrap: str, pipeline: Pipeline, started: RunStarted, work: Path, plant: str = ""
) -> Round:
    """Write every unit's checkpoint with the processor's :class:`Changelog` (encode, produce,
    acknowledged), then restore each into a new pipeline as a new owner does (read, check,
    decode, hold again), and judge it against ``pipeline``. ``plant``: a fault
    (:class:`_Planting`, or ``view``: a restored part given a view as large as what the
    replayed ones hold in memory)."""
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    await make_changelog(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    security = KafkaSecurity()
    try:
        writer = Changelog(pipeline, topic, "bench", bootstrap, security)
        writer.producer = _Planting(producer, plant) if plant else producer
        wall, cpu = time.monotonic(), time.process_time()
        named = {name: await writer.write(name) for name in sorted(pipeline.units)}
        written = Timed(time.monotonic() - wall, time.process_time() - cpu)
    finally:
        await producer.stop()
    refused: list[str] = []
    handler = _Lines(refused)
    logging.getLogger("rewardstream.processors.stream").addHandler(handler)
    try:
        with Pipeline(work / f"restored-{uuid.uuid4().hex[:8]}") as again:
            again.handle("control", encode(started))
            reader = Changelog(again, topic, "bench", bootstrap, security)
            wall, cpu = time.monotonic(), time.process_time()
            for name, one in named.items():
                again.unit(name)  # assigned: new, to be placed
                if one is not None:
                    await reader.restore(name, one, lambda: True)
            restored = Timed(time.monotonic() - wall, time.process_time() - cpu)
            if plant == "view":  # a part that kept a view of its checkpoint
                part = next(p for u in again.units.values() for p in u.parts.values())
                part.state.info_held.append(memoryview(bytes(in_memory(pipeline) + 1)))
            findings = judge(pipeline, again)
            kept = in_memory(again), in_memory(pipeline)
    finally:
        logging.getLogger("rewardstream.processors.stream").removeHandler(handler)
    size = sum(
        memoryview(b).nbytes for u in pipeline.units.values() for b in encode_unit(u, {}) or []
    )
    return Round(written, restored, size, kept, refused, findings)


class _Lines(logging.Handler):
    """Collects the warnings a restore logs (a refused checkpoint)."""

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _range(values: list[float], per: float) -> str:
    scaled = [v * per for v in values]
    return f"{min(scaled):.2f}-{max(scaled):.2f} (median {statistics.median(scaled):.2f})"


def one_size(bootstrap: str, tasks: int, repeats: int, runs: int, work: Path) -> list[str]:
    """Measure one size; the findings of its judge."""
    work.mkdir(parents=True)
    generate(tasks, repeats, work / "r", text_bytes=64, seed=0)
    inputs = list(input_events(work / "r_materialized_inputs.jsonl", "run"))
    rollouts = list(rollout_events(work / "r.jsonl", "run"))
    last = {e.key: i for i, e in enumerate(rollouts)}
    kept = [e for i, e in enumerate(rollouts) if last[e.key] != i]
    del rollouts, last
    started = RunStarted(run_id="run", expected_rollouts=len(inputs), output_stem="r")
    topics = Topics.for_prefix(f"ckpt-{uuid.uuid4().hex[:8]}")
    asyncio.run(make_topics(bootstrap, topics, 1))
    asyncio.run(prefill(bootstrap, topics, [*inputs, *kept]))
    n = len(kept)
    print(f"{tasks:,} tasks x {repeats}: {len(inputs):,} inputs + {n:,} rollouts, one unit each")
    del inputs, kept
    floors, replays, rounds, findings = [], [], [], []
    for run in range(runs):
        floors.append(asyncio.run(read_all(bootstrap, topics, None)))
        with Pipeline(work / f"state{run}") as pipeline:
            pipeline.handle("control", encode(started))
            replays.append(asyncio.run(read_all(bootstrap, topics, pipeline)))
            rounds.append(asyncio.run(checkpoint_round(bootstrap, pipeline, started, work)))
        findings += rounds[-1].refused + rounds[-1].findings
    per = 1e6 / n
    print(f"  per million rollouts (+ as many inputs), {runs} runs, wall s (CPU s):")
    for what, timed in (
        ("floor: bare consumer", floors),
        ("replay (rebuild without one)", replays),
        ("restore: read, check, hold again", [r.restored for r in rounds]),
        ("checkpoint: encode + produce", [r.written for r in rounds]),
    ):
        walls, cpus = [t.wall for t in timed], [t.cpu for t in timed]
        print(f"    {what:34} {_range(walls, per)} ({_range(cpus, per)})")
    floor = statistics.median(t.wall for t in floors)
    restore = statistics.median(r.restored.wall for r in rounds) / floor
    replay = statistics.median(t.wall for t in replays) / floor
    size = rounds[-1].size
    print(
        f"  checkpoint {size / 2**20:.0f} MiB ({size / n:.0f} B a rollout); "
        f"restore / floor {restore:.2f}, replay / floor {replay:.2f}"
    )
    restored_mib, replayed_mib = (b / 2**20 for b in rounds[-1].kept)
    print(
        f"  rollout infos in memory: restored units {restored_mib:.1f} MiB, "
        f"replayed {replayed_mib:.1f} MiB (the rest in their spills)"
    )
    for line in findings:
        print(f"  FINDING {line}")
    return findings


def planted(bootstrap: str, work: Path) -> dict[str, tuple[list[str], list[str]]]:
    """A small run replayed, then checkpointed and restored with each fault of
    :class:`_Planting` planted (and none): the refusals and findings of each."""
    work.mkdir(parents=True)
    generate(400, 4, work / "r", text_bytes=64, seed=0)
    inputs = list(input_events(work / "r_materialized_inputs.jsonl", "run"))
    rollouts = list(rollout_events(work / "r.jsonl", "run"))
    last = {e.key: i for i, e in enumerate(rollouts)}
    kept = [e for i, e in enumerate(rollouts) if last[e.key] != i]  # an open run
    started = RunStarted(run_id="run", expected_rollouts=len(inputs), output_stem="r")
    topics = Topics.for_prefix(f"ckpt-{uuid.uuid4().hex[:8]}")
    asyncio.run(make_topics(bootstrap, topics, 1))
    asyncio.run(prefill(bootstrap, topics, [*inputs, *kept]))
    outcomes: dict[str, tuple[list[str], list[str]]] = {}
    with Pipeline(work / "state") as pipeline:
        pipeline.handle("control", encode(started))
        asyncio.run(read_all(bootstrap, topics, pipeline))
        for plant in ("", "foreign", "missing", "corrupt", "view"):
            got = asyncio.run(checkpoint_round(bootstrap, pipeline, started, work, plant))
            print(f"  planted {plant or 'nothing'}: refused {got.refused}, findings {got.findings}")
            outcomes[plant] = (got.refused, got.findings)
    return outcomes


def self_test(bootstrap: str, work: Path) -> None:
    """:func:`planted`, judged: fails unless an intact checkpoint and one among another
    group's records restore exactly, and a missing and a corrupted chunk are refused (the unit
    then replayed: a finding here, as nothing replays it)."""
    outcomes = planted(bootstrap, work)
    problems = [
        f"a {p} chunk was not refused" for p in ("missing", "corrupt") if not outcomes[p][0]
    ]
    if not any("in memory" in line for line in outcomes["view"][1]):
        problems.append("a restored part keeping its checkpoint in memory was not found")
    problems += [
        f"planted {p or 'nothing'}: the checkpoint did not restore exactly"
        for p in ("", "foreign")
        if outcomes[p] != ([], [])
    ]
    if problems:
        raise SystemExit("self-test FAILED: " + "; ".join(problems))
    print("self-test passed: intact checkpoints restore exactly, broken ones are refused")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[25_000, 100_000])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        if a.self_test:
            self_test(bootstrap, work / "self-test")
            return
        findings = []
        for tasks in a.tasks:
            findings += one_size(bootstrap, tasks, a.repeats, a.runs, work / f"t{tasks}")
    if findings:
        raise SystemExit(f"{len(findings)} findings")


if __name__ == "__main__":
    main()
