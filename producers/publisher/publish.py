"""``rewardstream publish``: replay (or tail) a collection's two JSONL files onto the topics.

What is sent, in order (see :mod:`rewardstream.contract.events`):

1. every materialized input row as an ``Input`` event, keyed by its task;
2. ``RunStarted`` on the control topic, keyed by run id. It goes *after* the inputs because its
   ``expected_rollouts`` is their count and the inputs are read only once (counted while they
   are published); consumers must cope with control events racing data topics anyway;
3. every rollouts line as a ``Rollout`` event carrying the slim result, keyed by its task;
4. ``RunFinished`` once every line is sent. In ``follow`` mode the collection may still be
   running, so only once every expected rollout was published, or on an explicit opt-in
   (``finish_when_idle``, ``finish_on_stop``): a stop otherwise leaves the run open, since a
   partial "final" profile is worse than none. After an error, what was queued before it still
   goes out but nothing more: a failed publish never finishes its run, and the processor can
   still serve snapshots of what arrived.

Each rollouts line is validated as the batch profiler reads it (see
:func:`rewardstream.producers.events.rollout_event`) before anything of it is sent, so a line the
profiler would reject fails here, with the same :class:`~rewardstream.errors.LineError`, instead of
reaching the processor.

Lines become events through :mod:`rewardstream.producers.events` (shared with the embedded
pipeline), which encodes with the contract's hot-path encoders; the only constrained free-form
fields (run id, stem) are validated once up front with the models. Whole files are read and encoded
by forked children (:class:`rewardstream.producers.publisher.lines.Encoder`) while this process only
fills record batches, so the work spreads over the cores; ``follow`` encodes the growing rollouts
file here. (Replayed events are stamped ``published_at`` when encoded, up to a lookahead before they
are sent.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from tqdm import tqdm

from rewardstream.contract.engine import FinalRecord
from rewardstream.contract.events import BadEvent, RunFinished, RunStarted, Topics, checked, encode
from rewardstream.errors import InputError
from rewardstream.infra.jsonl import check_input_file
from rewardstream.infra.readers import READER
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.producers.events import WireEvent, input_event, rollout_event
from rewardstream.producers.publisher.lines import (
    MAX_MESSAGE_BYTES,
    Chunk,
    Encoder,
    MessageLimit,
    Tail,
    encode_rows,
    file_chunks,
    lean_rollout_chunks,
    parsed,
)
from rewardstream.producers.publisher.run_id import default_run_id
from rewardstream.sinks.topics.content import files_content, finals_of_run, refuse
from rewardstream.sinks.topics.pages import page_line
from rewardstream.sinks.topics.profiles import ensure_topics

__all__ = ["PublishReport", "Sender", "message_limits", "publish_files"]

POLL_SECONDS = 0.2
WINDOW = 5_000  # messages in flight before the publisher waits for acknowledgements
_PARTITIONER = DefaultPartitioner()

log = logging.getLogger(__name__)


class PublishReport(NamedTuple):
    """What one publish sent: the run id used, how many events of each kind, the wall time
    (broker acknowledgements included), and whether ``RunFinished`` was sent (a stopped
    ``follow`` leaves the run open). ``final``: the run's final record, when it had one of
    these very files already (nothing was sent)."""

    run_id: str
    inputs_sent: int
    rollouts_sent: int
    seconds: float
    finished: bool
    final: FinalRecord | None = None


async def publish_files(
    inputs: Path,
    rollouts: Path,
    bootstrap: str,
    *,
    run_id: str | None = None,
    topics: Topics | None = None,
    follow: bool = False,
    finish_when_idle: float | None = None,
    finish_on_stop: bool = False,
    stop: asyncio.Event | None = None,
    progress: bool = False,
    security: KafkaSecurity | None = None,
    aggregate_metrics: bool = False,
    answer_key: str | None = None,
) -> PublishReport:
    """Publish one collection (see the module docstring for the order of events).

    ``run_id`` defaults to :func:`rewardstream.producers.publisher.run_id.default_run_id` (one id
    per collection). A run that has a final profile already is sent nothing: it must be the
    profile of these files (:mod:`rewardstream.sinks.topics.content`), else this raises
    :class:`~rewardstream.sinks.topics.content.Conflict` before anything is sent.
    With ``follow``, keep tailing ``rollouts`` as a running collection appends to it:
    only complete lines are sent; a truncated or replaced file is read again from its start (the
    processor deduplicates by (run, task, rollout)). It finishes the run once as many distinct
    (task, rollout) keys were published as there are input rows, or after ``finish_when_idle``
    seconds without a new complete line; when ``stop`` is set it ends, finishing the run only
    with ``finish_on_stop``. Inputs are read once, at the start.
    ``security``: SASL/TLS settings (default: from ``REWARDSTREAM_KAFKA_*``).
    ``aggregate_metrics`` asks the processors for the aggregate and difficulty files of the
    run, with majority@k over the results' ``answer_key`` when given. ``progress``: a start
    line on stderr (the run id and its live page) and a progress bar on a terminal.
    """
    began = time.perf_counter()
    _check_follow_options(follow, finish_when_idle, finish_on_stop)
    inputs = check_input_file(inputs, "--inputs")
    rollouts = check_input_file(rollouts, "--rollouts")
    stem = rollouts.stem
    run_id = default_run_id(inputs, stem) if run_id is None else run_id
    _check_run(run_id, stem)
    topics = topics or Topics.for_prefix()
    security = security or KafkaSecurity.from_env()
    await ensure_topics(bootstrap, security, topics, "publisher")  # before anything is sent
    if finals := await finals_of_run(bootstrap, security, topics, run_id):  # refused up front
        content = await asyncio.to_thread(files_content, inputs, rollouts, run_id, answer_key)
        for final in finals:
            refuse(final, content, str(rollouts), "publish the files with a new --run-id")
        seconds = time.perf_counter() - began
        return PublishReport(run_id, 0, 0, seconds, finished=True, final=finals[0])
    if progress:  # the run id and its page now, for watch, snapshot or a browser
        page = await page_line(bootstrap, security, topics, run_id)
        doing = "following" if follow else "publishing"
        print(f"{doing} {rollouts} as run {run_id}; {page}", file=sys.stderr, flush=True)
    producer = await _start_producer(bootstrap, security)
    try:
        # the limits first: an encoder names the line whose event a topic would refuse
        data = [topics.inputs, topics.rollouts, topics.control]
        limits = await message_limits(producer, bootstrap, security, data)
        with contextlib.ExitStack() as stack:
            source = functools.partial(
                file_chunks, inputs, input_event, run_id, limits[topics.inputs]
            )
            input_encoder = stack.enter_context(Encoder(source))
            rollouts_limit = limits[topics.rollouts]
            rollouts_encoder = None
            if not follow:
                source = functools.partial(
                    lean_rollout_chunks, rollouts, run_id, answer_key, rollouts_limit
                )
                if READER == "reference":  # the batch reader's choice (REWARDSTREAM_READER)
                    make = functools.partial(rollout_event, answer_key=answer_key)
                    source = functools.partial(file_chunks, rollouts, make, run_id, rollouts_limit)
                rollouts_encoder = stack.enter_context(Encoder(source))
            sender = Sender(producer)
            bar = tqdm(
                desc=f"publishing {rollouts.name}",
                unit=" rollouts",
                disable=not progress or not sys.stderr.isatty(),
                mininterval=0.5,
            )
            try:
                with bar:
                    n_inputs = await sender.send_all(topics.inputs, input_encoder.chunks())
                    started = RunStarted(
                        run_id=run_id,
                        expected_rollouts=n_inputs,
                        output_stem=stem,
                        aggregate_metrics=aggregate_metrics,
                        answer_key=answer_key,
                    )
                    await sender.send(topics.control, encode(started), run_id.encode())
                    await sender.flush()  # consumers learn of the run now, not with the next batch
                    publisher = _RolloutPublisher(
                        rollouts, rollouts_limit, sender, (run_id, answer_key), bar
                    )
                    if rollouts_encoder is None:
                        finish = _Finish(n_inputs, finish_when_idle, finish_on_stop)
                        finished = await publisher.follow(finish, stop or asyncio.Event())
                    else:
                        await publisher.replay(rollouts_encoder)
                        finished = True
                    # every rollout acknowledged first: a processor that reads run_finished
                    # takes the log ends as they are then, and must find every rollout before
                    await sender.settle()
                    if finished:
                        event = encode(RunFinished(run_id=run_id))
                        await sender.send(topics.control, event, run_id.encode())
                        await sender.settle()
            except BaseException:
                with contextlib.suppress(KafkaError):
                    await sender.flush()  # lines before a bad one still go out (run stays open)
                raise
    finally:
        await producer.stop()  # waits for everything handed to it
    seconds = time.perf_counter() - began
    return PublishReport(run_id, n_inputs, publisher.sent, seconds, finished)


async def _start_producer(bootstrap: str, security: KafkaSecurity) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=10,
        max_batch_size=524_288,  # fewer, larger requests: less CPU here and in the broker
        max_request_size=MAX_MESSAGE_BYTES,
        **security.client_kwargs(),
    )
    await start_client(producer, bootstrap, security)
    return producer


async def message_limits(
    producer: AIOKafkaProducer, bootstrap: str, security: KafkaSecurity, topics: Iterable[str]
) -> dict[str, MessageLimit]:
    """Each topic's :class:`MessageLimit`. The topics are created first, as the first send
    would create them, so a topic that cannot be is refused before anything is sent; Kafka's
    default stands where the limit cannot be read (e.g. not authorized to describe configs)."""
    limits = {topic: MessageLimit(topic) for topic in topics}
    for topic in limits:
        try:
            await producer.partitions_for(topic)
        except KafkaError as exc:  # e.g. no such topic and auto-creation disabled
            raise InputError(f"cannot publish to topic {topic!r}: {exc!r}") from None
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    try:
        await admin.start()
        wanted = {"max.message.bytes": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, t, wanted) for t in limits]
        for response in await admin.describe_configs(resources):
            for error, _, _, name, entries in response.resources:
                for entry in entries if error == 0 and name in limits else ():
                    if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                        limits[name] = MessageLimit(name, int(entry[1]))
    except KafkaError:
        pass
    finally:
        with contextlib.suppress(KafkaError):
            await admin.close()
    return limits


def _check_follow_options(follow: bool, when_idle: float | None, on_stop: bool) -> None:
    if (when_idle is not None or on_stop) and not follow:
        raise InputError("--finish-when-idle and --finish-on-stop only apply with --follow")
    if when_idle is not None and not (when_idle > 0 and math.isfinite(when_idle)):
        raise InputError(f"--finish-when-idle must be a number of seconds > 0, got {when_idle}")


def _check_run(run_id: str, stem: str) -> None:
    """Reject a run id or stem the contract would reject, before anything is sent."""
    try:
        checked(RunStarted(run_id=run_id, expected_rollouts=0, output_stem=stem))
    except BadEvent as exc:
        field, value = ("run id", run_id) if exc.field == "run_id" else ("rollouts file stem", stem)
        raise InputError(f"invalid {field} {value!r}: {exc.message}") from None


class Sender:
    """Fills one record batch per partition itself and hands each over whole, when full.

    ``AIOKafkaProducer.send()`` costs about as much per message as parsing and validating a
    rollout (metadata wait, partitioner, one future per message); ``send_batch()`` pays that
    once per batch. Partitions are chosen as ``send()`` would (the default murmur2
    partitioner), so every event of a task still meets in one partition. Acknowledgements are
    awaited in windows: once more than ``window`` messages are in flight, the oldest batches
    are awaited, which bounds memory and surfaces broker errors early.
    """

    def __init__(self, producer: AIOKafkaProducer, window: int = WINDOW) -> None:
        self.producer, self.window = producer, window
        self._partitions: dict[str, list[int]] = {}
        self._chosen: dict[tuple[str, bytes], int] = {}
        self._builders: dict[tuple[str, int], BatchBuilder] = {}
        self._in_flight: deque[tuple[asyncio.Future[Any], int, str, int]] = deque()
        self._in_flight_messages = 0

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        """Queue one message; it leaves when its batch is full or at :meth:`flush`."""
        await self.send_many(topic, [(key, value)])

    async def send_all(
        self, topic: str, chunks: AsyncIterator[Chunk], bar: tqdm[Any] | None = None
    ) -> int:
        """Queue every chunk's messages (counted on ``bar``); returns how many."""
        count = 0
        async for chunk in chunks:
            await self.send_many(topic, chunk)
            count += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        return count

    async def send_many(self, topic: str, messages: Chunk) -> None:
        """Queue ``(key, value)`` messages in order; each leaves when its batch is full.

        One loop with the lookups in locals: this runs once per message.
        """
        partitions = self._partitions.get(topic) or await self._partitions_of(topic)
        single = partitions[0] if len(partitions) == 1 else -1
        builders, chosen = self._builders, self._chosen
        for key, value in messages:
            partition = single
            if partition < 0:
                partition = chosen.get((topic, key), -1)
                if partition < 0:
                    if len(chosen) > 1 << 20:
                        chosen.clear()
                    partition = chosen[topic, key] = _PARTITIONER(key, partitions, partitions)
            builder = builders.get((topic, partition))
            if builder is None:
                builder = builders[topic, partition] = self.producer.create_batch()
            if builder.append(timestamp=None, key=key, value=value) is None:  # full
                await self._submit(topic, partition, builder)
                builder = builders[topic, partition] = self.producer.create_batch()
                builder.append(timestamp=None, key=key, value=value)  # an empty batch takes any

    async def _partitions_of(self, topic: str) -> list[int]:
        try:
            found = await self.producer.partitions_for(topic)
        except KafkaError as exc:  # e.g. no such topic and auto-creation disabled
            raise InputError(f"cannot publish to topic {topic!r}: {exc!r}") from exc
        partitions = self._partitions[topic] = sorted(found)
        return partitions

    async def flush(self) -> None:
        """Hand every partly filled batch to the producer (it goes out without lingering)."""
        builders, self._builders = self._builders, {}
        for (topic, partition), builder in builders.items():
            await self._submit(topic, partition, builder)

    async def settle(self) -> None:
        """Flush, then wait until the broker acknowledged everything (raising its error)."""
        await self.flush()
        while self._in_flight:
            await self._wait_oldest()

    async def _submit(self, topic: str, partition: int, builder: BatchBuilder) -> None:
        builder.close()  # a closed batch is sent at once instead of lingering
        count = builder.record_count()
        future = await self.producer.send_batch(builder, topic, partition=partition)
        future.add_done_callback(_retrieve)  # awaited in turn, unless an earlier one failed
        self._in_flight.append((future, count, topic, partition))
        self._in_flight_messages += count
        while self._in_flight_messages > self.window:
            await self._wait_oldest()

    async def _wait_oldest(self) -> None:
        future, count, topic, partition = self._in_flight.popleft()
        self._in_flight_messages -= count
        try:
            await future
        except KafkaError as exc:
            raise InputError(
                f"Kafka did not accept a batch for {topic}[{partition}]: {exc!r}"
            ) from exc


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a batch's failure as seen: after one batch fails, the ones behind it are never
    awaited, and asyncio would log each as "Future exception was never retrieved"."""
    if not future.cancelled():
        future.exception()


async def _local(chunks: Iterable[Chunk]) -> AsyncIterator[Chunk]:
    """Chunks encoded in this process, for :meth:`Sender.send_all`."""
    for chunk in chunks:
        yield chunk


class _Finish(NamedTuple):
    """When a followed run is finished: ``expected`` distinct rollouts published, or (opt-in)
    ``when_idle`` seconds without a new line, or a stop with ``on_stop``."""

    expected: int
    when_idle: float | None
    on_stop: bool


class _RolloutPublisher:
    """Sends rollouts events: the whole file once (encoded by children), or a growing file."""

    def __init__(
        self,
        path: Path,
        limit: MessageLimit,
        sender: Sender,
        run: tuple[str, str | None],
        bar: tqdm[Any],
    ) -> None:
        """``run``: the run id, and the answer key its records carry answers of."""
        self.path, self.limit, self.sender, self.bar = path, limit, sender, bar
        self.run_id, self.answer_key = run
        self.topic = limit.topic
        self.sent = 0
        self.keys: set[tuple[int, int]] = set()  # distinct rollouts sent (follow only)

    async def replay(self, encoder: Encoder) -> None:
        self.sent += await self.sender.send_all(self.topic, encoder.chunks(), self.bar)

    def _event(self, row: Any, run_id: str, path: Path, lineno: int) -> WireEvent:
        """:func:`rollout_event`, noting the key: a file read again from its start (truncated,
        replaced) must not count its rollouts twice toward the expected count."""
        event = rollout_event(row, run_id, path, lineno, self.answer_key)
        self.keys.add((row["_ng_task_index"], row["_ng_rollout_index"]))  # checked just now
        return event

    async def follow(self, finish: _Finish, stop: asyncio.Event) -> bool:
        """Tail until the run is complete or stopped; returns whether to finish the run.
        Encoded here, not in a child: a live collection writes far slower than this reads."""
        tail = Tail(self.path)
        try:
            idle_since = time.monotonic()
            while True:
                stopping = stop.is_set()  # read before the last pass, so it sees every line
                rows = parsed(tail.complete_lines(), self.path)
                chunks = _local(encode_rows(rows, self.path, self._event, self.run_id, self.limit))
                sent = await self.sender.send_all(self.topic, chunks, self.bar)
                self.sent += sent
                await self.sender.flush()
                now = time.monotonic()
                if sent:
                    idle_since = now
                complete = len(self.keys) >= finish.expected
                idle = finish.when_idle is not None and now - idle_since >= finish.when_idle
                if complete or idle or stopping:
                    if tail.partial:
                        log.warning(
                            "not published: the incomplete last line %d of %s",
                            tail.lineno + 1,
                            self.path,
                        )
                    return complete or idle or finish.on_stop
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_SECONDS)
        finally:
            tail.close()
