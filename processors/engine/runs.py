"""Streaming state: runs, the units (topic-partitions) that carry them, and their parts.

Framework-free: the Kafka processor and the in-process pipeline both feed decoded events here.

- A :class:`Unit` is one partition of the inputs or rollouts topic: the next offset to consume
  and a :class:`Part` per run. Units are what moves between processors of one consumer group
  (each rebuilt from Kafka by its new owner, :mod:`rewardstream.processors.stream`), so a part's key
  set is all the deduplication a run needs: every event of a task is keyed to the same partition.
- A :class:`Part` is one unit's share of one run: a :class:`ProfileState` with the events
  applied once, and for input parts a spill file of ``sample`` rows on disk (the state keeps
  only their offsets), so memory stays with the numbers.
- A :class:`Run` is what the control topic says of a collection plus the parts of it this
  process holds; the final and partial profiles merge the parts of every unit.

Once a run's final profile is written, its parts are *retired* (:meth:`Part.retire`): state, key set
and spill file are dropped and a :class:`Final` tombstone keeps its counts, so a long-lived
processor holds only the runs still being collected. Later events of the run never reach a retired
part (:meth:`rewardstream.processors.engine.pipeline.Pipeline.handle` skips or rejects them), so it
needs no key set: ~15 B per rollout of every done run, kept forever, would be the very growth this
avoids.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, chain, compress
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
import orjson

from rewardstream.contract.events import (
    AttemptFailed,
    Input,
    Rollout,
    RolloutBatch,
    RowSkipped,
    RunStarted,
    content_digest,
    content_digests,
    content_sum,
)
from rewardstream.errors import InvalidRow
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.passk import curve_ks
from rewardstream.processors.core.profile import TaskFigures, live_figures
from rewardstream.processors.core.sequence import Ladder, SequenceFold
from rewardstream.processors.core.state import (
    LOCATOR_BITS,
    InfoBytes,
    ProfileState,
    keys_in,
    row_key,
    row_names,
)
from rewardstream.processors.core.stopping import Reason
from rewardstream.processors.core.welford import RunningStats
from rewardstream.processors.engine.live import AgentLive, merge_agents, summarize

__all__ = [
    "CheckedRow",
    "Counts",
    "Done",
    "Final",
    "HeldPart",
    "Merged",
    "Part",
    "PartCounts",
    "PartView",
    "Run",
    "RunState",
    "Spill",
    "Unit",
    "checked_row",
    "key_columns",
    "merge_parts",
    "tasks_by_part",
]


_SPILL_BUFFER = 1 << 18  # bytes a spill holds before it writes them out


class Spill:
    """An append-only file of bytes addressed by offset, in the processor's private state
    folder: ``sample`` rows (one JSON line each) of input parts, ``rollout_infos`` entries of
    rollout parts, which memory need not hold. Scratch only: a unit's state is rebuilt from
    Kafka, never from a spill.

    Appends are buffered (a write per row cost ~2 us, a rebuild replays a million rows) and
    written at their offsets with ``pwrite``, not appended: a forked snapshot child that
    writes the buffer out before it reads writes the very bytes the owner writes there later.
    Reads go through a memory map of what was written, so a snapshot can read while the
    owner keeps appending.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.size = path, 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._pending = bytearray()
        self._written = 0

    def append(self, data: bytes | memoryview) -> int:
        offset = self.size
        self.size += len(data)
        if len(data) >= _SPILL_BUFFER:  # written as it is: not copied into the buffer first
            self._flush()
            self._write(data)
        else:
            self._pending += data
            if len(self._pending) >= _SPILL_BUFFER:
                self._flush()
        return offset

    def _flush(self) -> None:
        self._write(self._pending)
        self._pending.clear()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                try:
                    done += os.pwrite(self._fd, view[done:], self._written + done)
                except OSError as exc:  # the state folder full: say which file
                    raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._written += done

    def view(self, size: int) -> mmap.mmap | bytes:
        """The first ``size`` bytes, memory-mapped read-only (unmapped when collected): written
        bytes never change, so the map can be held while the owner keeps appending."""
        if not size:
            return b""  # mmap refuses a length of 0
        if size > self._written:
            self._flush()
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


class CheckedRow(NamedTuple):
    """A materialized row found good: its key, its names and its ``sample`` line."""

    key: tuple[int, int]
    names: tuple[str | None, str | None]
    sample: bytes


