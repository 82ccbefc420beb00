"""Recovery from a compacted changelog of part checkpoints, measured before it is built: what
restoring a unit's state in bulk costs against replaying its events, per million rollouts, as
a function of the run's size.

    python -m bench.checkpoint_bench [--tasks 25000 100000] [--repeats 8] [--runs 3]
                                     [--chunk-bytes 1000000] [--bootstrap HOST:PORT]
    python -m bench.checkpoint_bench --self-test

For each size, a generated collection (``--tasks`` x ``--repeats``, each task's last rollout
held back so the run stays open) is written to fresh topics of one partition (one input unit,
one rollout unit). Then, in one process, alternating, ``--runs`` times:

1. **floor**: a bare ``AIOKafkaConsumer`` reading both topics and doing nothing with them;
2. **replay**: what a new owner does today: the same reads, each batch applied in slices of
   2,000 (:meth:`Pipeline.apply`), inputs first (the order the rollout batches' fast path
   needs; the best case for replay);
3. **checkpoint**: the replayed parts written as checkpoints to a compacted topic: each part in
   its wire form (:func:`encode_parts`, every ``sample`` row kept) followed by its content
   digests (8 bytes a key, which the wire form does not carry), cut into records of at most
   ``--chunk-bytes`` (under the broker's default ``max.message.bytes``), each keyed by unit,
   run and chunk number and headed by the checkpoint's id, its position and the chunk count;
   then a restore: the topic read from its start, the newest complete checkpoint of each part
   put together, decoded (:func:`decode_parts`) and its key set rebuilt
   (``_KeySet.add_new`` over the key columns), the per-part state a new owner must hold again.

Each restore is judged: the restored state must export the same bytes as the replayed one and
carry the same digests and counts; a checkpoint with a chunk missing or corrupted must be
refused (``--self-test`` plants both and fails unless both are refused). The figures per
million rollouts (with as many inputs): replay, restore (read + decode + keys), and the cost of
writing a checkpoint (encode + produce), which a checkpoint interval spreads over its events.

Without ``--bootstrap`` it starts its own broker from the Maven jars.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import time
import uuid
import zlib
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.generate import generate
from bench.measure import kafka_workspace
from bench.stream_bench import prefill
from rewardstream.contract.events import EventKind, RunStarted, Topics, encode
from rewardstream.processors.engine.partwire import (
    PartFormatError,
    ReceivedPart,
    decode_parts,
    encode_parts,
)
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Part, _KeySet, key_columns
from rewardstream.producers.events import input_events, rollout_events
from tests.processes import make_topics

SLICE = 2_000
_CHUNK_HEAD = struct.Struct(">QQIII")  # checkpoint id, position, chunk, chunks, crc32


class Timed(NamedTuple):
    """Seconds of wall clock and of this process's CPU."""

    wall: float
    cpu: float


class Restored(NamedTuple):
    """A part put back together from the changelog, as a new owner would hold it again."""

    unit: str
    run: str
    position: int
    part: ReceivedPart
    digests: array[int]
    keys: _KeySet


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


def checkpoint_records(
    pipeline: Pipeline, chunk_bytes: int, checkpoint: int
) -> list[tuple[bytes, bytes]]:
    """Every part of every unit as changelog records (key, value): its wire form then its
    content digests, in chunks of at most ``chunk_bytes``, each headed by the checkpoint's id,
    the unit's position, its number, the count and the whole blob's CRC-32."""
    records: list[tuple[bytes, bytes]] = []
    for name, unit in pipeline.units.items():
        for run, part in unit.parts.items():
            body = encode_parts([(part, {"run": run, "unit": name})])
            blob = struct.pack(">Q", len(body)) + body + part.contents.digests.tobytes()
            crc = zlib.crc32(blob)
            pieces = [blob[at : at + chunk_bytes] for at in range(0, len(blob), chunk_bytes)]
            for i, piece in enumerate(pieces):
                head = _CHUNK_HEAD.pack(checkpoint, unit.position, i, len(pieces), crc)
                records.append((f"{name}/{run}/{i}".encode(), head + piece))
    return records


async def make_changelog(bootstrap: str, topic: str) -> None:
    """A compacted topic of one partition for the checkpoints."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"cleanup.policy": "compact"}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
    finally:
        await admin.close()


async def write(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Produce ``records`` and wait until every one is acknowledged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=max(1 << 20, max(len(v) + len(k) for k, v in records) + 1024),
    )
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def read_changelog(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """The changelog from its start to its end, the newest value of each key."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end, at, latest = (await consumer.end_offsets([tp]))[tp], 0, {}
        while at < end:
            for record in (await consumer.getmany(timeout_ms=200)).get(tp, []):
                if record.key is not None and record.value is not None:
                    latest[record.key] = record.value
                at = record.offset + 1
        return latest
    finally:
        await consumer.stop()


