"""Where a running collection sends its events as they happen: Kafka, or an in-process pipeline.

The collector produces the wire events itself (:mod:`producers.events`, the same encoders as
``rewardstream publish``), in the publisher's order: every materialized row, ``RunStarted``,
each rollout as it completes, ``RunFinished``. A sink only transports them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from processors.inprocess import finish
from processors.pipeline import EventKind, Pipeline, Rejected
from processors.runs import Run
from producers.lines import MAX_MESSAGE_BYTES
from producers.publish import Sender
from rewardstream.contract import Topics
from rewardstream.errors import InputError
from rewardstream.kafka_config import KafkaSecurity, start_client
from sinks.files import ProfilePaths

__all__ = ["EventSink", "KafkaSink", "PipelineSink"]


class EventSink(Protocol):
    async def send(self, kind: EventKind, key: bytes, value: bytes) -> None:
        """Queue one event; it must not block the collection for long."""

    async def close(self, finished: bool) -> None:
        """Deliver what was queued; ``finished`` is False after a failed collection."""


class KafkaSink:
    """Publishes to the contract's topics with an idempotent producer, keyed as the publisher.

    One task owns the batching :class:`~producers.publish.Sender`; it hands over partly filled
    batches whenever it has caught up, so at a collection's pace every rollout leaves at once,
    and at a burst's pace batches fill.
    """

    def __init__(
        self, bootstrap: str, topics: Topics, security: KafkaSecurity | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security or KafkaSecurity.from_env()  # SASL/TLS settings
        self._topic: dict[EventKind, str] = {
            "input": topics.inputs,
            "rollout": topics.rollouts,
            "control": topics.control,
        }
        self._queue: asyncio.Queue[tuple[str, bytes, bytes] | None] = asyncio.Queue()
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
        self._pump = asyncio.create_task(self._run(Sender(self._producer)))
        return self

    async def _run(self, sender: Sender) -> None:
        queue = self._queue
        while (item := await queue.get()) is not None:
            topic, key, value = item
            if topic == self._topic["control"]:  # after everything before it is in the log:
                await sender.settle()  # run_finished marks where the log ends for the run
            await sender.send(topic, value, key)
            if queue.empty():
                await sender.flush()
        await sender.settle()

    async def send(self, kind: EventKind, key: bytes, value: bytes) -> None:
        if self._pump is not None and self._pump.done():
            await self._pump  # raises the publishing error
        self._queue.put_nowait((self._topic[kind], key, value))

    async def close(self, finished: bool) -> None:
        """Wait until the broker has everything (also after a failure: what was queued goes)."""
        self._queue.put_nowait(None)
        try:
            if self._pump is not None:
                if finished:
                    await self._pump
                else:
                    with contextlib.suppress(KafkaError, InputError):
                        await self._pump
        finally:
            await self._producer.stop()


class PipelineSink:
    """Feeds the in-process :class:`Pipeline` (the embedded transport: no broker)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.run: Run | None = None
        self.paths: ProfilePaths | None = None
        self.rejected: list[Rejected] = []
        pipeline.on_reject = self.rejected.append

    async def send(self, kind: EventKind, key: bytes, value: bytes) -> None:
        self.run = self.pipeline.handle(kind, value) or self.run
        if self.rejected:
            first = self.rejected[0]
            raise InputError(f"event rejected by the pipeline ({first.reason}): {first.detail}")

    async def close(self, finished: bool) -> None:
        if finished and self.run is not None:
            self.paths = finish(self.pipeline, self.run)
            if self.paths is None:
                raise InputError(f"run {self.run.run_id}: no profile written: {self.run.error}")
