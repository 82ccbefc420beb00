"""Where a running collection sends its events as they happen: Kafka, or an in-process pipeline.

The collector produces the wire events itself (:mod:`rewardstream.producers.events`, the same
encoders as ``rewardstream publish``), in the publisher's order: every materialized row,
``RunStarted``, each rollout as it completes, ``RunFinished``. A sink only transports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rewardstream.contract.events import EventKind, Topics
from rewardstream.errors import InputError
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.producers.publisher.lines import MAX_MESSAGE_BYTES, MessageLimit
from rewardstream.producers.publisher.publish import Sender, message_limits
from rewardstream.sinks.topics.profiles import ensure_topics

__all__ = ["EventSink", "KafkaSink"]


# what is kept of an event parked whole (as rewardstream.processors.stream does)
DEAD_LETTER_CUT = 64 << 10


class EventSink(Protocol):
    error: str | None  # why the sink stopped sending, when it did (the collection goes on)

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        """Queue one event (``where``: its file and line, for messages); False when it cannot
        be delivered to its topic. It must not block the collection for long."""

    async def close(self, finished: bool) -> None:
        """Deliver what was queued; ``finished`` is False after a failed collection."""


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)


class KafkaSink:
    """Publishes to the contract's topics with an idempotent producer, keyed as the publisher.

    One task owns the batching :class:`~rewardstream.producers.publisher.publish.Sender`; it hands
    over partly filled batches whenever it has caught up, so at a collection's pace every rollout
    leaves at once, and at a burst's pace batches fill.

    It is a side channel: nothing it meets stops the collection. An event larger than its
    topic's ``max.message.bytes`` (read from the broker at :meth:`start`) is never sent there
    (the broker would refuse its batch, and the idempotent producer could send nothing more
    to that partition): it is parked on the dead-letter topic as the stream processor parks
    its own "oversized" events (headers ``reason``, ``kind``, ``source`` = file:line,
    ``detail``, and ``size`` when cut to :data:`DEAD_LETTER_CUT` bytes), with a warning, and
    :meth:`send` returns False. Any other publishing failure stops publishing, with a warning,
    and sets :attr:`error`.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        security: KafkaSecurity | None = None,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security or KafkaSecurity.from_env()  # SASL/TLS settings
        self.warn = warn
        self.error: str | None = None
        self.topics, self.dead_letters = topics, topics.dead_letters
        self._topic: dict[EventKind, str] = {
            "input": topics.inputs,
            "rollout": topics.rollouts,
            "control": topics.control,
        }
        self._limits: dict[str, MessageLimit] = {}
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            linger_ms=5,
            max_request_size=MAX_MESSAGE_BYTES,
            **self.security.client_kwargs(),
        )
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> KafkaSink:
        await start_client(self._producer, self.bootstrap, self.security)
        try:
            await ensure_topics(self.bootstrap, self.security, self.topics, "publisher")
            topics = list(self._topic.values())
            self._limits = await message_limits(
                self._producer, self.bootstrap, self.security, topics
            )
        except BaseException:
            await self._producer.stop()
            raise
        self._pump = asyncio.create_task(self._run(Sender(self._producer)))
        return self

    async def _run(self, sender: Sender) -> None:
        queue = self._queue
        parked: list[asyncio.Future[object]] = []
        try:
            while (item := await queue.get()) is not None:
                topic, key, value, headers = item
                if headers:  # a dead letter: alone, not in the data topics' batches
                    parked.append(await self._producer.send(topic, value, key, headers=headers))
                    continue
                if topic == self._topic["control"]:  # after everything before it is in the log:
                    await sender.settle()  # run_finished marks where the log ends for the run
                await sender.send(topic, value, key)
                if queue.empty():
                    await sender.flush()
            await sender.settle()
        finally:
            for failed in await asyncio.gather(*parked, return_exceptions=True):
                if isinstance(failed, BaseException):
                    self.warn(
                        f"a dead letter could not be parked on {self.dead_letters}: {failed!r}"
                    )

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        if self.error is not None:
            return False
        if self._pump is not None and self._pump.done():
            self._stopped(self._pump)
            return False
        topic = self._topic[kind]
        limit = self._limits.get(topic) or MessageLimit(topic)
        if len(key) + len(value) > limit.room:
            self._park(kind, key, value, where, limit)
            return False
        self._queue.put_nowait((topic, key, value, None))
        return True

    def _park(
        self, kind: EventKind, key: bytes, value: bytes, where: str, limit: MessageLimit
    ) -> None:
        """Queue ``value`` as a dead letter instead of sending it to ``limit.topic``."""
        detail = limit.refusal(len(value)).removeprefix("its event is ")
        headers = [
            ("reason", b"oversized"),
            ("kind", kind.encode()),
            ("source", where.encode()),
            ("detail", detail.encode()),
        ]
        size = len(value)
        if size > DEAD_LETTER_CUT:
            headers.append(("size", b"%d" % size))
            value = value[:DEAD_LETTER_CUT]
        self._queue.put_nowait((self.dead_letters, key, value, headers))
        self.warn(
            f"{where or 'an event'}: {limit.refusal(size).replace('event', f'{kind} event', 1)}:"
            f" parked on {self.dead_letters} instead; the streamed profile leaves it out"
        )

    def _stopped(self, pump: asyncio.Task[None]) -> None:
        """Publishing failed: say so once and send nothing more (the collection goes on)."""
        if self.error is None:
            exc = None if pump.cancelled() else pump.exception()
            self.error = str(exc) if exc is not None else "the publishing task stopped"
            self.warn(
                f"live publishing to Kafka at {self.bootstrap} stopped: {self.error}; the "
                "collection goes on (its files can be published later: rewardstream publish)"
            )

    async def close(self, finished: bool) -> None:
        """Wait until the broker has everything (also after a failure: what was queued goes)."""
        self._queue.put_nowait(None)
        try:
            if self._pump is not None:
                with contextlib.suppress(KafkaError, InputError):
                    await self._pump
                if self._pump.done() and (self._pump.cancelled() or self._pump.exception()):
                    self._stopped(self._pump)
        finally:
            await self._producer.stop()


_Item = tuple[str, bytes, bytes, list[tuple[str, bytes]] | None]  # (topic, key, value, headers)
