"""Committed offsets: the data topics are the changelog, so the offset committed for a unit is
where its state can be rebuilt from (:meth:`Pipeline.replay_start`), and the commit's metadata
(JSON, :data:`COMMIT_FORMAT`) carries the position reached, the offsets already parked and the
checkpoint a new owner restores instead of replaying up to it
(:mod:`rewardstream.processors.stream.changelog`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.stream.changelog import Changelog, Named
from rewardstream.processors.stream.dead_letters import DeadLetters
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.units import Units

__all__ = ["COMMIT_FORMAT", "Commits"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

COMMIT_FORMAT = 1  # version of the JSON in a committed offset's metadata
# offset ranges of ``unknown-key`` dead letters a commit's metadata keeps at most (Kafka's
# offset.metadata.max.bytes is 4096 by default); beyond, the oldest may be parked again
_PARKED_RANGES = 100


class Commits:
    """Owns what is committed for each owned unit and when: the units moved since their last
    commit, the new ones whose committed offset is not read yet, each unit's *floor* (the
    position its last owner committed: nothing is committed below it), the commit timer (every
    ``every`` seconds, and when idle), and which units' checkpoints are written before a commit
    names them (:attr:`changelog`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        units: Units,
        dead_letters: DeadLetters,
        membership: Membership,
        changelog: Changelog,
        every: float,
    ) -> None:
        self.pipeline, self.units, self.changelog = pipeline, units, changelog
        self.dead_letters, self.membership = dead_letters, membership
        self.every = every
        self.moved: set[str] = set()  # units consumed since their last commit
        self.unplaced: set[str] = set()  # new units whose committed offset is not read yet
        self._floor: dict[str, int] = {}  # unit -> the position its last owner committed
        self._last = 0.0  # time.monotonic() of the last checkpoint (see start)

    def start(self, now: float) -> None:
        """The checkpoint timer counts from ``now`` (the consume loop's start)."""
        self._last = now

    async def checkpoint(self, now: float, idle: bool) -> None:
        """Commit when idle or every :attr:`every` seconds, after writing the checkpoints due."""
        if idle or now - self._last >= self.every:
            units, floor = self.pipeline.units, self._floor
            for name in self.changelog.due(now):  # a write awaits: a rebalance may revoke
                unit = units.get(name)
                if unit is None or unit.position < floor.get(name, 0):
                    continue  # revoked meanwhile, or still replaying to its last owner's place
                if await self.changelog.write(name) is not None:
                    self.moved.add(name)  # the commit names it
            await self.commit()
            self._last = now

    async def commit(self, names: set[str] | None = None, force: bool = False) -> bool | None:
        """Commit, for each owned unit consumed since its last commit (``force``: each named
        one that has a position), where its state can be rebuilt from; not while rejected
        events wait to be parked (a restart must meet them again): then None. False when the
        group coordinator refused it: this processor lost its partitions meanwhile (a zombie,
        paused past its session timeout), and nothing of it is rolled back."""
        consumer = self.units.consumer
        if consumer is None or self.dead_letters.pending:
            return None
        if force and names is not None:
            todo = {
                n for n in names if n in self.pipeline.units and self.pipeline.units[n].position
            }
        else:
            todo = self.moved if names is None else self.moved & names
        units, floor = self.pipeline.units, self._floor  # see place: never below the group's
        todo = {
            n
            for n in todo
            if n in units and n not in self.unplaced and units[n].position >= floor.get(n, 0)
        }
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        naming: dict[str, Named | None] = {}
        for name in todo:
            unit, start = self.pipeline.units[name], self.pipeline.replay_start(name)
            meta: dict[str, Any] = {"v": COMMIT_FORMAT, "position": unit.position}
            unit.parked = {o for o in unit.parked if o >= start}  # a replay reads no other
            if unit.parked:
                meta["parked"] = _ranges(unit.parked, name)
            # a checkpoint from before every open run's start holds none of them: not named
            named = self.changelog.named.get(name)
            if named is not None and start <= named.position <= unit.position:
                meta["checkpoint"] = named.meta()
            naming[name] = named if "checkpoint" in meta else None
            offsets[self.units.tp(name)] = (start, orjson.dumps(meta).decode())
        if not offsets:
            return None
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("offsets not committed (%s): the group has moved on", exc)
            for name, named in naming.items():
                if named is not None:
                    self.changelog.uncertain(name, named)
            return False
        self.moved -= todo
        for name, named in naming.items():
            if (gone := self.changelog.committed(name, named)) is not None:
                await self.changelog.delete(name, gone)
        return True

    async def place(self, current: Callable[[], bool]) -> None:
        """A new unit is consumed from its committed offset: everything before it belongs to
        runs that are closed, so that is its position until a record moves it (a partition
        with no new record must not look unconsumed to a finished run's end offsets). The
        position its last owner had reached (the commit's metadata) is its *floor*: until the
        replay gets there, the unit commits nothing, so the group's position never goes back.
        A checkpoint the commit names is held again, and the unit read on from its position.
        Once ``current()`` turns False (a rebalance while this awaited) it stops: the units
        still new are placed again after the rebalance, the others were seeked by it."""
        consumer = self.units.consumer
        assert consumer is not None
        names = [n for n in self.unplaced if n in self.pipeline.units]
        self.unplaced.clear()
        coordinator = consumer._coordinator
        tp = self.units.tp
        committed = await coordinator.fetch_committed_offsets([tp(n) for n in names])
        for name in names:
            if not current():
                return
            unit, got = self.pipeline.units.get(name), committed.get(tp(name))
            if unit is None or got is None or got.offset < 0:
                continue
            self._floor[name] = _committed_position(got.metadata, got.offset)
            parked = _committed_parked(got.metadata)
            unit.parked |= parked  # before a restore: what its judge parks, it parks once
            named = _committed_checkpoint(got.metadata)
            if named is not None and got.offset <= named.position <= self._floor[name]:
                if await self.changelog.restore(name, named, current):
                    consumer.seek(tp(name), named.position)  # replay only what follows
                if not current():
                    return
                unit = self.pipeline.units[name]  # held again, or new again
                unit.parked |= parked
            if got.offset > unit.position:
                unit.position = got.offset
            self.membership.changed = True


