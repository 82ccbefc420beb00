"""An agent's confidence sequence folded in dispatch order, and cut across parts at one key.

A confidence sequence is valid only over observations taken in an order that does not depend
on their outcomes (docs/intervals.md). Rollouts do not *arrive* in such an order: many are in
flight and wrong ones are often slower, so the first to arrive are the right ones (with 256 in
flight and wrong rollouts 3x slower, a sequence over arrivals misses the truth in nearly every
simulated run). They are *dispatched* in one: the materialized inputs' line order (NeMo Gym),
or repeat-major under an early stop, fixed before any outcome is known.

So each partition's rows are folded in dispatch order, a row only once every row before it (of
the same agent, in the partition) has its result or never will (a failed or skipped row), and
each folded row leaves an entry: its dispatch key and the sums after it. A run's parts live in
several partitions (and processors); their union is a prefix of the run's dispatch order only
when every part is cut at the same key: the lowest *frontier* (the first row a part still waits
for). :class:`Ladder` is what a part shows of its sequence (the entries from the lowest cut that
can still be asked for on), :func:`cut` sums the parts' ladders at their common frontier. Pure.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field

import numpy as np

from rewardstream.processors.core.confseq import Tally, prefix_sums
from rewardstream.processors.core.state import ProfileState

__all__ = [
    "REPEAT_BITS",
    "Ladder",
    "LadderFields",
    "SequenceFold",
    "cut",
    "dispatch_keys",
    "final_tallies",
]

WIRE_ENTRIES = 256
"""Entries a ladder carries in a member record at most (fewer when many do not fit): a cut moves
up by at most this many of a part's rows per record (every 0.5 s while it changes)."""
TASK_BITS = 40
REPEAT_BITS = 23
"""Repeat-major keys are ``rollout << TASK_BITS | task``: a row beyond these bounds has none
and is never in the sequence (it never holds one back either)."""


def dispatch_keys(
    tasks: np.ndarray, rollouts: np.ndarray, lines: np.ndarray, repeat_major: bool
) -> np.ndarray:
    """Each row's place in the dispatch order (-1: none): its line in the materialized inputs,
    or, repeat-major (``(rollout, task)`` order, an early stop's), both packed in one int."""
    if not repeat_major:
        return lines.astype(np.int64)
    fits = (tasks >= 0) & (tasks < 1 << TASK_BITS) & (rollouts >= 0) & (rollouts < 1 << REPEAT_BITS)
    keys: np.ndarray = np.where(fits, (rollouts << TASK_BITS) | tasks, -1).astype(np.int64)
    return keys


LadderFields = tuple[
    int | None, int, tuple[int, float, float], list[int], list[float], list[float], int, bool, int
]
"""A ladder as plain values (a member record's, :meth:`Ladder.plain`): frontier, floor, base,
keys, totals, spreads, outside, order (repeat-major), epoch."""


