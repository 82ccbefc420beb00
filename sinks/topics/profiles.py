"""Final profiles in Kafka: written once per run, in a transaction; read back from any host.

A run's final files go to ``<prefix>.profiles`` as zlib-compressed chunks, and its
:class:`~rewardstream.contract.engine.FinalRecord` to ``<prefix>.finals``, in one transaction
whose id is the run's (``rewardstream-final.<group>.<run_id>``). Starting a producer with that
id fences any earlier one (a leader paused past its session timeout, then resumed: its
transaction is aborted and its later sends fail), and the new one reads the finals topic
before writing: so whatever processors die, pause or join, a run has exactly one final record,
and readers (``read_committed``) never see the chunks of an aborted attempt.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from rewardstream.contract.decisions import decisions_topic
from rewardstream.contract.engine import (
    CHUNK_BYTES,
    EngineTopics,
    FileRef,
    FinalRecord,
    ForeignState,
    decode_final,
    encode_record,
    final_key,
)
from rewardstream.contract.events import Topics
from rewardstream.errors import InputError
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.sinks.files import ProfilePaths, write_files

__all__ = [
    "Role",
    "ensure_topics",
    "fetch_profile",
    "finals_of",
    "list_finals",
    "publish_final",
    "read_finals",
    "read_to_end",
    "reader",
]

_COMPACT = {"cleanup.policy": "compact"}
# checkpoints: superseded ones are deleted by their writer; one whose writer died before that
# goes after a week (a unit whose named checkpoint went is replayed, as without one)
_CHECKPOINTS = {"cleanup.policy": "compact,delete", "retention.ms": str(7 * 24 * 3600 * 1000)}


Role = Literal["processor", "publisher", "reader"]


async def ensure_topics(
    bootstrap: str, security: KafkaSecurity, topics: Topics, role: Role = "reader"
) -> None:
    """Check, once at a command's start, the topic shapes every reader of the prefix relies
    on; raise :class:`InputError` (one line: the topic, its partitions, what is required and how
    to fix it) before the command writes anything.

    The control and engine topics are read as one partition (:func:`read_to_end`): records on
    any other would go unseen. The inputs and rollouts topics must have as many partitions each:
    a task's input row and its rollouts meet in the partition of the same number (both keyed by
    task). The shapes come from a metadata request of all topics made here (a consumer's
    metadata may be stale; one naming a topic would auto-create it).

    A missing topic is created first in its shape by its creator: a ``processor`` creates the
    engine topics (compacted), control and decisions, a ``publisher`` control and decisions
    (auto-creation would give them the broker's ``num.partitions``) and a data topic whose
    sibling exists (with the sibling's count; two missing data topics are auto-created alike by
    the first send); a ``reader`` creates nothing. Engine and control replication is the
    broker's default (three on a three-broker ``kafka start``)."""
    single = _one_partition(topics)
    decisions = decisions_topic(topics)
    siblings = {topics.inputs: topics.rollouts, topics.rollouts: topics.inputs}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await start_client(admin, bootstrap, security)
    try:
        _check(shapes := await _partitions(admin), topics)  # nothing is created beside a misfit
        wanted = []
        if role != "reader":
            brokers = len((await admin.describe_cluster())["brokers"])
            mine = single if role == "processor" else (topics.control, decisions, *siblings)
            for name in (n for n in mine if n not in shapes):
                if name in siblings:
                    if (sibling := shapes.get(siblings[name])) is not None:
                        wanted.append(NewTopic(name, len(sibling), len(sibling[0]["replicas"])))
                else:
                    configs = {} if name in (topics.control, decisions) else _COMPACT
                    if name == EngineTopics.of(topics).checkpoints:
                        configs = _CHECKPOINTS
                    wanted.append(NewTopic(name, 1, min(3, brokers), topic_configs=configs))
        if wanted:
            response = await admin.create_topics(wanted)
            for name, code, *message in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):  # another one was first
                    why = message[0] if message and message[0] else for_code(code).__name__
                    raise InputError(f"cannot create topic {name!r}: {why}")
            _check(await _partitions(admin), topics)  # as another creator may have made them
    finally:
        await admin.close()


def _check(shapes: dict[str, list[dict[str, Any]]], topics: Topics) -> None:
    """Refuse the first topic of ``topics`` whose shape readers cannot rely on."""
    for name in _one_partition(topics):
        if name in shapes and len(shapes[name]) != 1:
            raise InputError(
                f"topic {name!r} has {len(shapes[name])} partitions; rewardstream reads it as "
                "one partition and would miss records on the others: recreate it with one "
                "partition or use another topic prefix"
            )
    n_in, n_out = len(shapes.get(topics.inputs, [])), len(shapes.get(topics.rollouts, []))
    if n_in and n_out and n_in != n_out:
        raise InputError(
            f"topic {topics.inputs!r} has {_partitions_of(n_in)} but {topics.rollouts!r} has "
            f"{_partitions_of(n_out)}: they need as many (a task's input and its rollouts meet "
            "in the partition of the same number, or its run never completes): recreate one "
            "with the other's count or use another topic prefix"
        )


