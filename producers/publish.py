"""``rewardstream publish``: replay (or tail) a collection's two JSONL files onto the topics.

What is sent, in order (see :mod:`rewardstream.contract`):

1. every materialized input row as an ``InputEvent``, keyed by its task;
2. ``RunStarted`` on the control topic, keyed by run id. It goes *after* the inputs because its
   ``expected_rollouts`` is their count and the inputs are read only once (counted while they
   are published); consumers must cope with control events racing data topics anyway;
3. every rollouts line as a ``RolloutEvent`` carrying the slim result, keyed by its task;
4. ``RunFinished`` once every line is sent (in ``follow`` mode: once stopped or idle). After an
   error, what was queued before it still goes out but nothing more: a failed publish never
   finishes its run, and the processor can still serve snapshots of what arrived.

Each rollouts line goes through :func:`~processors.records.extract_result` before anything of
it is sent, so a line the batch profiler would reject fails here, with the same
:class:`~rewardstream.errors.LineError`, instead of reaching the processor.

Lines become events through :mod:`producers.events` (shared with the embedded pipeline), which
encodes with the contract's hot-path encoders; the only constrained free-form fields (run id,
stem) are validated once up front with the models.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from pydantic import ValidationError
from tqdm import tqdm

from producers.events import input_event, rollout_event
from rewardstream.contract import RunFinished, RunStarted, Topics, encode, run_id_from
from rewardstream.errors import InputError, LineError
from rewardstream.jsonl import check_input_file, parse_line

__all__ = ["PublishReport", "default_run_id", "publish_files"]

POLL_SECONDS = 0.2
MAX_MESSAGE_BYTES = 8 << 20  # the producer's max_request_size; brokers may allow less
WINDOW = 5_000  # messages in flight before the publisher waits for acknowledgements
_CHUNK = 8 << 20  # files are read this many bytes at a time (bounded memory)
_PARTITIONER = DefaultPartitioner()

log = logging.getLogger(__name__)


class PublishReport(NamedTuple):
    """What one publish sent: the run id used, how many events of each kind, and the wall time
    (broker acknowledgements included)."""

    run_id: str
    inputs_sent: int
    rollouts_sent: int
    seconds: float


def default_run_id(rollouts: Path) -> str:
    """``<stem>-<sha1 of the resolved path, 8 hex>``: republishing the same file reuses the run,
    so the processor deduplicates instead of starting a second profile."""
    digest = hashlib.sha1(str(rollouts.resolve()).encode()).hexdigest()[:8]
    return f"{run_id_from(rollouts.stem)}-{digest}"


async def publish_files(
    inputs: Path,
    rollouts: Path,
    bootstrap: str,
    *,
    run_id: str | None = None,
    topics: Topics | None = None,
    follow: bool = False,
    idle_timeout: float = 30.0,
    stop: asyncio.Event | None = None,
    progress: bool = False,
) -> PublishReport:
    """Publish one collection (see the module docstring for the order of events).

    With ``follow``, keep tailing ``rollouts`` as a running collection appends to it: only
    complete lines are sent; a truncated or replaced file is read again from its start (the
    processor deduplicates by (run, task, rollout)); it ends when ``stop`` is set or after
    ``idle_timeout`` seconds without a new complete line. Inputs are read once, at the start.
    """
    began = time.perf_counter()
    inputs = check_input_file(inputs, "--inputs")
    rollouts = check_input_file(rollouts, "--rollouts")
    stem = rollouts.stem
    run_id = default_run_id(rollouts) if run_id is None else run_id
    _check_run(run_id, stem)
    topics = topics or Topics.for_prefix()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=10,
        max_batch_size=262_144,
        max_request_size=MAX_MESSAGE_BYTES,
    )
    try:
        await producer.start()
    except KafkaConnectionError as exc:
        await producer.stop()
        raise InputError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    sender = _Sender(producer)
    bar = tqdm(
        desc=f"publishing {rollouts.name}",
        unit=" rollouts",
        disable=not progress or not sys.stderr.isatty(),
        mininterval=0.5,
    )
    try:
        with bar:
            n_inputs = await _publish_inputs(inputs, topics.inputs, sender, run_id)
            started = RunStarted(run_id=run_id, expected_rollouts=n_inputs, output_stem=stem)
            await sender.send(topics.control, encode(started), run_id.encode())
            await sender.flush()  # consumers learn of the run now, not with the first full batch
            publisher = _RolloutPublisher(rollouts, topics.rollouts, sender, run_id, bar)
            if follow:
                await publisher.follow(idle_timeout, stop or asyncio.Event())
            else:
                await publisher.replay()
            await sender.send(topics.control, encode(RunFinished(run_id=run_id)), run_id.encode())
            await sender.settle()
    except BaseException:
        with contextlib.suppress(KafkaError):
            await sender.flush()  # lines before a bad one still go out (the run stays open)
        raise
    finally:
        await producer.stop()  # waits for everything handed to it
    return PublishReport(run_id, n_inputs, publisher.sent, time.perf_counter() - began)


def _check_run(run_id: str, stem: str) -> None:
    """Reject a run id or stem the contract would reject, before anything is sent."""
    try:
        RunStarted(run_id=run_id, expected_rollouts=0, output_stem=stem)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = "run id" if err["loc"][0] == "run_id" else "rollouts file stem"
        raise InputError(f"invalid {field} {err['input']!r}: {err['msg']}") from None


class _Sender:
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
        partitions = self._partitions.get(topic)
        if partitions is None:
            try:
                found = await self.producer.partitions_for(topic)
            except KafkaError as exc:  # e.g. no such topic and auto-creation disabled
                raise InputError(f"cannot publish to topic {topic!r}: {exc!r}") from exc
            partitions = self._partitions[topic] = sorted(found)
        if len(partitions) == 1:
            partition = partitions[0]
        else:
            partition = self._chosen.get((topic, key), -1)
            if partition < 0:
                if len(self._chosen) > 1 << 20:
                    self._chosen.clear()
                partition = _PARTITIONER(key, partitions, partitions)
                self._chosen[topic, key] = partition
        builder = self._builders.get((topic, partition))
        if builder is None:
            builder = self._builders[topic, partition] = self.producer.create_batch()
        if builder.append(timestamp=None, key=key, value=value) is None:  # full
            await self._submit(topic, partition, builder)
            builder = self._builders[topic, partition] = self.producer.create_batch()
            builder.append(timestamp=None, key=key, value=value)  # an empty batch takes any

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


async def _publish_inputs(path: Path, topic: str, sender: _Sender, run_id: str) -> int:
    count = 0
    for lineno, raw in _whole_file(path):
        event = input_event(_parse(raw, path, lineno), run_id, path, lineno)
        _check_size(event.value, path, lineno)
        await sender.send(topic, event.value, event.key)
        count += 1
    return count


def _whole_file(path: Path) -> Iterator[tuple[int, bytes]]:
    """Every line with its 1-based number, the last one even without its newline."""
    tail = _Tail(path)
    try:
        yield from tail.complete_lines()
        if tail.partial:
            yield tail.lineno + 1, tail.partial
    finally:
        tail.close()


def _parse(raw: bytes, path: Path, lineno: int) -> Any:
    """``orjson.loads`` on the hot path; :func:`parse_line` only for its error wording."""
    try:
        return orjson.loads(raw)  # JSON whitespace includes the line's own \r\n
    except orjson.JSONDecodeError:
        return parse_line(raw, path, lineno)  # raises NeMo Gym's "Malformed JSON ..." error


def _check_size(value: bytes, path: Path, lineno: int) -> None:
    if len(value) > MAX_MESSAGE_BYTES:
        raise LineError(
            str(path),
            lineno,
            f"its event is {len(value)} bytes, above the {MAX_MESSAGE_BYTES}-byte message limit",
        )


class _RolloutPublisher:
    """Turns rollouts lines into events: the whole file once, or a growing file until told."""

    def __init__(
        self, path: Path, topic: str, sender: _Sender, run_id: str, bar: tqdm[Any]
    ) -> None:
        self.path, self.topic, self.sender, self.run_id, self.bar = path, topic, sender, run_id, bar
        self.sent = 0

    async def publish(self, lines: Iterable[tuple[int, bytes]]) -> None:
        """Validate each line exactly as the batch reader does, then send it.

        One loop with the callees in locals: this runs once per rollout.
        """
        path, topic, send, run_id = self.path, self.topic, self.sender.send, self.run_id
        for lineno, raw in lines:
            event = rollout_event(_parse(raw, path, lineno), run_id, path, lineno)
            _check_size(event.value, path, lineno)
            await send(topic, event.value, event.key)
            self.sent += 1
            if not self.sent & 1023:
                self.bar.update(self.sent - self.bar.n)
        self.bar.update(self.sent - self.bar.n)

    async def replay(self) -> None:
        await self.publish(_whole_file(self.path))

    async def follow(self, idle_timeout: float, stop: asyncio.Event) -> None:
        tail = _Tail(self.path)
        try:
            idle_since = time.monotonic()
            while True:
                stopping = stop.is_set()  # read before the last pass, so it sees every line
                before = self.sent
                await self.publish(tail.complete_lines())
                await self.sender.flush()
                now = time.monotonic()
                if self.sent > before:
                    idle_since = now
                if stopping or now - idle_since >= idle_timeout:
                    if tail.partial:
                        log.warning(
                            "not published: the incomplete last line %d of %s",
                            tail.lineno + 1,
                            self.path,
                        )
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_SECONDS)
        finally:
            tail.close()


class _Tail:
    """Complete lines appended to a file, starting over when it is truncated or replaced.

    ``pos`` counts the bytes consumed (the held-back partial line included), so a size below it
    means truncation; a different inode at the path means rotation, and the old file is read
    to its end first. A truncation followed, before the next poll, by more bytes than were
    consumed is indistinguishable from appending (as for ``tail -F``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[bytes] | None = None
        self.inode, self.pos, self.lineno, self.partial = -1, 0, 0, b""
        self._open()

    def _open(self) -> None:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across polls, closed in close()
        except FileNotFoundError:
            return  # between a rename and the new file's creation: wait for it
        except OSError as exc:
            raise InputError(f"Cannot read '{self.path}': {exc.strerror or exc}") from None
        self.fh, self.inode = fh, os.fstat(fh.fileno()).st_ino
        self.pos, self.lineno, self.partial = 0, 0, b""

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def complete_lines(self) -> Iterator[tuple[int, bytes]]:
        """Every complete line available now, with its 1-based line number."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if self.fh is None or st is None or st.st_ino != self.inode:
            yield from self._drain()  # the rotated-away file may have grown since last time
            if st is not None:
                self.close()
                self._open()
        elif st.st_size < self.pos:
            self.fh.seek(0)
            self.pos, self.lineno, self.partial = 0, 0, b""
        yield from self._drain()

    def _drain(self) -> Iterator[tuple[int, bytes]]:
        while self.fh is not None:
            chunk = self.fh.read(_CHUNK)
            if not chunk:
                return
            self.pos += len(chunk)
            data = self.partial + chunk if self.partial else chunk
            end = data.rfind(b"\n") + 1
            self.partial = data[end:]
            start = 0
            while start < end:
                nl = data.index(b"\n", start) + 1
                self.lineno += 1
                yield self.lineno, data[start:nl]
                start = nl