@dataclass
class Ladder:
    """One part's sequence of one agent, as a merge needs it.

    Every row of the part with key below ``frontier`` is folded or never will be (None: no
    bound, every row of the run is known and done). The entries are the rows folded with key
    ``>= floor``, each with the sums after it (``n`` is ``base[0]`` plus its place); ``base`` sums
    the rows below ``floor``. A cut at any key ``>= floor`` is exact (:meth:`at`). ``order``:
    which dispatch order its keys are in (True: repeat-major; None: any, a bound with no
    entries), and ``epoch``, which collection of the run (a resume's ``run_started`` starts a
    new one: :meth:`~rewardstream.processors.engine.runs.Run.start`), so that parts folded in
    different orders or collections (a processor that has not read it yet) are never summed.
    """

    frontier: int | None
    floor: int = 0
    base: tuple[int, float, float] = (0, 0.0, 0.0)
    keys: MutableSequence[int] = field(default_factory=lambda: array("q"))
    totals: MutableSequence[float] = field(default_factory=lambda: array("d"))
    spreads: MutableSequence[float] = field(default_factory=lambda: array("d"))
    outside: int = 0
    order: bool | None = None
    epoch: int = 0

    def at(self, key: float) -> tuple[int, float, float]:
        """``(n, total, spread)`` of the rows with key below ``key`` (``>= floor``)."""
        j = bisect_left(self.keys, key)
        if not j:
            return self.base
        return self.base[0] + j, self.totals[j - 1], self.spreads[j - 1]

    def plain(self, limit: int = WIRE_ENTRIES) -> LadderFields:
        """Its fields as plain values (a member record's), with at most ``limit`` entries: the
        first ones, and the frontier lowered to the first left out (every cut stays exact)."""
        keys, frontier = list(self.keys[: limit + 1]), self.frontier
        if len(keys) > limit:
            frontier = keys.pop()
        totals, spreads = list(self.totals[:limit]), list(self.spreads[:limit])
        order = bool(self.order)
        return (
            frontier,
            self.floor,
            self.base,
            keys,
            totals,
            spreads,
            self.outside,
            order,
            self.epoch,
        )


def cut(ladders: Iterable[Ladder], lo: float = 0.0, hi: float = 1.0) -> tuple[Tally, float] | None:
    """The parts' sums at their common frontier (the lowest), as one :class:`Tally`, and that
    key (infinite: every row done); None when some part cannot be cut that low (its floor is
    above it: a part that went back, e.g. rebuilt, until it catches up), or when parts are in
    different dispatch orders or collections."""
    held = list(ladders)
    if len({(ld.order, ld.epoch) for ld in held if ld.order is not None}) > 1:
        return None
    at = min((ld.frontier for ld in held if ld.frontier is not None), default=math.inf)
    if any(ld.floor > at for ld in held):
        return None
    tally = Tally(lo, hi)
    for ld in held:
        n, total, spread = ld.at(at)
        tally.n += n
        tally.total += total
        tally.spread += spread
        tally.outside += ld.outside
    return tally, at


def _packed(tasks: np.ndarray, rollouts: np.ndarray) -> np.ndarray:
    """``(task, rollout)`` as one int (-1: beyond the bounds of :data:`TASK_BITS` and
    :data:`REPEAT_BITS`, a row the sequence leaves out)."""
    fits = (tasks >= 0) & (tasks < 1 << TASK_BITS) & (rollouts >= 0) & (rollouts < 1 << REPEAT_BITS)
    packed: np.ndarray = np.where(fits, (tasks << REPEAT_BITS) | rollouts, -1).astype(np.int64)
    return packed


@dataclass
class _Agent:
    """One agent's rows not folded yet (row ids, sorted by their dispatch keys), its tally
    and its ladder."""

    tally: Tally
    ladder: Ladder
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    last: int = -1  # the last key folded or passed (a row coming later below it is left out)