def _one_partition(topics: Topics) -> tuple[str, ...]:
    """The topics read as one partition: the engine's, control and decisions."""
    engine = EngineTopics.of(topics)
    return (
        *(engine.members, engine.finals, engine.profiles, engine.checkpoints),
        *(topics.control, decisions_topic(topics)),
    )


def _partitions_of(n: int) -> str:
    return f"{n} partition{'s' * (n != 1)}"


async def _partitions(admin: AIOKafkaAdminClient) -> dict[str, list[dict[str, Any]]]:
    """Every topic's partitions, as the broker has them now (a topic being created may not
    be listed yet)."""
    return {t["topic"]: t["partitions"] for t in await admin.describe_topics() if t["partitions"]}


def reader(bootstrap: str, security: KafkaSecurity, fetch_bytes: int = 1 << 20) -> AIOKafkaConsumer:
    """A consumer outside any group, from the start, of committed records only: how the
    engine's topics (and the control topic) are read; ``fetch_bytes`` per fetch and partition
    (large records read back to back, as checkpoints are, want more than the default)."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=max(fetch_bytes, 50 << 20),
        **security.client_kwargs(),
    )


async def read_to_end(consumer: AIOKafkaConsumer, topic: str) -> AsyncIterator[ConsumerRecord]:
    """Every record of a one-partition topic from its start to its end as it is now;
    ``consumer`` (started, unassigned) is left assigned there, to read on. Nothing, and left
    unassigned, while the topic does not exist: naming a missing topic in a request has the
    broker auto-create it with its ``num.partitions`` (a shape :func:`ensure_topics` refuses),
    so its existence is asked with a request of all topics."""
    if topic not in await consumer.topics():
        return
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    end = (await consumer.end_offsets([tp]))[tp]
    while await consumer.position(tp) < end:
        for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
            yield record


def finals_of(
    records: Iterable[ConsumerRecord], prefix: str, group: str | None
) -> Iterator[FinalRecord]:
    """The final records of ``group`` (every group: None) among ``records``."""
    for record in records:
        if record.value is not None:
            final = decode_final(record.value, prefix)
            if group is None or final.group == group:
                yield final


async def read_finals(
    consumer: AIOKafkaConsumer, topic: str, prefix: str, group: str | None
) -> AsyncIterator[FinalRecord]:
    """Every final record of ``group`` (every group: None) to the topic's end as it is now
    (see :func:`read_to_end`)."""
    async for record in read_to_end(consumer, topic):
        for final in finals_of([record], prefix, group):
            yield final


async def publish_final(
    bootstrap: str,
    security: KafkaSecurity,
    topics: EngineTopics,
    record: FinalRecord,
    files: Sequence[Path],
) -> FinalRecord:
    """Write the run's final record (with ``files``' chunks when it is ``final``) unless the
    run has one already; returns the record that stands. Raises when this producer is fenced
    by a newer one (aiokafka's ``ProducerFenced``): that one finishes the run."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"rewardstream-final.{record.group}.{record.run_id}",
        enable_idempotence=True,
        max_request_size=2 * CHUNK_BYTES,
        **security.client_kwargs(),
    )
    await start_client(producer, bootstrap, security)  # fences earlier producers of this run
    try:
        consumer = reader(bootstrap, security)
        await start_client(consumer, bootstrap, security)
        try:
            async for final in read_finals(consumer, topics.finals, record.prefix, record.group):
                if final.run_id == record.run_id:
                    return final
        finally:
            await consumer.stop()
        refs = []
        async with producer.transaction():
            sent = []
            for index, path in enumerate(files):
                digest, size, chunks = hashlib.sha256(), 0, 0
                with open(path, "rb") as fh:
                    while block := fh.read(CHUNK_BYTES):
                        digest.update(block)
                        size += len(block)
                        key = f"{record.group}/{record.run_id}/{index}/{chunks}".encode()
                        sent.append(
                            await producer.send(topics.profiles, zlib.compress(block, 1), key=key)
                        )
                        chunks += 1
                refs.append(
                    FileRef(name=path.name, size=size, sha256=digest.hexdigest(), chunks=chunks)
                )
            first = min((m.offset for m in await asyncio.gather(*sent)), default=0)
            record = record.model_copy(
                update={"files": refs, "chunks_from": first, "at": time.time()}
            )
            await producer.send(
                topics.finals,
                encode_record(record),
                key=final_key(record.group, record.run_id),
            )
        return record
    finally:
        await producer.stop()


async def list_finals(
    bootstrap: str, security: KafkaSecurity, topics: EngineTopics, prefix: str, group: str | None
) -> dict[tuple[str, str], FinalRecord]:
    """The standing final record of every run, by (group, run id); none before the finals
    topic exists (reading it would create it, but not as the processors do: compacted)."""
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        out: dict[tuple[str, str], FinalRecord] = {}
        if topics.finals not in await consumer.topics():
            return out
        async for final in read_finals(consumer, topics.finals, prefix, group):
            out.setdefault((final.group, final.run_id), final)  # the first one stands
        return out
    finally:
        await consumer.stop()


