"""``rewardstream stream``: the Kafka stream processor (an aiokafka consumer group).

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(README, issue 2), so the processor is a plain aiokafka consumer feeding the shared
:class:`processors.pipeline.Pipeline`.

- Data (inputs and rollouts topics) is consumed in a consumer group with the range assignor, so
  N processors split the partitions and partition ``p`` of both topics (the same tasks: both
  are keyed by task) goes to the same processor. Each partition is a *unit* with its own
  checkpoint in the shared ``<output-dir>/.checkpoint`` (every few seconds, when idle, and on
  revocation); the next owner resumes it there, even after ``kill -9``, and deduplication by
  (run, task, rollout) drops what the replay after the checkpoint delivers again.
- Control events are read by every processor, from the start, outside the group: all of them
  know every run. The owner of ``rollout-0`` (the leader) writes final profiles, merging the
  other units' parts from their checkpoints once their manifests say the run is complete, or,
  after "finished", once every unit has been consumed to where the log ended then.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import MessageSizeTooLargeError

from processors.checkpoint import CheckpointStore
from processors.http import make_app, serve
from processors.pipeline import EventKind, Pipeline, Rejected
from processors.runs import Run, Unit
from rewardstream.contract import Topics
from rewardstream.kafka_config import KafkaSecurity, start_client
from sinks.metrics import Metrics

__all__ = ["MAX_EVENT_BYTES", "StreamProcessor"]

log = logging.getLogger(__name__)

_PEERS_EVERY = 0.5  # seconds between reads of the peers' manifests
_BATCH = 10_000  # records per fetched batch
_SLICE = 2_000  # records applied between two chances for the fetcher to run
_GC_YOUNG = 50_000  # allocations between young collections while processing (CPython: 700)
MAX_EVENT_BYTES = 1 << 20  # larger events are dead letters ("oversized"), never parsed
DEAD_LETTER_CUT = 64 << 10  # what is kept of a dead letter too large to park whole

Batch = dict[TopicPartition, list[ConsumerRecord]]


class StreamProcessor:
    """Consume inputs, rollouts and control events; write each run's final profile."""

    def __init__(
        self,
        bootstrap: str,
        output_dir: Path,
        topics: Topics | None = None,
        group_id: str | None = None,
        checkpoint_every: float = 5.0,
        security: KafkaSecurity | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security or KafkaSecurity.from_env()  # SASL/TLS for every client
        self.topics = topics or Topics.for_prefix()
        self.group_id = group_id or f"{self.topics.inputs.rsplit('.', 1)[0]}-profiler"
        self.store = CheckpointStore(output_dir / ".checkpoint")
        self.metrics = Metrics(lambda: self.pipeline.runs, self.lag)
        self.pipeline = Pipeline(
            output_dir,
            on_reject=self._reject,
            metrics=self.metrics,
            peers=self.store,
            max_event_bytes=max_event_bytes,
        )
        self._rejected: list[tuple[Rejected, str]] = []  # with "topic:partition:offset"
        self._parking = 0  # dead letters sent but not yet acknowledged
        self._at: ConsumerRecord | None = None  # the record being handled, for dead letters
        self._data: AIOKafkaConsumer | None = None
        self._kinds: dict[str, EventKind] = {
            self.topics.inputs: "input",
            self.topics.rollouts: "rollout",
        }
        self.consumed = 0
        self._generation = 0  # assignments so far: batches fetched under an older one are stale
        self.assigned_at: float | None = None  # time.monotonic() of the last partition assignment
        self.checkpoint_every = checkpoint_every

    def unit_name(self, tp: TopicPartition) -> str:
        return f"{self._kinds[tp.topic]}-{tp.partition}"

    async def run(self, stop: asyncio.Event, http: tuple[str, int] | None = None) -> None:
        """Process until ``stop`` is set, serving snapshots on ``http`` (host, port) if given."""
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(_young_collections(_GC_YOUNG))
            stack.callback(self.pipeline.close)
            if http is not None:
                runner = await serve(make_app(self.pipeline, self.metrics.registry), *http)
                stack.push_async_callback(runner.cleanup)
            secure = self.security.client_kwargs()
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, enable_idempotence=True, **secure
            )
            await start_client(producer, self.bootstrap, self.security)
            stack.push_async_callback(producer.stop)
            control = AIOKafkaConsumer(
                self.topics.control,
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **secure,
            )
            await start_client(control, self.bootstrap, self.security)
            stack.push_async_callback(control.stop)
            data = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                **secure,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=8 << 20,
                partition_assignment_strategy=(RangePartitionAssignor,),
            )
            data.subscribe(list(self._kinds), listener=_Rebalance(self, data))
            await start_client(data, self.bootstrap, self.security)
            stack.push_async_callback(data.stop)
            stack.callback(self.save_checkpoint)
            self._data = data
            fetched: asyncio.Queue[tuple[int, Batch]] = asyncio.Queue(maxsize=1)
            loops = [
                asyncio.create_task(self._fetch(data, fetched)),
                asyncio.create_task(self._consume(fetched, producer, stop)),
                asyncio.create_task(self._control(control, producer, stop)),
            ]
            try:
                await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for task in loops:  # a loop that failed raises here
                    if task.done():
                        task.result()
            finally:
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)

    def lag(self) -> dict[str, int]:
        """Messages between this processor's position and the log end, per partition."""
        consumer = self._data
        if consumer is None:
            return {}
        out = {}
        for tp in consumer.assignment():
            end, unit = consumer.highwater(tp), self.pipeline.units.get(self.unit_name(tp))
            if end is not None and unit is not None:
                out[f"{tp.topic}:{tp.partition}"] = max(0, end - unit.position)
        return out

    def save_checkpoint(self) -> None:
        """Checkpoint every owned unit that changed since its last checkpoint; not while
        rejected events wait to be parked (a restart must meet them again)."""
        if self._rejected or self._parking:
            return
        for unit in self.pipeline.units.values():
            if unit.dirty:
                self.store.save(unit)

    def _reject(self, rejected: Rejected) -> None:
        at = self._at
        source = f"{at.topic}:{at.partition}:{at.offset}" if at is not None else ""
        log.warning(
            "dead letter from %s (%s event, %s): %s",
            source,
            rejected.kind,
            rejected.reason,
            rejected.detail,
        )
        self._rejected.append((rejected, source))

    async def _dead_letters(self, producer: AIOKafkaProducer) -> None:
        """Park rejected events, original bytes and reason, before their offsets are saved.

        An event too large for the producer or the dead-letter topic is parked as its first
        :data:`DEAD_LETTER_CUT` bytes, with its full length in a ``size`` header. A failure to
        park raises: the offsets are not saved, so a restarted processor parks them again.
        """
        rejected, self._rejected = self._rejected, []
        self._parking += len(rejected)  # until delivered: no checkpoint may cover them
        sent = []
        for event, at in rejected:
            try:
                delivery = await self._park(producer, event, at, whole=True)
            except MessageSizeTooLargeError:  # above the producer's max_request_size
                delivery = await self._park(producer, event, at, whole=False)
            sent.append((event, at, delivery))
        for event, at, delivery in sent:
            try:
                await delivery
            except MessageSizeTooLargeError:  # above the topic's max.message.bytes
                await (await self._park(producer, event, at, whole=False))
        self._parking -= len(rejected)

    async def _park(
        self, producer: AIOKafkaProducer, event: Rejected, at: str, whole: bool
    ) -> asyncio.Future[object]:
        """Send one dead letter (cut short unless ``whole``); returns its delivery."""
        headers = [
            ("reason", event.reason.encode()),
            ("kind", event.kind.encode()),
            ("source", at.encode()),
            ("detail", event.detail.encode()),
        ]
        value = event.raw
        if not whole and len(value) > DEAD_LETTER_CUT:
            value = value[:DEAD_LETTER_CUT]
            headers.append(("size", b"%d" % len(event.raw)))
        delivery: asyncio.Future[object] = await producer.send(
            self.topics.dead_letters, value, headers=headers
        )
        return delivery

    def data_partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Every partition of the inputs and rollouts topics, as far as ``consumer`` knows."""
        return [
            TopicPartition(topic, p)
            for topic in self._kinds
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]

    async def _end_offsets(self) -> dict[str, int] | None:
        """The log end offset of every data partition, by unit name; None while the consumer
        has no metadata for a data topic yet (just after a start): a partial answer would let
        a finished run end before the other partitions' data is consumed."""
        assert self._data is not None
        if any(self._data.partitions_for_topic(topic) is None for topic in self._kinds):
            return None
        ends = await self._data.end_offsets(self.data_partitions(self._data))
        return {self.unit_name(tp): end for tp, end in ends.items()}

    async def _control(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            if not batch:
                continue
            ends = await self._end_offsets()  # fetched after the records: covers what preceded
            for records in batch.values():
                for record in records:
                    self._at = record
                    run = self.pipeline.handle("control", record.value or b"")
                    if run is not None:
                        if run.finished and not run.finish_at:
                            run.finish_at = ends
                        self.pipeline.maybe_finish(run)
            if self._rejected:
                await self._dead_letters(producer)

    async def _fetch(
        self, consumer: AIOKafkaConsumer, out: asyncio.Queue[tuple[int, Batch]]
    ) -> None:
        """Fetch the next batch while the current one is applied (the queue holds one), tagged
        with the assignment generation it was fetched in."""
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=_BATCH)
            await out.put((self._generation, batch))

    async def _consume(
        self,
        fetched: asyncio.Queue[tuple[int, Batch]],
        producer: AIOKafkaProducer,
        stop: asyncio.Event,
    ) -> None:
        last_save = last_peers = time.monotonic()
        while not stop.is_set():
            generation, batch = await fetched.get()
            if generation != self._generation:  # fetched before a rebalance: positions moved
                continue
            touched: dict[str, Run] = {}
            for tp, records in batch.items():
                await self._apply(tp, records, touched)
            now = time.monotonic()
            if self.pipeline.peer_units and now - last_peers >= _PEERS_EVERY:
                self.pipeline.refresh_peers()
                last_peers = now
                touched |= {r.run_id: r for r in self.pipeline.runs.values() if not r.done}
            touched |= {r.run_id: r for r in self.pipeline.runs.values() if r.finished}
            for run in touched.values():
                if run.finished and run.finish_at is None:  # ends unknown when it was read
                    run.finish_at = await self._end_offsets()
                self.pipeline.maybe_finish(run)
            if self._rejected:
                await self._dead_letters(producer)
            if not batch or now - last_save >= self.checkpoint_every:
                self.save_checkpoint()  # when idle too, so peers see a finished share at once
                last_save = now

    async def _apply(
        self, tp: TopicPartition, records: list[ConsumerRecord], touched: dict[str, Run]
    ) -> None:
        """Apply one partition's records, a slice at a time: between slices the fetcher (and a
        rebalance) may run; a unit revoked meanwhile is left, from the record it stopped at."""
        name, kind = self.unit_name(tp), self._kinds[tp.topic]
        for start in range(0, len(records), _SLICE):
            unit = self.pipeline.units.get(name)
            if unit is None:
                return
            part = records[start : start + _SLICE]
            runs = None
            if kind == "rollout":
                runs = self.pipeline.handle_rollouts([r.value or b"" for r in part], name)
            if runs is None:  # inputs, or a slice with an event to reject (named by self._at)
                runs = []
                for record in part:
                    self._at = record
                    run = self.pipeline.handle(kind, record.value or b"", name)
                    if run is not None:
                        runs.append(run)
            touched |= {run.run_id: run for run in runs}
            self.consumed += len(part)
            unit.position = part[-1].offset + 1
            unit.dirty = True
            await asyncio.sleep(0)


