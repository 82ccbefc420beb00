"""Checkpoints in Kafka: each owned unit's open parts written to ``<prefix>.checkpoints`` from
time to time, so that a new owner holds them again in bulk and replays only the log after them
(docs/engine-on-kafka.md §Reference engines: Kafka Streams' and Quix Streams' changelogs).

A checkpoint (:mod:`rewardstream.processors.engine.checkpoints`) is cut into records of at most
:data:`CHUNK_BYTES`, keyed ``<group>/<unit>/<id>/<chunk>`` with a fresh random id, and is used
only once every record is acknowledged. What a new owner restores is what the unit's committed
offset names (:class:`Named`, in the commit's metadata: the id, the position, the offset range
of its records, their count and CRC-32): a commit only the group's current member can make, so
a paused owner's late checkpoint is never restored, and one missing, cut short or damaged is
refused with a log line and the unit replayed from its committed offset, as without one.

When: a unit is due once its position moved, at most every :data:`EVERY` seconds and
:data:`COST` times what its last one took (so writing them takes at most ~5% of the time,
however large the state). A checkpoint superseded by a newer one named in a commit is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from rewardstream.contract.engine import CHUNK_BYTES
from rewardstream.errors import RewardstreamError
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.engine.checkpoints import (
    Checkpoint,
    CheckpointError,
    decode_unit,
    encode_unit,
    pieces,
)
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Part, Unit
from rewardstream.sinks.topics.profiles import reader

__all__ = ["COST", "EVERY", "Changelog", "Named"]

log = logging.getLogger(__package__)

EVERY = 10.0  # seconds between a unit's checkpoints, at least
COST = 20.0  # and this many times what its last one took (at most 5% of the time)
_WINDOW = 16  # records of a checkpoint in flight at once (8 MiB)
_FETCH_BYTES = 32 << 20  # bytes a restore's fetch asks for (the default 1 MiB: ~3x slower)
READ_TIMEOUT = 120.0  # seconds a new owner waits for a checkpoint's records, at most


class Named(NamedTuple):
    """A checkpoint written and acknowledged, as a commit's metadata names it."""

    id: str
    position: int
    at: int  # offset of its first record in the checkpoints topic
    end: int  # offset after its last
    chunks: int
    crc: int

    def meta(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def of(cls, meta: Any) -> Named | None:
        """The checkpoint a commit's metadata names; None when it names none (or is not
        one this processor wrote)."""
        if not isinstance(meta, dict) or set(meta) != set(cls._fields):
            return None
        values = [meta[f] for f in cls._fields]
        if not isinstance(values[0], str) or not all(type(v) is int for v in values[1:]):
            return None
        return cls(*values)


class Changelog:
    """Owns the checkpoints topic for this processor: which units are due one, writing them
    (with the processor's producer: :attr:`producer`, once started), reading one back for a
    new unit, and deleting those superseded."""

    def __init__(
        self, pipeline: Pipeline, topic: str, group: str, bootstrap: str, security: KafkaSecurity
    ) -> None:
        self.pipeline, self.topic, self.group = pipeline, topic, group
        self.bootstrap, self.security = bootstrap, security
        self.producer: AIOKafkaProducer | None = None
        self.named: dict[str, Named] = {}  # unit -> its newest checkpoint, acknowledged
        self._committed: dict[str, Named] = {}  # unit -> the one its last commit named
        self._last: dict[str, tuple[float, float, int]] = {}  # unit -> (when, took, position)
        # units whose last restore a rebalance overtook: replayed the next time, for a restore
        # that takes longer than the group lets a member go without polling would be overtaken
        # again and again, and the unit never placed
        self._overtaken: set[str] = set()

    def due(self, now: float) -> list[str]:
        """The owned units due a checkpoint at ``now`` (:func:`time.monotonic`)."""
        out = []
        for name, unit in self.pipeline.units.items():
            when, took, position = self._last.get(name, (-float("inf"), 0.0, 0))
            if (
                unit.position != position
                and now - when >= max(EVERY, COST * took)
                and any(part.final is None for part in unit.parts.values())
            ):
                out.append(name)
        return out

    async def write(self, name: str) -> Named | None:
        """Write the unit's checkpoint at its position and wait until Kafka has all of it;
        None when it has none (in process only) or the write failed (logged: the unit's next
        commit names the one before)."""
        unit, producer = self.pipeline.units.get(name), self.producer
        if unit is None or producer is None:
            return None
        began = time.monotonic()
        now_ms, clock = time.time() * 1000, self.pipeline.clock()
        runs = self.pipeline.runs
        seen = {r: int(now_ms - (clock - runs[r].seen) * 1000) for r in unit.parts if r in runs}
        buffers, position = encode_unit(unit, seen), unit.position
        if buffers is None:
            return None
        id_ = secrets.token_hex(8)
        crc, number, offsets, window = 0, 0, list[int](), []
        try:
            # sent from the unit's own buffers, a piece at a time: the unit takes no event
            # meanwhile, for only the consume loop applies events, and it awaits this
            for piece in pieces(buffers, CHUNK_BYTES):
                crc = zlib.crc32(piece, crc)
                key = f"{self.group}/{name}/{id_}/{number}".encode()
                window.append(await producer.send(self.topic, piece, key=key))
                number += 1
                if len(window) == _WINDOW:  # a window in flight: memory stays flat
                    offsets += [m.offset for m in await asyncio.gather(*window)]
                    window = []
            offsets += [m.offset for m in await asyncio.gather(*window)]
        except Exception as exc:  # any failure: the last one stays named
            log.warning("%s: checkpoint not written (%s); the last one stands", name, exc)
            self._last[name] = (began, time.monotonic() - began, position)
            return None
        named = Named(id_, position, min(offsets), max(offsets) + 1, number, crc)
        if self.pipeline.units.get(name) is not unit:  # revoked meanwhile: the next owner's
            await self.delete(name, named)
            return None
        self._last[name] = (began, time.monotonic() - began, position)
        replaced, self.named[name] = self.named.get(name), named
        if replaced is not None and replaced != self._committed.get(name):
            await self.delete(name, replaced)  # written, never named by a commit
        return named

    def committed(self, name: str, named: Named | None) -> Named | None:
        """A commit of the unit named ``named``: the checkpoint it supersedes, to delete."""
        before = self._committed.pop(name, None)
        if named is not None:
            self._committed[name] = named
        return before if before is not None and before != named else None

    async def delete(self, name: str, named: Named) -> None:
        """Tombstones for a superseded checkpoint's records (compaction removes them)."""
        if self.producer is None:
            return
        for i in range(named.chunks):
            key = f"{self.group}/{name}/{named.id}/{i}".encode()
            await self.producer.send(self.topic, None, key=key)

    def uncertain(self, name: str, named: Named) -> None:
        """A commit naming ``named`` failed, perhaps after the broker applied it: it counts as
        named, so it is deleted only once a later commit names a newer one (the one before is
        left to the topic's retention)."""
        self._committed[name] = named

    def release(self, name: str) -> None:
        """The unit is no longer owned here: its checkpoints are its next owner's business."""
        self.named.pop(name, None)
        self._committed.pop(name, None)
        self._last.pop(name, None)

    async def restore(self, name: str, named: Named, current: Callable[[], bool]) -> bool:
        """Hold the new unit ``name`` again from the checkpoint its commit names; False (the
        unit left new, logged why) when that checkpoint cannot be read whole or used, or when
        ``current()`` turns False meanwhile (a rebalance: the unit, if still here, is placed
        again after it). The checkpoint is put together, checked, decoded and built into parts
        off the event loop, so that the group's heartbeats go on however large it is."""
        began, unit = time.monotonic(), self.pipeline.units.get(name)
        if unit is None:
            return False
        if name in self._overtaken:
            self._overtaken.discard(name)
            log.warning(
                "%s: its last restore was overtaken by a rebalance; replaying from the "
                "committed offset",
                name,
            )
            return False
        try:
            chunks = await self._read(name, named)
            if not current():
                self._overtaken.add(name)
                return False
            built = asyncio.ensure_future(asyncio.to_thread(_built, unit, named, chunks))
            try:
                checkpoint, parts = await asyncio.shield(built)
            except asyncio.CancelledError:  # the thread goes on: what it builds is deleted
                with contextlib.suppress(Exception):
                    for part in (await built)[1].values():
                        part.delete()
                raise
            if not current():
                self._overtaken.add(name)
                for part in parts.values():
                    part.delete()
                return False
            runs = self.pipeline.restore(name, checkpoint, parts)
        except (CheckpointError, ValueError, KafkaError, OSError, RewardstreamError) as exc:
            log.warning(
                "%s: checkpoint %s unusable (%s); replaying from the committed offset",
                name,
                named.id,
                exc,
            )
            return False
        self.named[name] = self._committed[name] = named
        self._last[name] = (time.monotonic(), 0.0, named.position)
        log.info(
            "%s: held again from checkpoint %s at offset %d (%d open runs) in %.1f s",
            name,
            named.id,
            named.position,
            len(runs),
            time.monotonic() - began,
        )
        return True

    async def _read(self, name: str, named: Named) -> list[bytes]:
        """The checkpoint's records, from its range of the topic, in order; all of them."""
        prefix = f"{self.group}/{name}/{named.id}/".encode()
        consumer = reader(self.bootstrap, self.security, _FETCH_BYTES)
        await start_client(consumer, self.bootstrap, self.security)
        chunks: dict[int, bytes] = {}
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                await self._chunks(consumer, prefix, named, chunks)
        except TimeoutError:
            raise CheckpointError(f"not read within {READ_TIMEOUT:.0f} s") from None
        finally:
            await consumer.stop()
        if sorted(chunks) != list(range(named.chunks)):
            raise CheckpointError(f"{len(chunks)} of its {named.chunks} records are there")
        return [chunks[i] for i in range(named.chunks)]

    async def _chunks(
        self, consumer: AIOKafkaConsumer, prefix: bytes, named: Named, chunks: dict[int, bytes]
    ) -> None:
        """Read the checkpoint's range of the topic into ``chunks`` (number -> bytes)."""
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, named.at)
        while await consumer.position(tp) < named.end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            if not batch:
                (end,) = (await consumer.end_offsets([tp])).values()
                if end <= await consumer.position(tp):
                    return  # deleted: the log ends before the checkpoint does
            for record in batch.get(tp, []):
                if record.offset >= named.end:
                    return
                if record.key and record.key.startswith(prefix) and record.value is not None:
                    chunks[int(record.key[len(prefix) :])] = record.value


def _built(unit: Unit, named: Named, chunks: list[bytes]) -> tuple[Checkpoint, dict[str, Part]]:
    """The checkpoint ``named`` from its records (``chunks``, emptied once joined: the records
    and the checkpoint are not held longer than the join), checked, and the unit's parts built
    from it (:meth:`Unit.held`): the work of a restore that touches nothing shared, for a
    thread."""
    blob = b"".join(chunks)
    chunks.clear()
    if zlib.crc32(blob) != named.crc:
        raise CheckpointError("its records do not add up to its CRC-32")
    checkpoint = decode_unit(blob, unit.name)
    if checkpoint.position != named.position:
        raise CheckpointError(f"it is at {checkpoint.position}, not {named.position}")
    return checkpoint, checkpoint.built(unit)
