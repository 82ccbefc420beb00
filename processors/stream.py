"""``rewardstream stream``: the Kafka stream processor (an aiokafka consumer group).

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(README, issue 2), so the processor is a plain aiokafka consumer feeding the shared
:class:`processors.pipeline.Pipeline`. Offsets are not committed yet: a restarted processor
replays the topics from the start, and deduplication by (run, task, rollout) makes the replay
count every rollout once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from processors.http import make_app, serve
from processors.pipeline import EventKind, Pipeline
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
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics or Topics.for_prefix()
        self.group_id = group_id or f"{self.topics.inputs.rsplit('.', 1)[0]}-profiler"
        self.metrics = Metrics(lambda: self.pipeline.runs, self.lag)
        self.pipeline = Pipeline(output_dir, metrics=self.metrics)
        self._consumer: AIOKafkaConsumer | None = None
        self._kinds: dict[str, EventKind] = {
            self.topics.inputs: "input",
            self.topics.rollouts: "rollout",
            self.topics.control: "control",
        }
        self.consumed = 0
        self.positions: dict[str, int] = {}  # "topic:partition" -> next offset to consume

    async def run(self, stop: asyncio.Event, http: tuple[str, int] | None = None) -> None:
        """Process until ``stop`` is set, serving snapshots on ``http`` (host, port) if given."""
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self.pipeline.close)
            if http is not None:
                app = make_app(self.pipeline, lambda: dict(self.positions), self.metrics.registry)
                runner = await serve(app, *http)
                stack.push_async_callback(runner.cleanup)
            consumer = AIOKafkaConsumer(
                *self._kinds,
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=8 << 20,
            )
            await consumer.start()
            stack.push_async_callback(consumer.stop)
            self._consumer = consumer
            await self._consume(consumer, stop)

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

    async def _consume(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=20_000)
            touched = {}
            for tp, records in batch.items():
                kind = self._kinds[tp.topic]
                for record in records:
                    tracker = self.pipeline.handle(kind, record.value or b"")
                    if tracker is not None:
                        touched[tracker.run_id] = tracker
                self.consumed += len(records)
                if records:
                    self.positions[f"{tp.topic}:{tp.partition}"] = records[-1].offset + 1
            for tracker in touched.values():
                self.pipeline.maybe_finish(tracker)