@contextlib.contextmanager
def _young_collections(threshold: int) -> Iterator[None]:
    """Collect the youngest generation every ``threshold`` allocations instead of 700.

    A fetched batch keeps ~10 objects per record alive while it is applied (aiokafka's
    records, decoded events); with CPython's default they survive young collections and drive
    full ones, which scan the whole heap: ~3 us of the ~13 us a rollout cost (BENCHMARKS.md).
    Cycles are still collected, just later.
    """
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Units follow their partitions: checkpointed when revoked, resumed when assigned."""

    def __init__(self, processor: StreamProcessor, consumer: AIOKafkaConsumer) -> None:
        self.processor, self.consumer = processor, consumer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pipeline, store = self.processor.pipeline, self.processor.store
        self.processor._generation += 1
        for tp in revoked:
            unit = pipeline.units.get(self.processor.unit_name(tp))
            if unit is not None:
                if unit.dirty:
                    store.save(unit)
                pipeline.release(unit.name)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        processor, pipeline = self.processor, self.processor.pipeline
        processor.assigned_at = time.monotonic()
        processor._generation += 1
        for tp in assigned:
            name = processor.unit_name(tp)
            if name in pipeline.units:
                continue
            unit = processor.store.load(name) or Unit(name, pipeline.output_dir)
            pipeline.adopt(unit)
            if unit.position:
                self.consumer.seek(tp, unit.position)
        owned = {processor.unit_name(tp) for tp in assigned}
        every = {processor.unit_name(tp) for tp in processor.data_partitions(self.consumer)}
        pipeline.leader = "rollout-0" in owned or not every - owned
        pipeline.set_peer_units(every - owned)
        log.info("assigned %s; leader=%s", sorted(owned), pipeline.leader)