async def fetch_profile(
    bootstrap: str,
    security: KafkaSecurity,
    topics: EngineTopics,
    prefix: str,
    group: str,
    run_id: str,
    out: Path,
    timeout: float,
    extras: bool = True,
    accept: Callable[[FinalRecord], None] | None = None,
) -> ProfilePaths:
    """Wait up to ``timeout`` seconds for the run's final profile and write its three files
    (and, with ``extras``, its aggregate and difficulty files when it has them) into ``out``
    atomically (all or none); raises :class:`InputError` when it does not come,
    or when the run was evicted unfinished; ``accept`` raises, before anything is written,
    when the final is not what the caller wants."""
    final = await _wait_final(bootstrap, security, topics, prefix, group, run_id, timeout)
    if final.state == "evicted":
        raise InputError(f"run {run_id!r} was evicted unfinished: it has no final profile")
    if accept is not None:
        accept(final)
    contents = await _read_files(bootstrap, security, topics, final)
    out.mkdir(parents=True, exist_ok=True)
    paths = ProfilePaths.next_to(out / f"{final.stem}.jsonl")
    by_name = dict(zip([f.name for f in final.files], contents, strict=True))
    wanted = [*paths, *(p for p in paths.extras() if extras and p.name in by_name)]
    write_files([(path, [by_name[path.name]]) for path in wanted])
    return paths


async def _wait_final(
    bootstrap: str,
    security: KafkaSecurity,
    topics: EngineTopics,
    prefix: str,
    group: str,
    run_id: str,
    timeout: float,
) -> FinalRecord:
    """The run's standing final record: read to the topic's end, then waited for there."""
    deadline = time.monotonic() + timeout
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        made = topics.finals in await consumer.topics()
        if made:  # a final stands even when its run's control events have aged out
            async for final in read_finals(consumer, topics.finals, prefix, group):
                if final.run_id == run_id:
                    return final  # the first one stands
        if not await _announced(bootstrap, security, Topics.for_prefix(prefix).control, run_id):
            raise InputError(
                f"no run {run_id!r} under the topic prefix {prefix!r}: nothing was published "
                "under that run id (rewardstream profiles list shows the runs with a final)"
            )
        if not made:
            while topics.finals not in await consumer.topics() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)  # no processor has made it yet (see read_to_end)
            async for final in read_finals(consumer, topics.finals, prefix, group):
                if final.run_id == run_id:
                    return final
        tp = TopicPartition(topics.finals, 0)
        while (left := deadline - time.monotonic()) > 0:
            batch = await consumer.getmany(tp, timeout_ms=max(1, int(min(left, 1.0) * 1000)))
            for final in finals_of(batch.get(tp, []), prefix, group):
                if final.run_id == run_id:
                    return final
    finally:
        await consumer.stop()
    raise InputError(
        f"run {run_id!r} has no final profile yet (group {group!r}): it was still open after "
        f"{timeout:g} s of waiting"
    )


async def _announced(bootstrap: str, security: KafkaSecurity, control: str, run_id: str) -> bool:
    """Whether the control topic holds an event of ``run_id`` (its events are keyed by it):
    a run id nobody published is said at once, not after a wait for a final that cannot
    come."""
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        key = run_id.encode()
        return any([record.key == key async for record in read_to_end(consumer, control)])
    finally:
        await consumer.stop()


async def _read_files(
    bootstrap: str, security: KafkaSecurity, topics: EngineTopics, final: FinalRecord
) -> list[bytes]:
    """The final's files, from their chunks (checked against their size and digest)."""
    prefix = f"{final.group}/{final.run_id}/".encode()
    want = {(i, c) for i, f in enumerate(final.files) for c in range(f.chunks)}
    chunks: dict[tuple[int, int], bytes] = {}
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        tp = TopicPartition(topics.profiles, 0)
        consumer.assign([tp])
        consumer.seek(tp, final.chunks_from)
        end = (await consumer.end_offsets([tp]))[tp]
        while len(chunks) < len(want) and await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                key = record.key or b""
                if key.startswith(prefix) and record.value is not None:
                    index, chunk = map(int, key[len(prefix) :].split(b"/"))
                    chunks[(index, chunk)] = zlib.decompress(record.value)
    finally:
        await consumer.stop()
    if len(chunks) < len(want):
        raise ForeignState(f"run {final.run_id!r}: the profiles topic lacks chunks of its final")
    files = []
    for index, ref in enumerate(final.files):
        data = b"".join(chunks[(index, c)] for c in range(ref.chunks))
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ForeignState(f"run {final.run_id!r}: {ref.name} in Kafka fails its digest")
        files.append(data)
    return files
