"""When a collection may stop early: decisions that the rest of the collection cannot change.

Two opt-in rules (docs/early-stop.md states them with their guarantees):

- **Agent** (:func:`agent_settled`): stop collecting an agent once its mean reward's
  anytime-valid interval (:class:`~rewardstream.processors.core.confseq.Tally`) is no wider than
  ``half_width`` on each side. A confidence sequence covers at every moment at once, so it
  still covers at a moment chosen by looking at it: stopping on it is what it is made for.
- **Task** (:func:`task_place`): skip a task's remaining repeats once the place of its final
  mean reward relative to a curate band is fixed *whatever they score*. Rewards lie in the
  declared range ``[lo, hi]``, so after ``n`` of ``repeats`` rollouts summing to ``total`` the
  final mean is within ``[(total + r lo) / repeats, (total + r hi) / repeats]``, ``r`` the
  repeats left. No probability is involved: ``rewardstream curate`` with that band keeps
  exactly the tasks it would keep after the full collection.

Pure, no I/O: the collector folds its own results with :class:`Stopper` when it decides alone,
and the stream processors apply the same two functions to the sums they hold.

A confidence sequence is valid only if the order its observations are folded in does not
depend on their outcomes. Results come back in arrival order, and where wrong rollouts are
slower the first to arrive are the right ones (bench/coverage_bench.py: 0% coverage with 256
in flight, wrong ones 3x slower). So the agent rule folds each agent's results in *dispatch*
order, the order its rows were sent (fixed before any outcome), through a
:class:`DispatchOrder`: a result waits until every row dispatched before it has its result or
is known to have none (skipped, or failed for good). The task rule needs no order (a task's
sum and count are the same in any order): its decisions come at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, Literal, NamedTuple, TypeVar

from rewardstream.processors.core.confseq import DEFAULT_LEVEL, Interval, Tally

__all__ = [
    "REASONS",
    "DispatchOrder",
    "Reason",
    "StopRule",
    "Stopper",
    "Verdict",
    "agent_settled",
    "task_place",
]

T = TypeVar("T")

Reason = Literal["half-width", "inside-band", "below-band", "above-band"]
REASONS: tuple[Reason, ...] = ("half-width", "inside-band", "below-band", "above-band")

MARGIN = 1e-9
"""How far inside a band edge a bound must be: the profile's mean is a float sum divided by the
repeats, whose rounding (below 1e-10 for a million repeats in [0, 1]) must not move a task
across an edge the rule said it could not reach."""


@dataclass(frozen=True)
class StopRule:
    """What a run asked to stop for: ``half_width`` (agent rule), ``band`` (task rule), or
    both; ``repeats`` is the rollouts per task and agent of the full collection."""

    repeats: int
    half_width: float | None = None
    band: tuple[float, float] | None = None
    level: float = DEFAULT_LEVEL
    lo: float = 0.0
    hi: float = 1.0

    def problem(self) -> str | None:
        """Why the rule cannot be applied (one line, naming the setting), or None."""
        if self.half_width is None and self.band is None:
            return "early_stop needs half_width and/or band"
        if self.half_width is not None and not (0 < self.half_width < math.inf):
            return f"early_stop.half_width must be a positive number, got {self.half_width!r}"
        if self.band is not None:
            low, high = self.band
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                return f"early_stop.band needs finite LO <= HI, got {list(self.band)!r}"
        if not 0 < self.level < 1:
            return f"early_stop.level must be between 0 and 1, got {self.level!r}"
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            return f"early_stop.reward_range needs finite LO < HI, got {[self.lo, self.hi]!r}"
        if self.repeats < 1:
            return f"early_stop needs at least one repeat per task, got {self.repeats}"
        return None


def task_place(total: float, n: int, rule: StopRule) -> Reason | None:
    """Where the task's final mean reward will be relative to ``rule.band``, when that is
    already fixed after ``n`` rollouts summing to ``total`` (all inside the reward range);
    None while the repeats left could still move it across an edge (or none are left)."""
    if rule.band is None or n >= rule.repeats or not math.isfinite(total):
        return None
    left = rule.repeats - n
    low = (total + left * rule.lo) / rule.repeats
    high = (total + left * rule.hi) / rule.repeats
    edge_lo, edge_hi = rule.band
    if high < edge_lo - MARGIN:
        return "below-band"
    if low > edge_hi + MARGIN:
        return "above-band"
    if low >= edge_lo + MARGIN and high <= edge_hi - MARGIN:
        return "inside-band"
    return None


def agent_settled(tally: Tally, rule: StopRule) -> Interval | None:
    """The agent's interval when it is no wider than ``rule.half_width`` each side (the agent
    rule is met), else None."""
    if rule.half_width is None:
        return None
    now = tally.interval(rule.level)
    if now is None or (now.upper - now.lower) / 2 > rule.half_width:
        return None
    return now


CHECK_GROWTH = 0.01
"""How much an agent's tally grows between two checks of the agent rule by :class:`Stopper`."""