def _committed_position(metadata: str, offset: int) -> int:
    """The position in a commit's metadata (see :meth:`Commits.commit`); the offset itself for
    a commit without one (another tool's)."""
    try:
        meta = orjson.loads(metadata or "{}")
    except orjson.JSONDecodeError:
        return offset
    position = meta.get("position") if isinstance(meta, dict) else None
    return position if type(position) is int and position >= offset else offset


def _committed_checkpoint(metadata: str) -> Named | None:
    """The checkpoint a commit's metadata names (see :meth:`Commits.commit`), if any."""
    try:
        meta = orjson.loads(metadata or "{}")
    except orjson.JSONDecodeError:
        return None
    return Named.of(meta.get("checkpoint")) if isinstance(meta, dict) else None


def _committed_parked(metadata: str) -> set[int]:
    """The offsets of ``unknown-key`` dead letters in a commit's metadata (see
    :meth:`Commits.commit`): ``[[first, last], ...]`` ranges."""
    try:
        meta = orjson.loads(metadata or "{}")
    except orjson.JSONDecodeError:
        return set()
    ranges = meta.get("parked") if isinstance(meta, dict) else None
    if not isinstance(ranges, list):
        return set()
    return {
        o
        for r in ranges
        if isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
        for o in range(r[0], min(r[1], r[0] + (1 << 20)) + 1)
    }


def _ranges(offsets: set[int], unit: str) -> list[list[int]]:
    """Offsets as ``[first, last]`` ranges, the last :data:`_PARKED_RANGES` of them."""
    ranges: list[list[int]] = []
    for offset in sorted(offsets):
        if ranges and ranges[-1][1] == offset - 1:
            ranges[-1][1] = offset
        else:
            ranges.append([offset, offset])
    if len(ranges) > _PARKED_RANGES:
        log.warning(
            "%s: %d ranges of unknown-key dead letters, more than a commit keeps: those before "
            "offset %d may be parked again after a restart",
            unit,
            len(ranges),
            ranges[-_PARKED_RANGES][0],
        )
    return ranges[-_PARKED_RANGES:]
