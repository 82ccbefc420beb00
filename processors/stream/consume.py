"""The consume loop: data in a consumer group (the range assignor gives partition ``p`` of both
data topics, the same tasks, to one processor), fetched one batch ahead and applied in slices;
control events read by every processor, from the start, outside the group."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)

from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.stream.commits import Commits
from rewardstream.processors.stream.dead_letters import DeadLetters
from rewardstream.processors.stream.decisions import Decisions
from rewardstream.processors.stream.eviction import Eviction
from rewardstream.processors.stream.finals import Finals
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.runtime import QuietStart
from rewardstream.processors.stream.tasks import Background
from rewardstream.processors.stream.units import Units

__all__ = ["Batch", "ConsumeLoop", "Rebalance"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

_BATCH = 10_000  # records per fetched batch
_SLICE = 2_000  # records applied between two chances for the fetcher to run

Batch = dict[TopicPartition, list[ConsumerRecord]]


class ConsumeLoop:
    """Owns the reading of the data and control topics: fetching (tagged with the assignment
    generation, so a batch fetched before a rebalance is dropped), handing slices to the engine,
    and after each batch what the engine left to do: park dead letters, publish early-stop
    decisions, start the runs ready to finish, commit and evict on their timers. Also each
    partition's lag, for ``/metrics``."""

    def __init__(
        self,
        pipeline: Pipeline,
        units: Units,
        membership: Membership,
        dead_letters: DeadLetters,
        commits: Commits,
        finals: Finals,
        eviction: Eviction,
        decisions: Decisions,
        background: Background,
    ) -> None:
        self.pipeline, self.units, self.membership = pipeline, units, membership
        self.dead_letters, self.commits, self.decisions = dead_letters, commits, decisions
        self.finals, self.eviction, self.background = finals, eviction, background
        self.generation = 0  # assignments so far: batches fetched under an older one are stale
        self.assigned_at: float | None = None  # time.monotonic() of the last partition assignment

    def lag(self) -> dict[str, int]:
        """Messages between this processor's position and the log end, per partition."""
        consumer = self.units.consumer
        if consumer is None:
            return {}
        out = {}
        for tp in consumer.assignment():
            end, unit = consumer.highwater(tp), self.pipeline.units.get(self.units.name(tp))
            if end is not None and unit is not None:
                out[f"{tp.topic}:{tp.partition}"] = max(0, end - unit.position)
        return out

    async def control(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            if not batch:
                continue
            ends = await self.units.ends()  # fetched after the records: covers what preceded
            for records in batch.values():
                for record in records:
                    value, at, stamp = record.value or b"", record.offset, record.timestamp
                    run = self.pipeline.handle("control", value, offset=at, timestamp=stamp)
                    self.dead_letters.take(record.topic, record.partition)
                    if run is not None and run.finished and not run.finish_at:
                        run.finish_at = ends
            if self.dead_letters.rejected:
                await self.dead_letters.send(producer)

    async def fetch(
        self, consumer: AIOKafkaConsumer, out: asyncio.Queue[tuple[int, Batch]]
    ) -> None:
        """Fetch the next batch while the current one is applied (the queue holds one), tagged
        with the assignment generation it was fetched in."""
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=_BATCH)
            await out.put((self.generation, batch))

    def current(self, generation: int) -> bool:
        """No rebalance since ``generation``: what was decided under it still holds."""
        return generation == self.generation

    async def consume(
        self,
        fetched: asyncio.Queue[tuple[int, Batch]],
        producer: AIOKafkaProducer,
        stop: asyncio.Event,
    ) -> None:
        now = time.monotonic()
        self.commits.start(now)
        self.eviction.start(now)
        while not stop.is_set():
            generation, batch = await fetched.get()
            if generation != self.generation:  # fetched before a rebalance: positions moved
                continue
            if self.commits.unplaced:
                await self.commits.place(functools.partial(self.current, generation))
            for tp, records in batch.items():
                await self._apply(tp, records, generation)
            if self.pipeline.strays:
                await self.commits.commit(await self.dead_letters.park_strays(producer), force=True)
            if self.dead_letters.rejected:
                await self.dead_letters.send(producer)
            await self.decisions.publish(producer)
            for run in list(self.pipeline.runs.values()):
                if run.terminal is not None:
                    continue
                if run.finished and run.finish_at is None:  # ends unknown when it was read
                    run.finish_at = await self.units.ends()
                if self.pipeline.ready(run) and run.run_id not in self.finals.finishing:
                    self.background.spawn(self.finals.maybe_finish(run))
            now = time.monotonic()
            await self.commits.checkpoint(now, idle=not batch)
            await self.eviction.tick(now)

    async def _apply(
        self, tp: TopicPartition, records: list[ConsumerRecord], generation: int
    ) -> None:
        """Apply one partition's records, a slice at a time: between slices the fetcher (and a
        rebalance) may run. After a rebalance (``generation`` moved) the rest is stale: the
        unit may be gone, or be a new one to rebuild from its committed offset, which records
        from the middle of the log must not reach."""
        name, kind = self.units.name(tp), self.units.kinds[tp.topic]
        for start in range(0, len(records), _SLICE):
            unit = self.pipeline.units.get(name)
            if unit is None or generation != self.generation:
                return
            part = [r for r in records[start : start + _SLICE] if r.offset >= unit.position]
            if not part:  # held already: a unit restored past them (Commits.place)
                continue
            raws, offsets = [r.value or b"" for r in part], [r.offset for r in part]
            self.pipeline.apply(kind, raws, name, offsets, [r.timestamp for r in part])
            self.dead_letters.take(tp.topic, tp.partition)
            unit.position = part[-1].offset + 1
            self.commits.moved.add(name)
            self.membership.changed = True
            await asyncio.sleep(0)


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Units follow their partitions: committed when revoked; kept when assigned back (their
    state is a fold of the log up to their position, whoever held them meanwhile), rebuilt
    from the committed offset when new."""

    def __init__(
        self, loop: ConsumeLoop, consumer: AIOKafkaConsumer, group_id: str, quiet: QuietStart
    ) -> None:
        self.loop, self.consumer, self.group_id, self.quiet = loop, consumer, group_id, quiet

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        loop, commits = self.loop, self.loop.commits
        loop.generation += 1
        names = {loop.units.name(tp) for tp in revoked}
        if await commits.commit(names, force=True) is False:
            # fenced: others may have consumed these partitions meanwhile, so this state of
            # them is stale; whatever comes back is rebuilt from what the group committed
            log.warning(
                "lost partitions %s while stopped past the session timeout: their state here "
                "is dropped and rebuilt from Kafka if they come back",
                sorted(names),
            )
            for name in names:
                loop.pipeline.release(name)
                commits.changelog.release(name)
                commits.moved.discard(name)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        loop, pipeline, units = self.loop, self.loop.pipeline, self.loop.units
        loop.assigned_at = time.monotonic()
        loop.generation += 1
        owned = {units.name(tp) for tp in assigned}
        for name in set(pipeline.units) - owned:
            pipeline.release(name)
            loop.commits.changelog.release(name)
            loop.commits.moved.discard(name)
        for tp in assigned:
            unit = pipeline.units.get(units.name(tp))
            if unit is not None and unit.position:
                self.consumer.seek(tp, unit.position)  # kept: go on from where it is
            else:
                pipeline.unit(units.name(tp))  # new: from the committed offset
                loop.commits.unplaced.add(units.name(tp))
        pipeline.leader = "rollout-0" in owned  # whoever owns every unit owns it too
        if (inputs := units.inputs()) is not None:
            pipeline.set_input_units(inputs)
        loop.membership.changed = True
        if not owned:
            counts = (len(self.consumer.partitions_for_topic(t) or ()) for t in units.kinds)
            log.warning(
                "this processor owns no partition: group %s has more members than the data "
                "topics have partitions (%d); it serves snapshots but folds nothing",
                self.group_id,
                max(counts),
            )
        log.info("assigned %s; leader=%s", sorted(owned), pipeline.leader)
        self.quiet.started = True