class Verdict(NamedTuple):
    """One decision: stop ``agent`` (``task`` None) or skip the rest of ``task`` for
    ``agent``, after ``rollouts`` rollouts of it, because of ``reason``."""

    agent: str
    task: int | None
    reason: Reason
    rollouts: int


class DispatchOrder(Generic[T]):
    """Puts items that come back in any order into the order they were dispatched in.

    Positions are 0, 1, 2, ... in dispatch order. An item comes out once every position
    before its own has come out or is known to have no item (:meth:`lack`); what comes out is
    always a prefix of the dispatch order, whatever order the items came back in. The first
    word on a position counts: a second item, or a lack after an item, is nothing new.
    """

    def __init__(self) -> None:
        self.next = 0  # the first position not out yet
        self._held: dict[int, tuple[T, ...]] = {}  # () when the position has no item
        self._items = 0  # the items held

    def put(self, at: int, item: T) -> list[T]:
        """The item at position ``at``; returns the items that may come out now, in order."""
        return self._settle(at, (item,))

    def lack(self, at: int) -> list[T]:
        """Position ``at`` will have no item; returns the items that may come out now."""
        return self._settle(at, ())

    @property
    def held(self) -> int:
        """Items come back but waiting for an earlier position."""
        return self._items

    def _settle(self, at: int, item: tuple[T, ...]) -> list[T]:
        if at == self.next and not self._held:  # in order: the common case, no buffering
            self.next += 1
            return list(item)
        if at < 0:
            raise ValueError(f"a dispatch position is >= 0, got {at}")
        if at < self.next or at in self._held:
            return []
        self._held[at] = item
        self._items += len(item)
        out: list[T] = []
        while self.next in self._held:
            out.extend(self._held.pop(self.next))
            self.next += 1
        self._items -= len(out)
        return out


@dataclass
class _TaskSums:
    total: float = 0.0
    n: int = 0
    open: bool = True  # False once a result fell outside the range, or once it was decided


@dataclass
class Stopper:
    """Folds results one at a time and returns each decision once, the moment it is met.

    Each result names its row's position ``at`` in its agent's dispatch order (0, 1, ... over
    that agent's rows, in the order they were sent); a row that will have no result (skipped,
    or failed for good) is told with :meth:`lack`, so it does not hold the fold back. The task
    rule folds each result at once; the agent's tally folds them in dispatch order, a prefix at
    a time (the module docstring says why)."""

    rule: StopRule
    agents: dict[str, Tally] = field(default_factory=dict)
    _order: dict[str, DispatchOrder[float]] = field(default_factory=dict)
    _tasks: dict[tuple[str, int], _TaskSums] = field(default_factory=dict)
    _stopped: set[str] = field(default_factory=set)
    _due: dict[str, int] = field(default_factory=dict)  # the agent rule's next check, in rollouts

    def add(self, agent: str, task: int, reward: float | None, at: int) -> list[Verdict]:
        """Fold one result (``reward`` None: not a number, which no rule passes over) of the
        row at position ``at`` of ``agent``'s dispatch order."""
        rule, decided = self.rule, []
        sums = self._tasks.get((agent, task))
        if sums is None:
            sums = self._tasks[agent, task] = _TaskSums()
        value = math.nan if reward is None else reward
        sums.n += 1
        sums.total += value
        sums.open = sums.open and rule.lo <= value <= rule.hi
        if sums.open and (place := task_place(sums.total, sums.n, rule)) is not None:
            decided.append(Verdict(agent, task, place, sums.n))
            sums.open = False
        decided.extend(self._fold(agent, self._queue(agent).put(at, value)))
        return decided

    def lack(self, agent: str, at: int) -> list[Verdict]:
        """The row at position ``at`` of ``agent``'s dispatch order will have no result."""
        return self._fold(agent, self._queue(agent).lack(at))

    def waiting(self, agent: str) -> int:
        """The agent's results not folded yet: an earlier row's result is not in."""
        return self._queue(agent).held

    def _queue(self, agent: str) -> DispatchOrder[float]:
        queue = self._order.get(agent)
        if queue is None:
            queue = self._order[agent] = DispatchOrder()
        return queue

    def _fold(self, agent: str, values: list[float]) -> list[Verdict]:
        """Fold the agent's results that came out of the dispatch order; the agent rule."""
        tally = self.agents.get(agent)
        if tally is None:
            tally = self.agents[agent] = Tally(self.rule.lo, self.rule.hi)
        for value in values:
            tally.add(value)
        if not values or agent in self._stopped or tally.n < self._due.get(agent, 0):
            return []
        # an interval costs ~50 us; checked each time the tally grew by 1%, a stop comes
        # at most 1% of the agent's rollouts late (and it is valid whenever it comes)
        self._due[agent] = max(tally.n + 1, math.ceil(tally.n * (1 + CHECK_GROWTH)))
        if agent_settled(tally, self.rule) is None:
            return []
        self._stopped.add(agent)
        return [Verdict(agent, None, "half-width", tally.n)]