def checked_row(row: dict[str, Any]) -> CheckedRow:
    """``row`` checked as :meth:`ProfileState.add_input` checks it, with the ``sample`` line
    the profile writes for it; raises :class:`InvalidRow` (or :class:`MissingKey`)."""
    key = row_key(row)
    sample = row.copy()  # the row but its key, in order: a copy and two deletions are cheapest
    del sample["_ng_task_index"], sample["_ng_rollout_index"]
    try:
        line = orjson.dumps(sample, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
        raise InvalidRow(f"the row cannot be written back as JSON: {exc}") from None
    return CheckedRow(key, row_names(row), line)


def key_columns(state: ProfileState) -> tuple[array[int], array[int]]:
    """A part's key columns, in the order its contents were added (a part is of one kind)."""
    if state.num_inputs:
        return state.in_task, state.in_rollout
    return state.res_task, state.res_rollout


class _KeySet:
    """The (task, rollout) keys seen: a bitmask of rollout indices per task.

    Rollouts of a task are numbered 0..n-1, so a task's mask is a small int: ~15 B per key
    where a set of tuples costs ~120 B. Indices outside [0, 4096) (never written by NeMo Gym,
    but legal) go to a plain set, so no mask grows without bound.
    """

    def __init__(self) -> None:
        self._masks: dict[int, int] = {}
        self._other: set[tuple[int, int]] = set()

    @classmethod
    def of(cls, tasks: array[int], rollouts: array[int]) -> _KeySet | None:
        """The set of the keys of two columns, built in numpy when every rollout index is
        below 63 (a restore's million keys: ~10x faster than :meth:`add` each); None when a
        key is there twice."""
        keys = cls()
        task, rollout = ProfileState.column(tasks), ProfileState.column(rollouts)
        if not len(task) or not ((rollout >= 0) & (rollout < 63)).all():
            return keys if all(map(keys.add, tasks, rollouts)) else None
        owners, which = np.unique(task, return_inverse=True)
        masks = np.zeros(len(owners), dtype=np.int64)
        np.bitwise_or.at(masks, which, np.left_shift(np.int64(1), rollout))
        if int(np.bitwise_count(masks).sum()) != len(task):
            return None
        keys._masks = dict(zip(owners.tolist(), masks.tolist(), strict=True))
        return keys

    def __contains__(self, key: tuple[int, int]) -> bool:
        task, rollout = key
        if not 0 <= rollout < 4096:
            return key in self._other
        return bool(self._masks.get(task, 0) >> rollout & 1)

    def has_all(self, events: Sequence[Rollout]) -> bool:
        """Every event's key is here (a rollout part's check against its input part's keys)."""
        masks, other = self._masks, self._other
        return all(
            masks.get(e.task, 0) >> e.rollout & 1
            if 0 <= e.rollout < 4096
            else (e.task, e.rollout) in other
            for e in events
        )

    def missing(self, tasks: Sequence[int], rollouts: Sequence[int]) -> list[int]:
        """The indices of a batch's keys (its columns) that are not here."""
        masks, other = self._masks, self._other
        return [
            at
            for at, (task, rollout) in enumerate(zip(tasks, rollouts, strict=True))
            if not (
                masks.get(task, 0) >> rollout & 1
                if 0 <= rollout < 4096
                else (task, rollout) in other
            )
        ]

    def add_new(self, tasks: Sequence[int], rollouts: Sequence[int]) -> bool:
        """Record every key when all are new and distinct (the fast path's batch), else
        record none and return False (the reference path sorts duplicates from conflicts)."""
        masks, added = self._masks, dict[int, int]()
        for task, rollout in zip(tasks, rollouts, strict=True):
            if not 0 <= rollout < 4096:
                return False
            mask = added.get(task)
            if mask is None:
                mask = masks.get(task, 0)
            bit = 1 << rollout
            if mask & bit:
                return False
            added[task] = mask | bit
        masks.update(added)
        return True

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

    def has_all(self, events: Sequence[Rollout]) -> bool:
        return True

    def missing(self, tasks: Sequence[int], rollouts: Sequence[int]) -> list[int]:
        return []

    def add_new(self, tasks: Sequence[int], rollouts: Sequence[int]) -> bool:
        return False

    def add(self, task: int, rollout: int) -> bool:
        return False


class _Contents:
    """The content digest (:func:`~rewardstream.contract.events.content_digest`) of each folded
    key, in the order the part's state holds the keys (8 B per key), and their sum (the part's share
    of the run's content, :func:`~rewardstream.contract.events.content_sum`).

    A key's digest is looked up only when its key comes again (a redelivery, a republish): the
    index from key to position is built then, sorted in numpy (16 B per key, kept from then
    on), not as a dict (~100 B per key).
    """

    def __init__(self) -> None:
        self.digests = array("Q")
        self.total = 0
        self._indexed = 0  # positions [0, _indexed) are in the index
        self._sorted: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)  # packed keys
        self._at: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)  # their positions
        self._other: dict[tuple[int, int], int] = {}  # keys not packable, or indexed since

    def add(self, digest: int) -> None:
        self.digests.append(digest)
        self.total = content_sum((self.total, digest))

    def extend(self, digests: list[int]) -> None:
        self.digests.extend(digests)
        self.total = content_sum((self.total, *digests))

    def digest_of(self, key: tuple[int, int], columns: tuple[array[int], array[int]]) -> int:
        """The digest of a folded key, whose position ``columns`` (tasks, rollouts) hold."""
        if self._indexed < len(self.digests):
            self._index(*columns)
        packed = _packed(*key)
        if packed is not None:
            i = int(np.searchsorted(self._sorted, packed))
            if i < len(self._sorted) and self._sorted[i] == packed:
                return self.digests[int(self._at[i])]
        return self.digests[self._other[key]]

    def _index(self, tasks: array[int], rollouts: array[int]) -> None:
        """Index the positions not indexed yet: a few into the dict, else all sorted again."""
        begin, end = self._indexed, len(self.digests)
        self._indexed = end
        if end - begin < max(begin, 1024) // 8:
            self._other.update(((tasks[at], rollouts[at]), at) for at in range(begin, end))
            return
        task, rollout = ProfileState.column(tasks)[:end], ProfileState.column(rollouts)[:end]
        fits = (rollout >= 0) & (rollout < 4096) & (np.abs(task) < 1 << 50)
        packed = task[fits] * 4096 + rollout[fits]
        order = np.argsort(packed, kind="stable")
        self._sorted, self._at = packed[order], np.flatnonzero(fits)[order]
        self._other = {(tasks[at], rollouts[at]): at for at in np.flatnonzero(~fits).tolist()}