def assemble(latest: dict[bytes, bytes]) -> tuple[list[Restored], list[str]]:
    """The newest complete checkpoint of each part, decoded, with its key set rebuilt; and a
    line for each part refused (incomplete, mixed checkpoints, CRC or format wrong: the owner
    would replay that part in full)."""
    pieces: dict[tuple[str, str], dict[int, tuple[int, int, int, int, bytes]]] = {}
    for key, value in latest.items():
        unit, run, number = key.decode().rsplit("/", 2)
        checkpoint, position, _, n, crc = _CHUNK_HEAD.unpack_from(value)
        pieces.setdefault((unit, run), {})[int(number)] = (checkpoint, position, n, crc, value)
    restored, refused = [], []
    for (unit, run), chunks in sorted(pieces.items()):
        newest = max(c for c, *_ in chunks.values())
        ours = {i: c for i, c in chunks.items() if c[0] == newest}  # an older one's leftovers
        _, position, n, crc, _ = ours[min(ours)]
        if sorted(ours) != list(range(n)) or any(
            c[1:4] != (position, n, crc) for c in ours.values()
        ):
            refused.append(f"{unit}/{run}: checkpoint {newest} has {len(ours)} of {n} chunks")
            continue
        blob = b"".join(ours[i][4][_CHUNK_HEAD.size :] for i in range(n))
        if zlib.crc32(blob) != crc:
            refused.append(f"{unit}/{run}: CRC-32 differs")
            continue
        size = struct.unpack_from(">Q", blob)[0]
        body, digests = blob[8 : 8 + size], blob[8 + size :]
        try:
            (part,) = decode_parts(body, {"run": run, "unit": unit})
        except PartFormatError as exc:
            refused.append(f"{unit}/{run}: {exc}")
            continue
        keys = _KeySet()
        keys.add_new(*key_columns(part.state))
        restored.append(Restored(unit, run, position, part, array("Q", digests), keys))
    return restored, refused


def _export(part: Part | ReceivedPart) -> bytes:
    _, sections = part.state.export_columns(part.taken_infos())
    return b"".join(bytes(s) for s in sections)


def _counts(part: Part | ReceivedPart) -> tuple[int, int, int, int]:
    return part.inputs, part.rollouts, part.duplicates, part.conflicts


def judge(pipeline: Pipeline, restored: list[Restored]) -> list[str]:
    """How the restored parts differ from the replayed ones (empty: none)."""
    findings, seen = [], set()
    for r in restored:
        part = pipeline.units[r.unit].parts[r.run]
        seen.add((r.unit, r.run))
        if r.position != pipeline.units[r.unit].position:
            findings.append(f"{r.unit}/{r.run}: position {r.position}")
        if _export(r.part) != _export(part):
            findings.append(f"{r.unit}/{r.run}: restored columns differ")
        if r.digests != part.contents.digests:
            findings.append(f"{r.unit}/{r.run}: digests differ")
        if _counts(r.part) != _counts(part):
            findings.append(f"{r.unit}/{r.run}: counts {_counts(r.part)}, replayed {_counts(part)}")
        if r.keys.missing(*key_columns(part.state)):
            findings.append(f"{r.unit}/{r.run}: keys missing from the restored key set")
    missing = {(n, run) for n, u in pipeline.units.items() for run in u.parts} - seen
    findings += [f"{unit}/{run}: not restored" for unit, run in sorted(missing)]
    return findings


class Round(NamedTuple):
    """One checkpoint written and restored: the phases' times, its bytes, refusals, findings."""

    encoded: Timed
    produced: Timed
    read: Timed
    decoded: Timed
    size: int
    refused: list[str]
    findings: list[str]


