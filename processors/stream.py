"""``rewardstream stream``: the Kafka stream processor (an aiokafka consumer group).

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(README, issue 2), so the processor is a plain aiokafka consumer feeding the shared
:class:`processors.pipeline.Pipeline`. Every few seconds it checkpoints its runs with the
offsets they cover (:mod:`processors.checkpoint`); a restarted processor (even after
``kill -9``) resumes from there, and deduplication by (run, task, rollout) drops what the
replay after the checkpoint delivers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from processors import checkpoint
from processors.http import make_app, serve
from processors.pipeline import EventKind, Pipeline, Rejected
from rewardstream.contract import Topics
from sinks.metrics import Metrics

__all__ = ["StreamProcessor"]

log = logging.getLogger(__name__)


class StreamProcessor:
    """Consume inputs, rollouts and control events; write each run's final profile."""

    def __init__(
        self,
        bootstrap: str,
        output_dir: Path,
        topics: Topics | None = None,
        group_id: str | None = None,
        checkpoint_every: float = 5.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics or Topics.for_prefix()
        self.group_id = group_id or f"{self.topics.inputs.rsplit('.', 1)[0]}-profiler"
        self.metrics = Metrics(lambda: self.pipeline.runs, self.lag)
        self.pipeline = Pipeline(output_dir, on_reject=self._reject, metrics=self.metrics)
        self._rejected: list[tuple[Rejected, str]] = []  # with "topic:partition:offset"
        self._at = ""  # the record being handled, for dead letters
        self._consumer: AIOKafkaConsumer | None = None
        self._kinds: dict[str, EventKind] = {
            self.topics.inputs: "input",
            self.topics.rollouts: "rollout",
            self.topics.control: "control",
        }
        self.consumed = 0
        self.positions: dict[str, int] = {}  # "topic:partition" -> next offset to consume
        self.assigned_at: float | None = None  # time.monotonic() of the last partition assignment
        self.checkpoint_dir = output_dir / ".checkpoint"
        self.checkpoint_every = checkpoint_every
        restored = checkpoint.load(self.checkpoint_dir)
        if restored is not None:
            self.pipeline.runs, self.positions = restored.runs, dict(restored.positions)
            log.info(
                "resumed from checkpoint: %d runs, offsets %s",
                len(restored.runs),
                restored.positions,
            )

    async def run(self, stop: asyncio.Event, http: tuple[str, int] | None = None) -> None:
        """Process until ``stop`` is set, serving snapshots on ``http`` (host, port) if given."""
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self.pipeline.close)
            if http is not None:
                app = make_app(self.pipeline, lambda: dict(self.positions), self.metrics.registry)
                runner = await serve(app, *http)
                stack.push_async_callback(runner.cleanup)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=8 << 20,
            )
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True)
            await producer.start()
            stack.push_async_callback(producer.stop)
            consumer.subscribe(list(self._kinds), listener=_SeekToCheckpoint(self, consumer))
            await consumer.start()
            stack.push_async_callback(consumer.stop)
            stack.callback(self.save_checkpoint)
            self._consumer = consumer
            await self._consume(consumer, producer, stop)

    def lag(self) -> dict[str, int]:
        """Messages between this processor's position and the log end, per partition."""
        consumer = self._consumer
        if consumer is None:
            return {}
        out = {}
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is not None:
                done = self.positions.get(f"{tp.topic}:{tp.partition}", 0)
                out[f"{tp.topic}:{tp.partition}"] = max(0, end - done)
        return out

    def save_checkpoint(self) -> None:
        checkpoint.save(
            self.checkpoint_dir, checkpoint.Checkpoint(self.pipeline.runs, dict(self.positions))
        )

    def _reject(self, rejected: Rejected) -> None:
        log.warning("dead letter from %s (%s event): %s", self._at, rejected.kind, rejected.reason)
        self._rejected.append((rejected, self._at))

    async def _dead_letters(self, producer: AIOKafkaProducer) -> None:
        """Park rejected events, original bytes and reason, before their offsets are saved."""
        for rejected, at in self._rejected:
            headers = [
                ("reason", rejected.reason.encode()),
                ("kind", rejected.kind.encode()),
                ("source", at.encode()),
            ]
            await producer.send(self.topics.dead_letters, rejected.raw, headers=headers)
        self._rejected.clear()
        await producer.flush()

    async def _consume(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, stop: asyncio.Event
    ) -> None:
        last_save = time.monotonic()
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=20_000)
            touched = {}
            for tp, records in batch.items():
                kind = self._kinds[tp.topic]
                for record in records:
                    self._at = f"{tp.topic}:{tp.partition}:{record.offset}"
                    tracker = self.pipeline.handle(kind, record.value or b"")
                    if tracker is not None:
                        touched[tracker.run_id] = tracker
                self.consumed += len(records)
                if records:
                    self.positions[f"{tp.topic}:{tp.partition}"] = records[-1].offset + 1
            for tracker in touched.values():
                self.pipeline.maybe_finish(tracker)
            if self._rejected:
                await self._dead_letters(producer)
            if batch and time.monotonic() - last_save >= self.checkpoint_every:
                self.save_checkpoint()
                last_save = time.monotonic()


class _SeekToCheckpoint(ConsumerRebalanceListener):  # type: ignore[misc]
    """On assignment, start each partition where the checkpoint left it."""

    def __init__(self, processor: StreamProcessor, consumer: AIOKafkaConsumer) -> None:
        self.processor, self.consumer = processor, consumer

    async def on_partitions_revoked(self, revoked: object) -> None:
        return None

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.processor.assigned_at = time.monotonic()
        log.info("assigned %d partitions", len(assigned))
        for tp in assigned:
            offset = self.processor.positions.get(f"{tp.topic}:{tp.partition}")
            if offset is not None:
                self.consumer.seek(tp, offset)
