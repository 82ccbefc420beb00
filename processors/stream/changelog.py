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
import logging
import secrets
import time
import zlib
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from rewardstream.contract.engine import CHUNK_BYTES
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.engine.checkpoints import (
    CheckpointError,
    decode_unit,
    encode_unit,
    pieces,
)
from rewardstream.processors.engine.pipeline import Pipeline

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
        self._last[name] = (began, time.monotonic() - began, position)
        if self.pipeline.units.get(name) is unit:  # not revoked meanwhile
            self.named[name] = named
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

    def release(self, name: str) -> None:
        """The unit is no longer owned here: its checkpoints are its next owner's business."""
        self.named.pop(name, None)
        self._committed.pop(name, None)
        self._last.pop(name, None)

    async def restore(self, name: str, named: Named) -> bool:
        """Hold the new unit ``name`` again from the checkpoint its commit names; False (the
        unit left new, logged why) when that checkpoint cannot be read whole or used."""
        began = time.monotonic()
        try:
            checkpoint = decode_unit(await self._read(name, named), name)
            if checkpoint.position != named.position:
                raise CheckpointError(f"it is at {checkpoint.position}, not {named.position}")
            runs = self.pipeline.restore(name, checkpoint)
        except (CheckpointError, ValueError) as exc:
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

    async def _read(self, name: str, named: Named) -> bytes:
        """The checkpoint's records, from its range of the topic, put together and checked."""
        prefix = f"{self.group}/{name}/{named.id}/".encode()
        consumer = AIOKafkaConsumer(  # outside any group; a fetch takes many chunks at once
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=_FETCH_BYTES,
            fetch_max_bytes=_FETCH_BYTES,
            **self.security.client_kwargs(),
        )
        await start_client(consumer, self.bootstrap, self.security)
        pieces: dict[int, bytes] = {}
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                await self._pieces(consumer, prefix, named, pieces)
        except TimeoutError:
            raise CheckpointError(f"not read within {READ_TIMEOUT:.0f} s") from None
        finally:
            await consumer.stop()
        if sorted(pieces) != list(range(named.chunks)):
            raise CheckpointError(f"{len(pieces)} of its {named.chunks} records are there")
        blob = b"".join(pieces[i] for i in range(named.chunks))
        if zlib.crc32(blob) != named.crc:
            raise CheckpointError("its records do not add up to its CRC-32")
        return blob

    async def _pieces(
        self, consumer: AIOKafkaConsumer, prefix: bytes, named: Named, pieces: dict[int, bytes]
    ) -> None:
        """Read the checkpoint's range of the topic into ``pieces`` (chunk number -> bytes)."""
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
                    pieces[int(record.key[len(prefix) :])] = record.value
