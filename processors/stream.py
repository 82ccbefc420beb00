"""``rewardstream stream``: the Kafka stream processor (an aiokafka consumer group).

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(README, issue 2), so the processor is a plain aiokafka consumer feeding the shared
:class:`processors.pipeline.Pipeline`. Offsets are not committed yet: a restarted processor
replays the topics from the start, and deduplication by (run, task, rollout) makes the replay
count every rollout once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from processors.pipeline import EventKind, Pipeline
from rewardstream.contract import Topics

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
        self.pipeline = Pipeline(output_dir)
        self._kinds: dict[str, EventKind] = {
            self.topics.inputs: "input",
            self.topics.rollouts: "rollout",
            self.topics.control: "control",
        }
        self.consumed = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Process until ``stop`` is set."""
        consumer = AIOKafkaConsumer(
            *self._kinds,
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 << 20,
        )
        await consumer.start()
        try:
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
                for tracker in touched.values():
                    self.pipeline.maybe_finish(tracker)
        finally:
            await consumer.stop()