async def checkpoint_round(
    bootstrap: str, pipeline: Pipeline, chunk_bytes: int, number: int, plant: str = ""
) -> Round:
    """Encode, write, read back and restore every part once: the times of encoding, producing
    and restoring, the bytes written, the refusals and the findings. ``plant``: ``missing``
    drops a chunk, ``corrupt`` flips a byte in one, ``leftover`` adds a chunk past the end of
    an older, longer checkpoint of the first part (what compaction keeps when a part's
    checkpoint shrinks): the self-test's faults."""
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    await make_changelog(bootstrap, topic)
    wall, cpu = time.monotonic(), time.process_time()
    records = checkpoint_records(pipeline, chunk_bytes, number)
    encoded = Timed(time.monotonic() - wall, time.process_time() - cpu)
    if plant == "missing":
        records = [r for r in records if not r[0].endswith(b"/1")]
    elif plant == "corrupt":
        key, value = records[len(records) // 2]
        flipped = bytearray(value)
        flipped[_CHUNK_HEAD.size + (len(value) - _CHUNK_HEAD.size) // 2] ^= 0x40
        records[len(records) // 2] = (key, bytes(flipped))
    elif plant == "leftover":
        key, value = records[0]
        head = _CHUNK_HEAD.unpack_from(value)
        old = _CHUNK_HEAD.pack(number - 1, head[1], 999, 1000, 0)
        records.insert(0, (key[: key.rindex(b"/")] + b"/999", old + b"stale"))
    wall, cpu = time.monotonic(), time.process_time()
    await write(bootstrap, topic, records)
    produced = Timed(time.monotonic() - wall, time.process_time() - cpu)
    wall, cpu = time.monotonic(), time.process_time()
    latest = await read_changelog(bootstrap, topic)
    read = Timed(time.monotonic() - wall, time.process_time() - cpu)
    wall, cpu = time.monotonic(), time.process_time()
    restored, refused = assemble(latest)
    decoded = Timed(time.monotonic() - wall, time.process_time() - cpu)
    size = sum(len(k) + len(v) for k, v in records)
    return Round(encoded, produced, read, decoded, size, refused, judge(pipeline, restored))


def _range(values: list[float], per: float) -> str:
    scaled = [v * per for v in values]
    return f"{min(scaled):.2f}-{max(scaled):.2f} (median {statistics.median(scaled):.2f})"


def one_size(
    bootstrap: str, tasks: int, repeats: int, runs: int, chunk_bytes: int, work: Path
) -> list[str]:
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
            rounds.append(asyncio.run(checkpoint_round(bootstrap, pipeline, chunk_bytes, run + 1)))
        findings += rounds[-1].refused + rounds[-1].findings
    restores = [Timed(r.read.wall + r.decoded.wall, r.read.cpu + r.decoded.cpu) for r in rounds]
    size = rounds[-1].size
    per = 1e6 / n
    print(f"  per million rollouts (+ as many inputs), {runs} runs, wall s (CPU s):")
    for what, timed in (
        ("floor: bare consumer", floors),
        ("replay (today's rebuild)", replays),
        ("restore: read + decode + keys", restores),
        ("  of which read", [r.read for r in rounds]),
        ("  of which decode + keys", [r.decoded for r in rounds]),
        ("checkpoint: encode", [r.encoded for r in rounds]),
        ("checkpoint: produce", [r.produced for r in rounds]),
    ):
        walls, cpus = [t.wall for t in timed], [t.cpu for t in timed]
        print(f"    {what:32} {_range(walls, per)} ({_range(cpus, per)})")
    floor = statistics.median(t.wall for t in floors)
    restore = statistics.median(t.wall for t in restores) / floor
    replay = statistics.median(t.wall for t in replays) / floor
    print(
        f"  checkpoint {size / 2**20:.0f} MiB ({size / n:.0f} B a rollout) in records of "
        f"<= {chunk_bytes:,} B; restore / floor {restore:.2f}, replay / floor {replay:.2f}"
    )
    for line in findings:
        print(f"  FINDING {line}")
    return findings


def planted(bootstrap: str, work: Path) -> dict[str, tuple[list[str], list[str]]]:
    """A small run replayed, then checkpointed and restored with each fault of
    :func:`checkpoint_round` planted (and none): the refusals and findings of each."""
    work.mkdir(parents=True)
    generate(400, 4, work / "r", text_bytes=64, seed=0)
    inputs = list(input_events(work / "r_materialized_inputs.jsonl", "run"))
    rollouts = list(rollout_events(work / "r.jsonl", "run"))
    started = RunStarted(run_id="run", expected_rollouts=len(inputs), output_stem="r")
    topics = Topics.for_prefix(f"ckpt-{uuid.uuid4().hex[:8]}")
    asyncio.run(make_topics(bootstrap, topics, 1))
    asyncio.run(prefill(bootstrap, topics, [*inputs, *rollouts]))
    outcomes: dict[str, tuple[list[str], list[str]]] = {}
    with Pipeline(work / "state") as pipeline:
        pipeline.handle("control", encode(started))
        asyncio.run(read_all(bootstrap, topics, pipeline))
        for plant in ("", "leftover", "missing", "corrupt"):
            got = asyncio.run(checkpoint_round(bootstrap, pipeline, 4096, 2, plant))
            print(f"  planted {plant or 'nothing'}: refused {got.refused}, findings {got.findings}")
            outcomes[plant] = (got.refused, got.findings)
    return outcomes


def self_test(bootstrap: str, work: Path) -> None:
    """:func:`planted`, judged: fails unless an intact checkpoint and one beside an older
    one's leftovers restore exactly, and a missing and a corrupted chunk are refused."""
    outcomes = planted(bootstrap, work)
    problems = [
        f"a {p} chunk was not refused" for p in ("missing", "corrupt") if not outcomes[p][0]
    ]
    problems += [
        f"planted {p or 'nothing'}: the checkpoint did not restore exactly"
        for p in ("", "leftover")
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
    ap.add_argument("--chunk-bytes", type=int, default=1_000_000)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        if a.self_test:
            self_test(bootstrap, work / "self-test")
            return
        findings = []
        for tasks in a.tasks:
            findings += one_size(
                bootstrap, tasks, a.repeats, a.runs, a.chunk_bytes, work / f"t{tasks}"
            )
    if findings:
        raise SystemExit(f"{len(findings)} findings")


if __name__ == "__main__":
    main()