def _packed(task: int, rollout: int) -> int | None:
    """``(task, rollout)`` as one int64 (None when it does not fit: see :class:`_Contents`)."""
    return task * 4096 + rollout if 0 <= rollout < 4096 and abs(task) < 1 << 50 else None


class PartCounts(NamedTuple):
    """What a run's final profile holds of one unit: counted events and completed tasks (its
    final record keeps them per unit)."""

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
    member records, completion), the tasks it completed and its live moments (metrics)."""

    inputs: int
    rollouts: int
    tasks: int
    live: dict[str, RunningStats]


class HeldPart(NamedTuple):
    """What a checkpoint keeps of an open part (:meth:`Part.restore`): the state, its
    ``sample`` rows back to back (a row's locator is its offset there), one content digest per
    key in the state's order, the counts the state does not hold, the held rollouts (key ->
    offset) and the results left out of the live figures (the held and the foreign ones)."""

    state: ProfileState
    samples: bytes | memoryview
    digests: array[int]
    first_offset: int
    duplicates: int
    conflicts: int
    foreign: int
    unmatched: dict[tuple[int, int], int]
    out: list[int]


FIGURES_EVERY = 2.0  # seconds between a part's task figures in its live summary, at least
FIGURES_COST = 20.0  # and this many times what the passes took (at most 5% of a core)
_INFO_CHUNK = 1 << 20  # rollout_infos bytes a part holds before it moves them to its spill


class Part:
    """One unit's events of one run, each applied once.

    Its spill holds the ``sample`` rows of an input part, the ``rollout_infos`` entries of a
    rollout part (moved there a MiB at a time): memory keeps only the numbers.

    A rollout part counts only the rollouts whose materialized row has come (in the input part
    of the same run and partition number: both topics are keyed by task). The others are in
    its state but ``unmatched`` (key -> offset, or the event's bytes when it has none) until
    their row comes, or until the run's rows are all known and the key is none of theirs: then
    it is ``foreign`` (a dead letter, ``unknown-key``; see
    :meth:`rewardstream.processors.engine.pipeline.Pipeline.judge`). Neither counts toward the run's
    completeness nor moves a live figure (the state leaves it out of them:
    :meth:`ProfileState.leave_out`; nothing is folded in, then taken out again), and finals and
    snapshots leave both out (:func:`merge_parts`).
    """

    def __init__(self, spill_path: Path) -> None:
        self.final: Final | None = None  # set by retire()
        self.first_offset = 0  # of the unit's first event of the run (see Pipeline.replay_start)
        self.state = ProfileState()
        self.duplicates = 0
        self.unmatched: dict[tuple[int, int], int | bytes] = {}
        self.foreign = 0  # results in the state that are no materialized row's (dead letters)
        # an input part's (first, last) task and (first, last) rollout, once retired: a later
        # rollout of the run outside them is none of its rows
        self.span: tuple[int, int, int, int] | None = None
        self.dense = False  # its rows were every key of their span (so a key inside is a row)
        self._keys: _KeySet | _EveryKey = _KeySet()
        self.contents = _Contents()
        self.conflicts = 0  # events of a folded key with other content (dead letters)
        self.clashes: list[int] = []  # the last call's conflicting events, by index
        self._spill_path = spill_path
        self.spill: Spill | None = None  # opened by the first event
        # (rollouts, when) of the task figures in the summary, and the figures
        self._figures: tuple[int, float, dict[str, TaskFigures]] = (0, -math.inf, {})
        self._figures_took = 0.0  # seconds the last pass took

    def _spill(self) -> Spill:
        if self.spill is None:
            self.spill = Spill(self._spill_path)
        return self.spill

    @property
    def inputs(self) -> int:
        return self.state.num_inputs if self.final is None else self.final.inputs

    @property
    def content(self) -> int:
        """The sum of the folded keys' content digests (kept once retired)."""
        return self.contents.total

    @property
    def rollouts(self) -> int:
        """Rollouts that have their materialized row (see the class docstring)."""
        if self.final is not None:
            return self.final.rollouts
        return self.state.num_results - len(self.unmatched) - self.foreign

    @property
    def keys(self) -> _KeySet | _EveryKey:
        """The keys seen (of rows in an input part, of rollouts in a rollout part)."""
        return self._keys

    def live(self) -> dict[str, RunningStats]:
        """Per-agent running moments (as they were at retirement, once retired)."""
        return self.state.live() if self.final is None else self.final.live

    def summary(self, now: float, figures: bool = True, sharing: int = 1) -> dict[str, AgentLive]:
        """Per agent, this part's live summary for the whole-run view: the moments as they are,
        the task figures (a pass over the part's results) computed again, while rollouts come,
        at most every :data:`FIGURES_EVERY` seconds (``now``: :func:`time.monotonic`) and every
        :data:`FIGURES_COST` x ``sharing`` times what the last pass took (``sharing``: the
        parts summarized alike, so that all of them together cost at most 5% of a core,
        however large the state), and not at all without ``figures`` (the last ones)."""
        seen, at, _ = self._figures
        wait = max(FIGURES_EVERY, FIGURES_COST * sharing * self._figures_took)
        if figures and self.final is None and self.rollouts != seen and now - at >= wait:
            began = time.perf_counter()
            self._figures = (self.rollouts, now, live_figures([self.state], curve_ks))
            self._figures_took = time.perf_counter() - began
        return summarize(self.live(), self._figures[2])

    def retire(self, tasks: int) -> None:
        """Drop the state, keys and spill file (the run's final profile is written): keep the
        counts, the ``tasks`` it completed and its live moments (the done run's figures are
        its final's: :attr:`Done.agents`)."""
        if self.final is not None:
            return
        if self.state.num_inputs:
            task, rollout = (
                ProfileState.column(c) for c in (self.state.in_task, self.state.in_rollout)
            )
            self.span = (int(task.min()), int(task.max()), int(rollout.min()), int(rollout.max()))
            grid = (self.span[1] - self.span[0] + 1) * (self.span[3] - self.span[2] + 1)
            self.dense = grid == self.state.num_inputs  # rows are distinct keys
        self.final = Final(self.inputs, self.rollouts, tasks, self.state.live())
        self.state, self._keys = ProfileState(), _EveryKey()
        self.unmatched, self.foreign = {}, 0
        total, self.contents = self.contents.total, _Contents()
        self.contents.total = total
        self.delete()

    def hold(self, key: tuple[int, int], at: int | bytes) -> None:
        """The rollout of ``key`` just added has no materialized row here (yet): it is
        ``unmatched`` (``at``: its offset, or its bytes) and left out of the live figures."""
        self.unmatched[key] = at
        self.state.leave_out()

    def restore(self, held: HeldPart) -> None:
        """Hold, in this new part, what a checkpoint of one held
        (:mod:`~rewardstream.processors.engine.checkpoints`): its state, ``sample`` rows (to a
        spill of its own, at the offsets its locators name), keys, content digests, counts and
        held rollouts. Raises ``ValueError`` when the pieces do not make one part."""
        state = held.state
        tasks, rollouts = key_columns(state)
        if len(held.digests) != len(tasks):
            raise ValueError(f"{len(held.digests)} content digests for {len(tasks)} keys")
        keys = _KeySet.of(tasks, rollouts)
        if keys is None:
            raise ValueError("a key is there twice")
        self._keys = keys
        out = sorted(held.out)
        if out and not 0 <= out[0] <= out[-1] < state.num_results:
            raise ValueError("a result left out is not one of the state's")
        if len(out) != len(held.unmatched) + held.foreign:
            raise ValueError(f"{len(out)} results left out, not the held and foreign ones")
        if state.num_inputs and len(held.samples):
            self._spill().append(held.samples)
        if state.info_held:  # a view of the whole checkpoint: held, it would keep all of it
            self._spill().append(state.take_infos())
        self.state, self.first_offset = state, held.first_offset
        self.duplicates, self.conflicts = held.duplicates, held.conflicts
        self.foreign, self.unmatched = held.foreign, dict(held.unmatched)
        self.contents.extend(held.digests.tolist())
        if out:
            starts, _ = state.value_starts(ProfileState.column(state.res_schema))
            for at in out:
                state.leave_out_at(at, int(starts[at]))
        if any(key not in self._keys for key in self.unmatched):
            raise ValueError("a held rollout is not one of the state's")

    def row_came(self, key: tuple[int, int]) -> None:
        """The materialized row of ``key`` has come: its rollout, if held, counts now."""
        if self.unmatched.pop(key, None) is not None:
            self.state.count_in(key)

    def add_input(self, event: Input, checked: CheckedRow | None = None) -> bool:
        """Record one materialized row; False when its key was seen before (a duplicate, or a
        conflict: :meth:`_again`). A bad row raises
        :class:`InvalidRow` and leaves its key unseen (a good copy may still come); a row
        ``checked`` already (:func:`checked_row`) cannot be bad."""
        if checked is None:  # a bad row, seen or not, is refused before its digest is taken
            checked = checked_row(event.row)
        key = checked.key
        if key in self._keys:
            self._again(0, content_digest(event), key)
            return False
        spill = self._spill()
        self.state.add_input(event.row, spill.size, event.line, key, checked.names)
        spill.append(checked.sample)
        self._keys.add(*key)
        self.contents.add(content_digest(event))
        return True

    def add_inputs(self, events: Sequence[Input], checked: Sequence[CheckedRow]) -> bool:
        """Record checked rows as :meth:`add_input` records them one by one when every key is
        new and distinct (the batch path); else record nothing and return False."""
        keys = [row.key for row in checked]
        if not self._keys.add_new([key[0] for key in keys], [key[1] for key in keys]):
            return False
        spill = self._spill()
        samples = [row.sample for row in checked]
        locators = list(accumulate(map(len, samples), initial=spill.size))
        spill.append(b"".join(samples))
        orders = [event.line for event in events]
        self.state.add_inputs(keys, [row.names for row in checked], locators[:-1], orders)
        self.contents.extend([content_digest(event) for event in events])
        return True

    def add_rollout(self, event: Rollout) -> bool:
        """Record one rollout; False when it was seen before."""
        return bool(self.add_rollouts([event]))

    def add_rollouts(self, events: Sequence[Rollout]) -> list[Rollout]:
        """Record rollouts in order; returns those not seen before (the others are counted as
        duplicates, or as conflicts: :meth:`_again`)."""
        add = self._keys.add
        fresh = [add(event.task, event.rollout) for event in events]
        new = list(compress(events, fresh))
        if new:
            self.contents.extend([content_digest(event) for event in new])
            self.state.add_records(
                [event.task for event in new],
                [event.rollout for event in new],
                [event.record for event in new],
                [event.agent for event in new],
            )
            if len(self.state.info_pool) >= _INFO_CHUNK:
                self._spill().append(self.state.take_infos())
        if len(new) < len(events):  # the others' keys came before: duplicates, or conflicts
            for at, event in enumerate(events):
                if not fresh[at]:
                    self._again(at, content_digest(event), (event.task, event.rollout))
        return new

    def add_batch(self, batch: RolloutBatch, waiting: Mapping[int, int | bytes]) -> bool:
        """Record a fast-path batch (:func:`~rewardstream.contract.events.decode_rollout_batch`)
        as :meth:`add_rollouts` and :meth:`hold` record its events one by one when every key
        is new and distinct; else record nothing and return False (the caller takes the
        reference path). ``waiting``: per index of a rollout whose materialized row is not
        here, its offset (or bytes)."""
        if not self._keys.add_new(batch.tasks, batch.rollouts):
            return False
        self.contents.extend(content_digests(batch))
        state = self.state
        first, pool_at = state.num_results, len(state.pool)
        state.add_columns(
            *(batch.tasks, batch.rollouts, batch.shapes, batch.masked, batch.answers),
            *(list(chain.from_iterable(batch.values)), batch.infos, batch.agents),
        )
        if waiting:
            widths = (len(names) for names, _ in batch.shapes)
            starts = list(accumulate(widths, initial=pool_at))
            for at, where in waiting.items():
                self.unmatched[batch.tasks[at], batch.rollouts[at]] = where
                state.leave_out_at(first + at, starts[at])
        if len(state.info_pool) >= _INFO_CHUNK:
            self._spill().append(state.take_infos())
        return True

    def _again(self, at: int, digest: int, key: tuple[int, int]) -> None:
        """An event whose key was folded before (``at``: its index in the call's events): a
        duplicate when its content is the same, else a conflict (kept in :attr:`clashes` for the
        caller to report, never folded: the first content stands). A retired part keeps no
        contents, and cannot tell: the pipeline never hands it events."""
        if (
            self.final is not None
            or self.contents.digest_of(key, key_columns(self.state)) == digest
        ):
            self.duplicates += 1
        else:
            self.conflicts += 1
            self.clashes.append(at)

    def taken_infos(self) -> InfoBytes:
        """The ``rollout_infos`` entries moved to the spill (what :meth:`ProfileState.merge`
        needs with this part's state), mapped, not read."""
        if not self.state.info_taken:
            return b""
        assert self.spill is not None
        return self.spill.view(self.state.info_taken)

    def sample_reader(self) -> Callable[[int], bytes] | None:
        """The reader of this part's ``sample`` rows by locator (spill offset)."""
        return self.spill.lines() if self.spill and self.state.num_inputs else None

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    def delete(self) -> None:
        """Close and delete the spill file, and its ``.state`` folder once empty."""
        self.close()
        self.spill = None
        self._spill_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another part's spill is still there
            self._spill_path.parent.rmdir()


class Unit:
    """One topic-partition (``input-3``, ``rollout-0``): its position and its runs' parts."""

    def __init__(self, name: str, folder: Path, since: float = 0.0) -> None:
        self.name = name
        self.folder = folder  # runs' spill files go to <folder>/<run_id>/.state/
        self.since = since  # when this process began to own it (by the engine's clock)
        self.position = 0  # next offset to consume
        self.parts: dict[str, Part] = {}
        # offsets of its events parked as ``unknown-key`` (here, or by an owner before: the
        # committed offset's metadata), so that a replay parks none of them again
        self.parked: set[int] = set()

    def part(self, run_id: str) -> Part:
        part = self.parts.get(run_id)
        if part is None:
            part = self.parts[run_id] = Part(self._spill_path(run_id))
        return part

    def held(self, parts: Mapping[str, HeldPart]) -> dict[str, Part]:
        """Parts as a checkpoint holds them (:meth:`Part.restore`), built apart from this unit
        and touching nothing else, so that a transport can build them off its event loop and
        then attach them (:meth:`Pipeline.restore`) or delete them. Raises ``ValueError`` when
        one is unusable, none kept."""
        built: dict[str, Part] = {}
        try:
            for run_id, held in parts.items():
                built[run_id] = Part(self._spill_path(run_id))
                built[run_id].restore(held)
        except BaseException:
            for part in built.values():
                part.delete()
            raise
        return built

    def _spill_path(self, run_id: str) -> Path:
        return self.folder / run_id / ".state" / f"{self.name}.spill"

    def drop(self) -> None:
        """Close and delete the spill files: scratch that the unit's next owner (or this
        processor, restarted) rebuilds from Kafka; a copy kept would only grow stale, or be
        left behind when the command ends."""
        for part in self.parts.values():
            part.delete()


class Done(NamedTuple):
    """A run's terminal record as the engine needs it: the counts its profile holds, per unit
    what it holds and the offset it covers the unit to (its *cut*), and the profile's stem."""

    inputs: int
    rollouts: int
    units: dict[str, PartCounts]
    cuts: dict[str, int]
    stem: str
    evicted: bool = False
    agents: dict[str, AgentLive] | None = None  # per agent the final's figures (exact)
    skipped: dict[Reason, int] | None = None  # rows an early stop left out, per reason


class Counts(NamedTuple):
    """How many distinct input rows and rollouts one unit holds of a run, and how many events
    it dropped as seen before."""

    inputs: int
    rollouts: int
    duplicates: int = 0


RunState = Literal["open", "stalled", "finished", "final", "evicted"]
"""``open``: collecting; ``stalled``: open, but no event of it for the processor's stall time
(a collection stopped without ``run_finished``, or stuck); ``finished``: the collector is
done, the final comes once every rollout is consumed; ``final``: its profile is written;
``evicted``: dropped unfinished (``--evict-after``)."""


class Run:
    """One collection (``run_id``): control state, and its parts held by this process.
    ``seen``: when its last event happened, as this process knows (by the engine's clock)."""

    def __init__(self, run_id: str, seen: float) -> None:
        self.run_id = run_id
        self.started: RunStarted | None = None
        self.finished = False
        self._skipped: dict[Reason, int] | None = None  # as its run_finished says
        # after "finished": unit -> log end offset it must be consumed to before a partial final;
        # None while the transport does not know every partition's end yet
        self.finish_at: dict[str, int] | None = {}
        self.terminal: Done | None = None  # its final (or evicted) record, once known
        self.replays = 0  # events read again after a restart that its final profile holds
        self.seen = seen  # when its last event happened, as this process knows (see heard)
        # when this process last read an event of it (never an event's own time): eviction
        # counts from here, so a run replayed after a restart is not evicted for its age
        self.read_at = seen
        self._heard = False  # an event of it came: seen is no longer when the run was made
        self.error: str | None = None  # why its final profile could not be built
        self._failed_at: tuple[int, int] | None = None  # (inputs, rollouts) when it failed
        self.parts: dict[str, Part] = {}  # unit name -> part, for the units this process owns
        self.foreign: dict[str, Counts] = {}  # unit name -> counts, units other processors own
        # unit name -> per agent its part's summary, units other processors own
        self.foreign_live: dict[str, dict[str, AgentLive]] = {}
        self._figures: tuple[int, dict[str, TaskFigures]] = (0, {})  # (rollouts, figures)
        # agent ("" for none) -> failure class -> failed attempts (every processor reads them
        # all: control events), and the (task, rollout, attempt) seen, each counted once
        self.failures: dict[str, dict[str, int]] = {}
        self._failed: set[tuple[int, int, int]] = set()
        # the sequences in dispatch order (processors.core.sequence): rows that will never
        # have a result (failed for good, or skipped by an early stop: not a row in flight
        # when its task was decided; append-only, a fold reads only what it has not), per
        # partition the fold of its two parts' states, and per agent the lowest cut a merge
        # will ask for from now on
        self.gone: list[tuple[int, int]] = []
        self._gone: set[tuple[int, int]] = set()
        self._folds: dict[str, tuple[ProfileState, ProfileState | None, SequenceFold]] = {}
        self._floors: dict[str, float] = {}
        # every input unit of the topics, when other processors may hold some (see
        # :func:`~rewardstream.processors.engine.live.bounds`; the pipeline's)
        self.input_units: frozenset[str] | None = None
        # the next offset to consume per unit (the pipeline's: Pipeline.positions)
        self.positions: Callable[[], Mapping[str, int]] = dict
        # which collection of the run its sequences are of: 0, then the control topic's
        # offset of each resume's run_started (a peer yet to read it is never summed with it)
        self.epoch = 0

    def attempt_failed(self, event: AttemptFailed) -> None:
        key = (event.task, event.rollout, event.attempt)
        if key not in self._failed:
            self._failed.add(key)
            classes = self.failures.setdefault(event.agent or "", {})
            classes[event.failure_class] = classes.get(event.failure_class, 0) + 1
        if event.terminal:
            self._went((event.task, event.rollout))

    def row_skipped(self, event: RowSkipped) -> None:
        """An early stop left the row out: it will have no result."""
        self._went((event.task, event.rollout))

    def _went(self, key: tuple[int, int]) -> None:
        if key not in self._gone:
            self._gone.add(key)
            self.gone.append(key)

    def start(self, started: RunStarted, offset: int | None = None) -> None:
        """Its ``run_started`` (at ``offset`` of the control topic, the same on every
        processor). Rows folded before it were folded in line order (a fixed order too, so
        their sequence was valid): under an early stop they went out repeat-major, and the
        sequences start over in that order. A second one is a resume: rows the first part said
        gone may be run now (more attempts, skips collected after all), so they start over too
        (the resumed collector says again what stays gone), in a new :attr:`epoch`."""
        line_order = not self.repeat_major
        resumed, self.started = self.started is not None, started
        if resumed:
            self.gone, self._gone = [], set()
            self.epoch = self.epoch + 1 if offset is None else offset
        if resumed or line_order != (not self.repeat_major):
            self._folds.clear()
            self._floors.clear()

    @property
    def repeat_major(self) -> bool:
        """Its rows go out repeat-major (an early stop's dispatch order), not in line order."""
        return self.started is not None and self.started.early_stop is not None

    def ladders(self) -> dict[str, dict[str, Ladder]]:
        """Per input unit held here (``input-N``), per agent, the sequence of its partition's
        rows and results in dispatch order (:class:`SequenceFold`), updated now."""
        out: dict[str, dict[str, Ladder]] = {}
        for name, rows in self.parts.items():
            if not name.startswith("input-") or rows.final is not None:
                continue
            number = name.removeprefix("input-")
            results = self.parts.get(f"rollout-{number}")
            states = (rows.state, None if results is None else results.state)
            held = self._folds.get(number)
            if held is None or held[0] is not states[0] or held[1] is not states[1]:
                held = self._folds[number] = (*states, SequenceFold(self.repeat_major))
            done = self.consumed((name, f"rollout-{number}"))
            held[2].update(states[0], states[1], self.gone, self.rows_known, done)
            if held[2].stale:  # a result for a row it passed over: folded again with it
                held = self._folds[number] = (*states, SequenceFold(self.repeat_major))
                held[2].update(states[0], states[1], self.gone, self.rows_known, done)
            out[name] = ladders = held[2].ladders(self._floors)
            for ladder in ladders.values():
                ladder.epoch = self.epoch
        return out

    def consumed(self, units: Iterable[str]) -> bool:
        """``run_finished`` is read and ``units`` are consumed to where the log ended then:
        every event of the run in them is in (the control topic's came before
        ``run_finished``), so no result is still to come there."""
        if not self.finished or self.finish_at is None:
            return False
        at, ends = self.positions(), self.finish_at
        return all(at.get(unit, 0) >= ends.get(unit, 0) for unit in units)

    def finish(self, skipped: Mapping[Reason, int] | None) -> None:
        """The collector is done (``run_finished``), having left out ``skipped`` rows per
        reason on an early stop (None: it stopped for none)."""
        self.finished = True
        self._skipped = None if skipped is None else dict(skipped)

    @property
    def skipped(self) -> dict[Reason, int] | None:
        """Rows an early stop left out, per reason: its final record's once final (every
        processor's), else as its ``run_finished`` said; None when it did not end early."""
        if (final := self._final) is not None:
            return final.skipped
        return self._skipped

    @property
    def failed_attempts(self) -> int:
        return sum(n for classes in self.failures.values() for n in classes.values())

    @property
    def expected(self) -> int | None:
        return self.started.expected_rollouts if self.started else None

    def failed(self, error: str | None) -> None:
        """Keep why the final profile could not be built (None: it was); it is tried again
        only once more events have come (:attr:`retry`), not with every batch."""
        self.error = error
        self._failed_at = None if error is None else (self.inputs, self.rollouts)

    @property
    def retry(self) -> bool:
        """No failed attempt, or events have come since the last one."""
        return self._failed_at is None or self._failed_at != (self.inputs, self.rollouts)

    @property
    def done(self) -> bool:
        """The run has its terminal record (final, written here or by another processor; or
        evicted)."""
        return self.terminal is not None

    def heard(self, at: float, now: float) -> None:
        """An event of it happened at ``at`` and was read ``now`` (by the engine's clock; ``at``
        long before now for one replayed): :attr:`seen` is the newest such time, the first
        replacing the time the run was made; :attr:`read_at` is ``now``."""
        self.seen = max(self.seen, at) if self._heard else at
        self.read_at = now
        self._heard = True

    def state(self, now: float, stall_after: float) -> RunState:
        """Where the run is (see :data:`RunState`) at ``now`` (the clock of :attr:`seen`): open
        runs with no event for ``stall_after`` seconds are stalled until one comes."""
        if self.terminal is not None:
            return "evicted" if self.terminal.evicted else "final"
        if self.finished:
            return "finished"
        return "stalled" if now - self.seen >= stall_after else "open"

    @property
    def _final(self) -> Done | None:
        """Its final record (not an evicted one): every figure of a final run is its, the same
        on every processor, whatever parts this one holds (some, none, or some it lost)."""
        return self.terminal if self.terminal is not None and not self.terminal.evicted else None

    @property
    def rollouts(self) -> int:
        """Distinct rollouts consumed, by this process and (as last heard) its peers; once the
        run is done, the rollouts its record holds."""
        if self.terminal is not None:
            return self.terminal.rollouts
        return self.local_rollouts + sum(c.rollouts for c in self.foreign.values())

    @property
    def inputs(self) -> int:
        if self.terminal is not None:
            return self.terminal.inputs
        return sum(p.inputs for p in self.parts.values()) + sum(
            c.inputs for c in self.foreign.values()
        )

    @property
    def local_rollouts(self) -> int:
        return sum(p.rollouts for p in self.parts.values())

    @property
    def duplicates(self) -> int:
        """Events dropped as seen before: in this process's parts and, as last heard, its
        peers'; once final, in the final's."""
        if (final := self._final) is not None:
            return sum(u.duplicates for u in final.units.values())
        local = sum(p.duplicates for p in self.parts.values())
        return local + sum(c.duplicates for c in self.foreign.values())

    @property
    def conflicts(self) -> int:
        return sum(p.conflicts for p in self.parts.values())

    @property
    def complete(self) -> bool:
        """Every expected rollout (and every input row) has arrived."""
        return self.expected is not None and self.rollouts == self.expected == self.inputs

    @property
    def rows_known(self) -> bool:
        """Every materialized row has arrived, here or (as last heard) at its peers: a rollout
        whose key is none of them is foreign from now on (rows are never removed)."""
        return self.expected is not None and self.inputs == self.expected

    def live(self) -> dict[str, RunningStats]:
        """Per-agent running moments over this process's parts (Chan's merge across parts)."""
        merged: dict[str, RunningStats] = {}
        for part in self.parts.values():
            for agent, stats in part.live().items():
                merged.setdefault(agent, RunningStats()).merge(stats)
        return merged

    def whole(self, now: float, figures: bool = True) -> dict[str, AgentLive]:
        """Per agent, the whole run's live summary: this process's parts and, as last heard,
        its peers' (see :mod:`rewardstream.processors.engine.live`; ``figures``: as in
        :meth:`Part.summary`); once done, its final record's, when that has them (exact, and
        known to every processor, even one started after it)."""
        if self.terminal is not None and self.terminal.agents is not None:
            return dict(sorted(self.terminal.agents.items()))  # as read: a merge drops spreads
        ladders = self.ladders()
        mine = {n: self.summary(n, now, figures, len(self.parts), ladders) for n in self.parts}
        rows = {n: c.inputs for n, c in self.foreign.items()} | {
            n: p.inputs for n, p in self.parts.items()
        }
        units = self.foreign_live | mine
        whole = merge_agents(units, rows, self.input_units, self.rows_known)
        for agent, live in whole.items():  # no merge will ask for a lower cut from now on
            if live.cut_at is not None:
                self._floors[agent] = max(live.cut_at, self._floors.get(agent, -math.inf))
        return whole

    def summary(
        self,
        unit: str,
        now: float,
        figures: bool,
        sharing: int,
        ladders: Mapping[str, Mapping[str, Ladder]],
    ) -> dict[str, AgentLive]:
        """The live summary of this process's part in ``unit`` (:meth:`Part.summary`), an
        input part's with its partition's sequences (``ladders``: :meth:`ladders`); its
        tally is its own sequence's, to its frontier."""
        summary = self.parts[unit].summary(now, figures, sharing)
        for agent, ladder in ladders.get(unit, {}).items():
            live = summary.setdefault(agent, AgentLive())
            live.ladder = ladder
            n, total, spread = ladder.at(math.inf)
            live.tally = Tally(n=n, total=total, spread=spread, outside=ladder.outside)
        return summary

    def task_figures(self) -> dict[str, TaskFigures]:
        """Per agent, task difficulty and pass@k sums over this process's parts (see
        :func:`~rewardstream.processors.core.profile.live_figures`): computed again only once
        rollouts have come since, and kept as they were when the parts retire."""
        count = self.local_rollouts
        if count != self._figures[0] and not any(p.final for p in self.parts.values()):
            self._figures = (count, live_figures([p.state for p in self.parts.values()]))
        return self._figures[1]

    def tasks_complete(self) -> int:
        """Tasks whose every materialized row has its result here (masked ones included).

        Inputs and rollouts of a task are co-partitioned, so over processors this adds up;
        once final, the whole run's (its final record's).
        """
        if (final := self._final) is not None:
            return sum(u.tasks for u in final.units.values())
        retired = sum(p.final.tasks for p in self.parts.values() if p.final is not None)
        return retired + sum(self._tasks_by_part().values())

    def _tasks_by_part(self) -> dict[str, int]:
        """The complete tasks (see :meth:`tasks_complete`) of the parts not retired (a retired
        part keeps its count)."""
        return tasks_by_part({n: p for n, p in self.parts.items() if p.final is None})


def tasks_by_part(parts: Mapping[str, PartView]) -> dict[str, int]:
    """Per part, the tasks with every input row's rollout, each counted in the first part
    holding its results (a task's events are in one unit of each topic). Only rollouts whose
    key is a row count: one still waiting for its row, or foreign, completes no task."""
    live = {n: p.state for n, p in parts.items()}
    if not live:  # a done run: every scrape of every run ever profiled comes here
        return {}
    empty, column = np.zeros(0, dtype=np.int64), ProfileState.column
    in_task = np.concatenate([empty, *(column(s.in_task) for s in live.values())])
    in_rollout = np.concatenate([empty, *(column(s.in_rollout) for s in live.values())])
    tasks, rows = np.unique(in_task, return_counts=True)
    matched = {
        name: column(s.res_task)[
            keys_in(column(s.res_task), column(s.res_rollout), in_task, in_rollout)
        ]
        for name, s in live.items()
    }
    res_tasks, results = np.unique(np.concatenate([empty, *matched.values()]), return_counts=True)
    both, at_in, at_res = np.intersect1d(tasks, res_tasks, assume_unique=True, return_indices=True)
    left = both[rows[at_in] == results[at_res]]
    out = {}
    for name in live:
        held = np.intersect1d(left, matched[name])
        out[name] = len(held)
        left = np.setdiff1d(left, held, assume_unique=True)
    return out


class PartView(Protocol):
    """What a merge needs of a part: its state, the ``rollout_infos`` entries it moved out of
    the state, and a reader of its ``sample`` rows by locator (None when it has no input
    rows). A local :class:`Part` is one; so is a part received from another processor
    (:mod:`rewardstream.processors.engine.partwire`)."""

    @property
    def state(self) -> ProfileState: ...

    @property
    def duplicates(self) -> int: ...

    @property
    def conflicts(self) -> int: ...

    @property
    def content(self) -> int: ...

    def taken_infos(self) -> InfoBytes: ...

    def sample_reader(self) -> Callable[[int], bytes] | None: ...


class Merged(NamedTuple):
    """Parts merged into one state, with the reader of their ``sample`` rows."""

    state: ProfileState
    sample: Callable[[int], bytes]


def merge_parts(parts: Iterable[PartView], known_only: bool = False) -> Merged:
    """One state from many parts (copies: the parts may keep growing); ``known_only``: without
    the results no row of the parts has (a final's and a snapshot's: foreign rollouts, and in a
    snapshot those whose row has not come yet)."""
    state, readers = ProfileState(), list[Callable[[int], bytes] | None]()
    for part in parts:
        shift = len(readers) << LOCATOR_BITS
        state.merge(part.state, locator_shift=shift, taken_infos=part.taken_infos())
        readers.append(part.sample_reader())
    mask = (1 << LOCATOR_BITS) - 1

    def sample(locator: int) -> bytes:
        read = readers[locator >> LOCATOR_BITS]
        assert read is not None, "an input row without its spill"
        return read(locator & mask)

    if known_only:
        column = ProfileState.column
        keep = keys_in(
            *(
                column(c)
                for c in (state.res_task, state.res_rollout, state.in_task, state.in_rollout)
            )
        )
        if not keep.all():
            state = state.results_kept(keep)
    return Merged(state, sample)
