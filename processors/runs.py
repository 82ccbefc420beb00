"""Streaming state: runs, the units (topic-partitions) that carry them, and their parts.

Framework-free: the Kafka processor and the in-process pipeline both feed decoded events here.

- A :class:`Unit` is one partition of the inputs or rollouts topic: the next offset to consume
  and a :class:`Part` per run. Units are what moves between processors of one consumer group
  (each is checkpointed on its own, :mod:`processors.checkpoint`), so a part's key set is all
  the deduplication a run needs: every event of a task is keyed to the same partition.
- A :class:`Part` is one unit's share of one run: a :class:`ProfileState` with the events
  applied once, and for input parts a spill file of ``sample`` rows on disk (the state keeps
  only their offsets), so memory stays with the numbers.
- A :class:`Run` is what the control topic says of a collection plus the parts of it this
  process holds; the final and partial profiles merge the parts of every unit.

Once a run's final profile is written, its parts are *retired* (:meth:`Part.retire`): state,
key set and spill file are dropped and a :class:`Final` tombstone keeps its counts, so a
long-lived processor holds only the runs still being collected. Every later event of a retired
part is counted as a duplicate (redelivered, republished or late: none may change the written
profile), which needs no key set: ~15 B per rollout of every done run, kept forever, would be
the very growth this avoids.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson

from processors.state import LOCATOR_BITS, InfoBytes, ProfileState, row_key
from processors.welford import RunningStats
from rewardstream.contract import Input, Rollout, RunStarted
from rewardstream.errors import InvalidRow

__all__ = [
    "Counts",
    "Final",
    "Merged",
    "Part",
    "PartCounts",
    "Run",
    "Spill",
    "Unit",
    "merge_parts",
    "tasks_by_part",
]


class Spill:
    """An append-only file of bytes addressed by offset: ``sample`` rows (one JSON line each)
    of input parts, ``rollout_infos`` entries of rollout parts, which memory need not hold.

    Writes are unbuffered and reads go through a memory map of what was written, so a snapshot
    (or another processor) can read while the owner keeps appending. Only the owner writes: a
    spill unpickled from a checkpoint is read-only until :meth:`claim` cuts it back to the
    checkpointed length.
    """

    def __init__(self, path: Path, size: int = 0, owner: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.size, self._fd = path, size, -1
        self._open(owner)

    def _open(self, owner: bool) -> None:
        if owner:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            os.ftruncate(self._fd, self.size)  # drop what came after the checkpoint
        else:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o600)

    def __reduce__(self) -> tuple[type[Spill], tuple[Path, int, bool]]:
        return (Spill, (self.path, self.size, False))  # the length, not the fd

    def claim(self) -> None:
        """Become the writer (after taking over a unit from a checkpoint)."""
        self.close()
        self._open(owner=True)

    def append(self, data: bytes) -> int:
        offset = self.size
        os.write(self._fd, data)
        self.size += len(data)
        return offset

    def view(self, size: int) -> mmap.mmap | bytes:
        """The first ``size`` bytes, memory-mapped read-only (unmapped when collected): written
        bytes never change, so the map can be held while the owner keeps appending."""
        if not size:
            return b""  # mmap refuses a length of 0
        return mmap.mmap(self._fd, size, prot=mmap.PROT_READ)

    def lines(self) -> Callable[[int], bytes]:
        """A reader of the lines written so far, by offset, through a memory map (a profile
        reads one per task: ~10x cheaper than a ``pread`` each)."""
        view = self.view(self.size)

        def line(offset: int) -> bytes:
            end = view.find(b"\n", offset)
            return view[offset : end if end >= 0 else self.size]

        return line

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _KeySet:
    """The (task, rollout) keys seen: a bitmask of rollout indices per task.

    Rollouts of a task are numbered 0..n-1, so a task's mask is a small int: ~15 B per key
    where a set of tuples costs ~120 B. Indices outside [0, 4096) (never written by NeMo Gym,
    but legal) go to a plain set, so no mask grows without bound.
    """

    def __init__(self) -> None:
        self._masks: dict[int, int] = {}
        self._other: set[tuple[int, int]] = set()

    def __contains__(self, key: tuple[int, int]) -> bool:
        task, rollout = key
        if not 0 <= rollout < 4096:
            return key in self._other
        return bool(self._masks.get(task, 0) >> rollout & 1)

    def add(self, task: int, rollout: int) -> bool:
        """Record the key; False when it was already there (one lookup: the hot path)."""
        if 0 <= rollout < 4096:
            mask = self._masks.get(task, 0)
            bit = 1 << rollout
            if mask & bit:
                return False
            self._masks[task] = mask | bit
            return True
        if (task, rollout) in self._other:
            return False
        self._other.add((task, rollout))
        return True


class _EveryKey:
    """The key set of a retired part: every key counts as seen (no memory per key)."""

    def __contains__(self, key: tuple[int, int]) -> bool:
        return True

    def add(self, task: int, rollout: int) -> bool:
        return False


class PartCounts(NamedTuple):
    """What a run's final profile holds of one unit: counted events and completed tasks (the
    final mark records them per unit, see :meth:`Part.retire`)."""

    inputs: int
    rollouts: int
    duplicates: int
    tasks: int

    @property
    def events(self) -> int:
        """Events of the run the unit had consumed: each is an input, a rollout or a duplicate."""
        return self.inputs + self.rollouts + self.duplicates


class Final(NamedTuple):
    """What a part keeps once its run's final profile is written: its counts (``/runs``,
    manifests, completion), the tasks it completed and its live moments (metrics)."""

    inputs: int
    rollouts: int
    tasks: int
    live: dict[str, RunningStats]


_INFO_CHUNK = 1 << 20  # rollout_infos bytes a part holds before it moves them to its spill


class Part:
    """One unit's events of one run, each applied once.

    Its spill holds the ``sample`` rows of an input part, the ``rollout_infos`` entries of a
    rollout part (moved there a MiB at a time): memory keeps only the numbers.
    """

    final: Final | None = None  # set by retire(); a class default for older checkpoints
    replays = 0  # events still to come that the run's final profile holds (see retire())

    def __init__(self, spill_path: Path) -> None:
        self.state = ProfileState()
        self.duplicates = 0
        self._keys: _KeySet | _EveryKey = _KeySet()
        self._spill_path = spill_path
        self.spill: Spill | None = None  # opened by the first event

    def _spill(self) -> Spill:
        if self.spill is None:
            self.spill = Spill(self._spill_path)
        return self.spill

    @property
    def inputs(self) -> int:
        return self.state.num_inputs if self.final is None else self.final.inputs

    @property
    def rollouts(self) -> int:
        return self.state.num_results if self.final is None else self.final.rollouts

    def live(self) -> dict[str, RunningStats]:
        """Per-agent running moments (as they were at retirement, once retired)."""
        return self.state.live() if self.final is None else self.final.live

    def retire(self, tasks: int, written: PartCounts | None = None) -> None:
        """Drop the state, keys and spill file (the run's final profile is written): keep the
        counts, the ``tasks`` it completed and its live moments; later events are duplicates.

        ``written`` is what the final profile holds of this unit. When that is more than this
        part holds (it was loaded from a checkpoint older than the profile: its owner was
        killed in between), it becomes the part's counts, and the events in between, which
        the unit replays next, are *replays*: already counted, neither new nor duplicates.
        """
        if self.final is not None:
            return
        counts = PartCounts(self.inputs, self.rollouts, self.duplicates, tasks)
        if written is not None and written.events > counts.events:
            self.replays, counts = written.events - counts.events, written
        self.duplicates = counts.duplicates
        self.final = Final(counts.inputs, counts.rollouts, counts.tasks, self.state.live())
        self.state, self._keys = ProfileState(), _EveryKey()
        self.close()
        self.spill = None
        self._spill_path.unlink(missing_ok=True)

    def add_input(self, event: Input) -> bool:
        """Record one materialized row; False when it was seen before. A bad row raises
        :class:`InvalidRow` and leaves its key unseen (a good copy may still come)."""
        row = event.row
        key = row_key(row)
        if key in self._keys:
            self._seen(1)
            return False
        sample = {k: v for k, v in row.items() if k not in ("_ng_task_index", "_ng_rollout_index")}
        try:
            line = orjson.dumps(sample, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
            raise InvalidRow(f"the row cannot be written back as JSON: {exc}") from None
        spill = self._spill()
        self.state.add_input(row, spill.size, event.line, key)  # validates first: then record
        spill.append(line)
        self._keys.add(*key)
        return True

    def add_rollout(self, event: Rollout) -> bool:
        """Record one rollout; False when it was seen before."""
        return bool(self.add_rollouts([event]))

    def add_rollouts(self, events: Sequence[Rollout]) -> list[Rollout]:
        """Record rollouts in order; returns those not seen before (the others are counted as
        duplicates)."""
        add = self._keys.add
        new = [event for event in events if add(event.task, event.rollout)]
        self._seen(len(events) - len(new))
        if new:
            self.state.add_records(
                [event.task for event in new],
                [event.rollout for event in new],
                [event.record for event in new],
                [event.agent for event in new],
            )
            if len(self.state.info_pool) >= _INFO_CHUNK:
                self._spill().append(self.state.take_infos())
        return new

    def _seen(self, n: int) -> None:
        """Count ``n`` events seen before: replays first (see :meth:`retire`), then duplicates."""
        replayed = min(n, self.replays)
        self.replays -= replayed
        self.duplicates += n - replayed

    def taken_infos(self) -> InfoBytes:
        """The ``rollout_infos`` entries moved to the spill (what :meth:`ProfileState.merge`
        needs with this part's state), mapped, not read."""
        if not self.state.info_taken:
            return b""
        assert self.spill is not None
        return self.spill.view(self.state.info_taken)

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


class Unit:
    """One topic-partition (``input-3``, ``rollout-0``): its position and its runs' parts."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder  # runs' spill files go to <folder>/<run_id>/.state/
        self.position = 0  # next offset to consume
        self.parts: dict[str, Part] = {}
        self.dirty = False  # changed since the last checkpoint

    def part(self, run_id: str) -> Part:
        part = self.parts.get(run_id)
        if part is None:
            spill = self.folder / run_id / ".state" / f"{self.name}.spill"
            part = self.parts[run_id] = Part(spill)
        return part

    def claim(self) -> None:
        """Take over the unit's spill files as their writer."""
        for part in self.parts.values():
            if part.spill is not None:
                part.spill.claim()

    def close(self) -> None:
        for part in self.parts.values():
            part.close()


class Counts(NamedTuple):
    """How many distinct input rows and rollouts one unit holds of a run."""

    inputs: int
    rollouts: int


class Run:
    """One collection (``run_id``): control state, and its parts held by this process."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.started: RunStarted | None = None
        self.finished = False
        # after "finished": unit -> log end offset it must be consumed to before a partial final;
        # None while the transport does not know every partition's end yet
        self.finish_at: dict[str, int] | None = {}
        self.done = False  # the final profile was written (here or by another processor)
        self.written: Counts | None = None  # the counts it was written with, once done
        self.written_units: dict[str, PartCounts] = {}  # and what it holds of each unit
        self.error: str | None = None
        self.parts: dict[str, Part] = {}  # unit name -> part, for the units this process owns
        self.foreign: dict[str, Counts] = {}  # unit name -> counts, units other processors own

    @property
    def expected(self) -> int | None:
        return self.started.expected_rollouts if self.started else None

    @property
    def rollouts(self) -> int:
        """Distinct rollouts consumed, by this process and (as last checkpointed) its peers;
        once the final profile is written, the rollouts it holds."""
        if self.written is not None:
            return self.written.rollouts
        return self.local_rollouts + sum(c.rollouts for c in self.foreign.values())

    @property
    def inputs(self) -> int:
        if self.written is not None:
            return self.written.inputs
        return sum(p.inputs for p in self.parts.values()) + sum(
            c.inputs for c in self.foreign.values()
        )

    @property
    def local_rollouts(self) -> int:
        return sum(p.rollouts for p in self.parts.values())

    @property
    def duplicates(self) -> int:
        return sum(p.duplicates for p in self.parts.values())

    @property
    def complete(self) -> bool:
        """Every expected rollout (and every input row) has arrived."""
        return self.expected is not None and self.rollouts == self.expected == self.inputs

    def live(self) -> dict[str, RunningStats]:
        """Per-agent running moments over this process's parts (Chan's merge across parts)."""
        merged: dict[str, RunningStats] = {}
        for part in self.parts.values():
            for agent, stats in part.live().items():
                merged.setdefault(agent, RunningStats()).merge(stats)
        return merged

    def tasks_complete(self) -> int:
        """Tasks whose every materialized row has its result here (masked ones included).

        Inputs and rollouts of a task are co-partitioned, so over processors this adds up.
        """
        retired = sum(p.final.tasks for p in self.parts.values() if p.final is not None)
        return retired + sum(self._tasks_by_part().values())

    def _tasks_by_part(self) -> dict[str, int]:
        """The complete tasks (see :meth:`tasks_complete`) of the parts not retired (a retired
        part keeps its count)."""
        return tasks_by_part({n: p for n, p in self.parts.items() if p.final is None})

    def retire(self) -> list[str]:
        """Retire this process's parts (the final profile is written); returns their units."""
        tasks = self._tasks_by_part()
        for name, count in tasks.items():
            self.parts[name].retire(count, self.written_units.get(name))
        return list(tasks)


def tasks_by_part(parts: dict[str, Part]) -> dict[str, int]:
    """Per part, the tasks with every input row's rollout, each counted in the first part
    holding its results (a task's events are in one unit of each topic)."""
    live = {n: p.state for n, p in parts.items()}
    if not live:  # a done run: every scrape of every run ever profiled comes here
        return {}
    empty = np.zeros(0, dtype=np.int64)
    columns = [ProfileState.column(s.in_task) for s in live.values()]
    tasks, rows = np.unique(np.concatenate([empty, *columns]), return_counts=True)
    columns = [ProfileState.column(s.res_task) for s in live.values()]
    res_tasks, results = np.unique(np.concatenate([empty, *columns]), return_counts=True)
    both, at_in, at_res = np.intersect1d(tasks, res_tasks, assume_unique=True, return_indices=True)
    left = both[rows[at_in] == results[at_res]]
    out = {}
    for name, state in live.items():
        held = np.intersect1d(left, ProfileState.column(state.res_task))
        out[name] = len(held)
        left = np.setdiff1d(left, held, assume_unique=True)
    return out


class Merged(NamedTuple):
    """Parts merged into one state, with the reader of their ``sample`` rows."""

    state: ProfileState
    sample: Callable[[int], bytes]


def merge_parts(parts: Iterable[Part]) -> Merged:
    """One state from many parts (copies: the parts may keep growing)."""
    state, readers = ProfileState(), list[Callable[[int], bytes] | None]()
    for part in parts:
        shift = len(readers) << LOCATOR_BITS
        state.merge(part.state, locator_shift=shift, taken_infos=part.taken_infos())
        readers.append(part.spill.lines() if part.spill and part.state.num_inputs else None)
    mask = (1 << LOCATOR_BITS) - 1

    def sample(locator: int) -> bytes:
        read = readers[locator >> LOCATOR_BITS]
        assert read is not None, "an input row without its spill"
        return read(locator & mask)

    return Merged(state, sample)
