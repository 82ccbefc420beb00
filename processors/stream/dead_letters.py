"""Dead letters (``<prefix>.dead-letters``): every event the engine rejects is parked with its
original bytes and reason before any commit covers its offset, so none is dropped silently.
Foreign rollouts and events a final left behind are read again by offset to be parked."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import MessageSizeTooLargeError

from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.engine.pipeline import Late, Pipeline, Rejected, Stray, log_level
from rewardstream.processors.stream.units import Units
from rewardstream.sinks.topics.profiles import reader

__all__ = ["DEAD_LETTER_CUT", "KILL_AFTER_PARK", "DeadLetters"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

DEAD_LETTER_CUT = 64 << 10  # what is kept of a dead letter too large to park whole
KILL_AFTER_PARK = "REWARDSTREAM_TEST_KILL_AFTER_PARK"  # test hook (see park_strays)


class DeadLetters:
    """Owns the rejected events waiting to be parked (each named by its ``source``,
    ``topic:partition:offset``), their sending with the processor's producer, and the reading
    again of a unit's records to park strays and late events. While any of it is pending no
    commit may be made (:attr:`pending`): dead letters are at least once."""

    def __init__(
        self,
        pipeline: Pipeline,
        units: Units,
        topic: str,
        bootstrap: str,
        security: KafkaSecurity,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.pipeline, self.units, self.topic = pipeline, units, topic
        self.bootstrap, self.security, self.spawn = bootstrap, security, spawn
        self.rejected: list[tuple[Rejected, str]] = []  # with "topic:partition:offset"
        self._parking = 0  # dead letters sent but not yet acknowledged
        self._reading = 0  # units being read again for events to park

    @property
    def pending(self) -> bool:
        """Rejected events wait to be parked or acknowledged, or to be read again: a commit now
        could move past them (a restart must meet them again)."""
        return bool(self.rejected or self._parking or self._reading or self.pipeline.strays)

    def take(self, topic: str, partition: int) -> None:
        """The events the engine rejected, handed from ``topic``'s ``partition``: each to be
        parked, named by its ``topic:partition:offset``."""
        for rejected in self.pipeline.take_rejected():
            at = rejected.offset
            source = f"{topic}:{partition}:{at}" if at is not None else ""
            log.log(
                log_level(rejected.reason),
                "dead letter from %s (%s event, %s): %s",
                source,
                rejected.kind,
                rejected.reason,
                rejected.detail,
            )
            self.rejected.append((rejected, source))

    async def send(self, producer: AIOKafkaProducer) -> None:
        """Park rejected events, original bytes and reason, before their offsets are saved.

        An event too large for the producer or the dead-letter topic is parked as its first
        :data:`DEAD_LETTER_CUT` bytes, with its full length in a ``size`` header. A failure to
        park raises: the offsets are not saved, so a restarted processor parks them again.
        """
        rejected, self.rejected = self.rejected, []
        self._parking += len(rejected)  # until delivered: no commit may cover them
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
        """Send one dead letter (cut short unless ``whole``); returns its delivery. Its key is
        its ``source`` (``topic:partition:offset``, empty for none): dead letters are at least
        once (a crash before the commit that covers them parks them again), and a copy has
        the same key, in the same partition, so readers count each source once (a compacted
        dead-letter topic keeps one)."""
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
            self.topic, value, key=at.encode() or None, headers=headers
        )
        return delivery

    async def _read_again(
        self, unit: str, start: int, end: int, pick: Callable[[ConsumerRecord], None]
    ) -> None:
        """Read a unit's records in offsets [``start``, ``end``) again, handing each to ``pick``;
        what the engine rejects meanwhile is parked as from there."""
        tp = self.units.tp(unit)
        consumer = reader(self.bootstrap, self.security)
        try:
            await start_client(consumer, self.bootstrap, self.security)
            consumer.assign([tp])
            consumer.seek(tp, start)
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                    if record.offset >= end:
                        break
                    pick(record)
                    self.take(record.topic, record.partition)
        finally:
            await consumer.stop()

    async def park_strays(self, producer: AIOKafkaProducer) -> set[str]:
        """Park the rollouts the engine found foreign (``unknown-key``), read again by offset;
        returns their units, for the caller to commit at once: the commit's metadata keeps
        their offsets (:attr:`~rewardstream.processors.engine.runs.Unit.parked`), so a replay
        parks none again.

        A crash between the dead letters' acknowledgement and that commit (or more parked
        ranges than a commit keeps) parks one again on replay: a copy, recognisable as such,
        for a dead letter is keyed by its ``source`` (see :meth:`_park`). The environment
        variable :data:`KILL_AFTER_PARK`, set, makes the processor SIGKILL itself in that
        window: a test hook, nothing else reads it."""
        strays, self.pipeline.strays = self.pipeline.strays, []
        by_unit: dict[str, dict[int, Stray]] = {}
        for stray in strays:
            by_unit.setdefault(stray.unit, {})[stray.offset] = stray
        self._reading += 1  # no commit until they are parked
        try:
            for unit, found in by_unit.items():
                pick = functools.partial(self._stray_at, found)
                await self._read_again(unit, min(found), max(found) + 1, pick)
            await self.send(producer)
        finally:
            self._reading -= 1
        if os.environ.get(KILL_AFTER_PARK):  # test hook: a crash in the window (see above)
            os.kill(os.getpid(), signal.SIGKILL)
        return set(by_unit)

    def _stray_at(self, found: dict[int, Stray], record: ConsumerRecord) -> None:
        stray = found.get(record.offset)
        if stray is not None:
            self.pipeline.reject_stray(stray, record.value or b"")

    def park_late(self, late: Late) -> None:
        """Park, in the background, the events of a finished run a unit folded past the
        final's cut; no commit until they are read again (see :meth:`_park_late`)."""
        self._reading += 1  # until parked: no commit may move past these events
        self.spawn(self._park_late(late))

    async def _park_late(self, late: Late) -> None:
        """Read a unit again from the final's cut to where it was, and reject every event of
        the run found there: they came too late for the final, and none is dropped silently."""
        kind, found = self.units.kinds[self.units.tp(late.unit).topic], 0

        def pick(record: ConsumerRecord) -> None:
            nonlocal found
            if _run_of(record.value or b"") == late.run_id:
                self.pipeline.reject_late(kind, record.value or b"", late.run_id, record.offset)
                found += 1

        try:
            await self._read_again(late.unit, late.cut, late.position, pick)
        finally:
            self._reading -= 1
        log.warning(
            "run %s: %d events in %s [%d, %d) came after its final profile; parked (%d expected)",
            late.run_id,
            found,
            late.unit,
            late.cut,
            late.position,
            late.events,
        )


def _run_of(raw: bytes) -> str | None:
    """An event's run id, or None when it has none (such an event was rejected already)."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    run_id = event.get("run_id") if isinstance(event, dict) else None
    return run_id if isinstance(run_id, str) else None