class SequenceFold:
    """One partition's rows and results of a run, folded per agent in dispatch order (see the
    module docstring). Call :meth:`update` with the states as they grow, then :meth:`ladders`.

    A row's id is its place in the rows' state; per id, whether its result came and its
    reward (NaN: none, or masked). Results find their row by ``(task, rollout)`` in a sorted
    index (rows come in line order, so it only grows at its end); one that comes before its
    row waits for it. All of it is vectorized: per result and row, a few array operations.
    Rows that will never have a result are flags too, set once per row as the append-only
    ``gone`` grows: an update costs what came since, not what is gone."""

    def __init__(self, repeat_major: bool, lo: float = 0.0, hi: float = 1.0) -> None:
        self.repeat_major, self.lo, self.hi = repeat_major, lo, hi
        self._agents: dict[str, _Agent] = {}
        self._rows_read = 0
        self._results_read = 0
        self._pool_at = 0
        self._index = (np.empty(0, np.int64), np.empty(0, np.int64))  # sorted packed keys, ids
        self._early: dict[int, float] = {}  # results whose row has not come, by packed key
        self._top = -1  # the highest line read (rows come in line order)
        self._came = np.zeros(0, np.bool_)
        self._gone = np.zeros(0, np.bool_)  # per id: it will never have a result
        self._over = np.zeros(0, np.bool_)  # per id: passed without a result
        # a result came for a row passed without one (a row said gone, then run after all, as
        # a resume with more attempts does): the sums lack it, so the fold must be rebuilt
        self.stale = False
        self._gone_read = 0  # items of ``gone`` applied
        self._early_gone: set[int] = set()  # gone rows that have not come, by packed key
        self._value = np.zeros(0, np.float64)

    def update(
        self,
        rows: ProfileState | None,
        results: ProfileState | None,
        gone: Sequence[tuple[int, int]] = (),
        rows_known: bool = False,
        complete: bool = False,
    ) -> None:
        """Read what ``rows`` (the materialized rows; always the same state), ``results`` and
        ``gone`` gained since the last call and fold what can be. ``gone``: ``(task, rollout)``
        of rows that will never have a result (failed for good, skipped by an early stop),
        append-only (only its items past those of the last call are read); ``rows_known``:
        every row of the run has come (so a part with all its rows done holds nothing back);
        ``complete``: no result is still to come (a final, or every event of a finished run
        consumed): every row is passed."""
        if rows is not None and rows.num_inputs > self._rows_read:
            self._read_rows(rows)
        if results is not None and results.num_results > self._results_read:
            self._read_results(results)
        if len(gone) > self._gone_read:
            self._read_gone(gone[self._gone_read :])
            self._gone_read = len(gone)
        if rows_known:  # no row is still to come: the pairs waiting are other partitions'
            self._early_gone.clear()
        for agent in self._agents.values():
            if self.repeat_major and not rows_known and not complete:  # may sort anywhere
                agent.ladder.frontier = 0
            else:
                self._advance(agent, rows_known, complete)

    def _read_rows(self, rows: ProfileState) -> None:
        lo, hi = self._rows_read, rows.num_inputs
        self._rows_read = hi
        tasks = ProfileState.column(rows.in_task)[lo:hi]
        rollouts = ProfileState.column(rows.in_rollout)[lo:hi]
        agents = ProfileState.column(rows.in_agent)[lo:hi]
        lines = ProfileState.column(rows.in_order)[lo:hi]
        packed = _packed(tasks, rollouts)
        keys = dispatch_keys(tasks, rollouts, lines, self.repeat_major)
        if len(lines):
            self._top = max(self._top, int(lines.max()))
        ids = np.arange(lo, hi, dtype=np.int64)
        if hi > len(self._came):  # room for the new rows, doubling
            size = max(hi, 2 * len(self._came))
            self._came = np.concatenate([self._came, np.zeros(size - len(self._came), np.bool_)])
            self._gone = np.concatenate([self._gone, np.zeros(size - len(self._gone), np.bool_)])
            self._over = np.concatenate([self._over, np.zeros(size - len(self._over), np.bool_)])
            self._value = np.concatenate([self._value, np.full(size - len(self._value), np.nan)])
        usable = (packed >= 0) & (keys >= 0) & (agents >= 0)
        self._add_to_index(packed[usable], ids[usable])
        if self._early:  # results that came first
            for row, key in zip(ids[usable].tolist(), packed[usable].tolist(), strict=True):
                if (reward := self._early.pop(key, None)) is not None:
                    self._came[row], self._value[row] = True, reward
        if self._early_gone:  # rows said to be gone before they came
            new = packed[usable]
            hit = np.isin(new, np.fromiter(self._early_gone, np.int64, len(self._early_gone)))
            self._gone[ids[usable][hit]] = True
            self._early_gone.difference_update(new[hit].tolist())
        for ident in np.unique(agents[agents >= 0]).tolist():  # a ladder, rows usable or not
            agent = self._agents.get(rows.names[ident])
            if agent is None:
                ladder = Ladder(None, order=self.repeat_major)
                agent = self._agents[rows.names[ident]] = _Agent(Tally(self.lo, self.hi), ladder)
            mine = usable & (agents == ident) & (keys > agent.last)  # below the last: too late
            new_keys, new_rows = keys[mine], ids[mine]
            if len(agent.keys) and len(new_keys) and new_keys.min() < agent.keys[-1]:
                k = np.concatenate([agent.keys, new_keys])
                r = np.concatenate([agent.rows, new_rows])
                order = np.argsort(k, kind="stable")
                agent.keys, agent.rows = k[order], r[order]
            else:  # after what is held: the usual case, rows come in line order
                order = np.argsort(new_keys, kind="stable")
                agent.keys = np.concatenate([agent.keys, new_keys[order]])
                agent.rows = np.concatenate([agent.rows, new_rows[order]])

    def _add_to_index(self, packed: np.ndarray, ids: np.ndarray) -> None:
        keys, held = self._index
        if not len(packed):
            return
        if np.all(packed[1:] > packed[:-1]) and (not len(keys) or packed[0] > keys[-1]):
            self._index = (np.concatenate([keys, packed]), np.concatenate([held, ids]))
            return
        keys, held = np.concatenate([keys, packed]), np.concatenate([held, ids])
        order = np.argsort(keys, kind="stable")
        self._index = (keys[order], held[order])

    def _read_results(self, results: ProfileState) -> None:
        lo = self._results_read
        tasks, _, rewards, self._pool_at = results.rewards_from(lo, self._pool_at)
        rollouts = ProfileState.column(results.res_rollout)[lo : lo + len(tasks)]
        self._results_read += len(tasks)
        packed = _packed(tasks, rollouts)
        keys, held = self._index
        at = np.minimum(np.searchsorted(keys, packed), max(len(keys) - 1, 0))
        found = (packed >= 0) & (keys[at] == packed) if len(keys) else np.zeros(len(packed), bool)
        ids = held[at[found]]
        self.stale = self.stale or bool(self._over[ids].any())
        self._came[ids] = True
        self._value[ids] = rewards[found]
        waiting = ~found & (packed >= 0)
        if waiting.any():
            self._early.update(
                zip(packed[waiting].tolist(), rewards[waiting].tolist(), strict=True)
            )

    def _read_gone(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Flag the rows of ``pairs`` (new items of ``gone``) as never to have a result; a
        pair whose row has not come waits for it."""
        array_ = np.array(pairs, np.int64).reshape(-1, 2)
        packed = _packed(array_[:, 0], array_[:, 1])
        packed = packed[packed >= 0]
        keys, held = self._index
        if len(keys):
            at = np.minimum(np.searchsorted(keys, packed), len(keys) - 1)
            found = keys[at] == packed
            self._gone[held[at[found]]] = True
            packed = packed[~found]
        self._early_gone.update(packed.tolist())

    def _advance(self, agent: _Agent, rows_known: bool, complete: bool) -> None:
        rows, keys, tally, ladder = agent.rows, agent.keys, agent.tally, agent.ladder
        end, step = 0, 1024  # a growing window: each call costs what it folds, not what waits
        while end < len(rows):
            window = self._passable(rows[end : end + step], complete)
            blocked = np.flatnonzero(~window)
            if len(blocked):
                end += int(blocked[0])
                break
            end, step = end + len(window), 2 * step
        folded = rows[:end]
        took = self._came[folded]
        self._over[folded[~took]] = True
        x, at = self._value[folded[took]], keys[:end][took]
        inside = (x >= self.lo) & (x <= self.hi)
        tally.outside += int(np.count_nonzero(~np.isnan(x) & ~inside))
        z = (x[inside] - self.lo) / (self.hi - self.lo)
        if len(z):
            totals, spreads = prefix_sums(z, tally.n, tally.total)
            for column, new in (
                (ladder.keys, at[inside]),
                (ladder.totals, tally.total + totals),
                (ladder.spreads, tally.spread + spreads),
            ):
                assert isinstance(column, array)  # its own ladder's (a peer's are lists)
                column.frombytes(new.tobytes())
            tally.n += len(z)
            tally.total += float(totals[-1])
            tally.spread += float(spreads[-1])
        if end:
            agent.last = int(keys[end - 1])
            agent.rows, agent.keys = rows[end:], keys[end:]
        ladder.outside = tally.outside
        if end < len(rows):
            ladder.frontier = int(keys[end])
        elif rows_known:
            ladder.frontier = None
        else:  # rows come in line order: one yet to come is after every row read here
            ladder.frontier = max(agent.last, self._top) + 1

    def _passable(self, rows: np.ndarray, complete: bool) -> np.ndarray:
        """Per row, whether the fold may pass it: its result came, or none ever will."""
        if complete:
            return np.ones(len(rows), np.bool_)
        passable: np.ndarray = self._came[rows] | self._gone[rows]
        return passable

    def ladders(self, floors: Mapping[str, float] | None = None) -> dict[str, Ladder]:
        """Per agent, its ladder, first moved up to ``floors`` (per agent: the lowest cut any
        merge will ask for from now on; entries below it are summed into the base; infinite:
        every row of the run is done, and all its entries are)."""
        out = {}
        for name, agent in self._agents.items():
            ladder = agent.ladder
            floor = (floors or {}).get(name)
            if floor == math.inf and ladder.frontier is None and ladder.keys:
                floor = ladder.keys[-1] + 1  # a peer cut to few entries needs none of them
            if floor is not None and math.isfinite(floor) and floor >= ladder.floor:
                self._raise_floor(ladder, int(floor))  # also entries folded below it since
            out[name] = ladder
        return out

    @staticmethod
    def _raise_floor(ladder: Ladder, floor: int) -> None:
        j = bisect_left(ladder.keys, floor)
        if j:
            ladder.base = (ladder.base[0] + j, ladder.totals[j - 1], ladder.spreads[j - 1])
            del ladder.keys[:j], ladder.totals[:j], ladder.spreads[:j]
        ladder.floor = floor


def final_tallies(
    state: ProfileState, repeat_major: bool, lo: float = 0.0, hi: float = 1.0
) -> dict[str, Tally]:
    """Per agent, the sequence over a whole run's rows and results (a final's merged state),
    every result in: the same sums as :class:`SequenceFold`, in one vectorized pass."""
    tasks, rollouts, lines, agents = (
        ProfileState.column(c).copy()
        for c in (state.in_task, state.in_rollout, state.in_order, state.in_agent)
    )
    keys = dispatch_keys(tasks, rollouts, lines, repeat_major)
    packed = _packed(tasks, rollouts)
    r_tasks, _, rewards, _ = state.rewards_from(0, 0)
    r_packed = _packed(r_tasks, ProfileState.column(state.res_rollout).copy())
    order = np.argsort(packed, kind="stable")
    at = np.minimum(np.searchsorted(packed[order], r_packed), max(len(order) - 1, 0))
    found = (r_packed >= 0) & (packed[order][at] == r_packed) if len(order) else r_packed < -1
    values = np.full(len(tasks), np.nan)
    values[order[at[found]]] = rewards[found]
    usable = (keys >= 0) & (packed >= 0) & (agents >= 0) & ~np.isnan(values)
    out = {}
    for ident in np.unique(agents[agents >= 0]).tolist():
        mine = np.flatnonzero(usable & (agents == ident))
        tally = Tally(lo, hi)
        tally.add_many(values[mine[np.argsort(keys[mine], kind="stable")]])
        out[state.names[ident]] = tally
    return out
