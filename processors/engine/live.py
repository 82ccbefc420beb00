"""Whole-run live summaries: what the page, ``watch`` and ``GET /runs/<id>`` show of a run.

A processor holds only its units' parts of a run, so each part's summary (per agent: rollouts,
reward moments, task difficulty counts, pass@k sums, reward by output tokens) travels in its
member record (:class:`~rewardstream.contract.engine.AgentProgress`), and any processor merges
its own parts' with its peers' to show the whole run: moments with Chan's merge, counts and sums
by adding (a task lives in one partition, so the sets of tasks are disjoint). Pure, no I/O.

Of :class:`~rewardstream.processors.core.difficulty.Difficulty`, the whole-run summary keeps what
adds up: ``all_max``/``all_min`` depend on the group's extremes, which no part knows, so only a
final's exact summary has them (:attr:`AgentLive.spread`, with the per-task mean reward as
Prometheus buckets, which /metrics shows). pass@k is summed per k over the parts having k in
their :func:`~rewardstream.processors.core.passk.curve_ks`: all parts agree on it when every task
has the same number of rollouts (the usual ``num_repeats``); otherwise a k that is not a power
of two may cover only some parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardstream.contract.engine import AgentProgress, AgentSpread, FinalRecord
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.difference import Side
from rewardstream.processors.core.difficulty import EDGES
from rewardstream.processors.core.passk import curve_ks
from rewardstream.processors.core.profile import TOKEN_BINS, TaskFigures, live_figures
from rewardstream.processors.core.sequence import WIRE_ENTRIES, Ladder, cut, final_tallies
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.core.welford import Moments, RunningStats

__all__ = [
    "AgentLive",
    "History",
    "bounds",
    "final_agents",
    "final_figures",
    "merge_agents",
    "of_state",
    "sides",
    "summarize",
]

_BINS = len(EDGES) - 1


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class AgentLive:
    """One agent's live figures over a set of parts (see the module docstring)."""

    rollouts: int = 0
    reward: Moments = field(default_factory=Moments)
    tasks: int = 0
    single: int = 0
    scored: int = 0
    zero_variance: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * _BINS)
    below: int = 0
    above: int = 0
    passes: dict[int, tuple[float, int]] = field(default_factory=dict)
    tokens: dict[int, tuple[int, float]] = field(default_factory=dict)
    spread: AgentSpread | None = None  # a whole run's (a final's) only: see the module docstring
    tally: Tally = field(default_factory=Tally)  # the mean reward's confidence sequence
    # a part's: its sequence in dispatch order (merges cut the parts' at one key); a merge's:
    # the key its tally is cut at (infinite: every row; None: no ladder, or no cut possible)
    ladder: Ladder | None = None
    cut_at: float | None = None

    def merge(self, other: AgentLive) -> None:
        """Add another, disjoint, set of parts (the sum has no :attr:`spread`)."""
        self.spread = None
        self.rollouts += other.rollouts
        self.reward.merge(other.reward)
        self.tally.merge(other.tally)
        self.tasks += other.tasks
        self.single += other.single
        self.scored += other.scored
        self.zero_variance += other.zero_variance
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram, strict=True)]
        self.below += other.below
        self.above += other.above
        for k, (total, n) in other.passes.items():
            mine = self.passes.get(k, (0.0, 0))
            self.passes[k] = (mine[0] + total, mine[1] + n)
        for b, (n, total) in other.tokens.items():
            held = self.tokens.get(b, (0, 0.0))
            self.tokens[b] = (held[0] + n, held[1] + total)

    @classmethod
    def of(cls, stats: RunningStats, figures: TaskFigures | None) -> AgentLive:
        reward = stats.columns.get("reward")
        out = cls(rollouts=stats.rollouts, reward=Moments(**vars(reward)) if reward else Moments())
        if figures is not None:
            d = figures.difficulty
            out.tasks, out.single, out.scored = d["tasks"], d["single"], d["scored"]
            out.zero_variance = d["zero_variance"]
            hist = d["mean_reward"]
            out.histogram, out.below, out.above = list(hist["counts"]), hist["below"], hist["above"]
            out.passes = dict(figures.passes)
            out.tokens = dict(figures.tokens)
        return out

    def view(self, level: float) -> dict[str, Any]:
        """The JSON of ``GET /runs/<id>`` for this agent, its interval at ``level`` (no NaN or
        infinity: JSON has none)."""
        r = self.reward
        return {
            "rollouts": self.rollouts,
            "reward": None
            if not r.count
            else {
                "count": r.count,
                "mean": _finite(r.mean),
                "std": _finite(r.std),
                "min": _finite(r.min),
                "max": _finite(r.max),
                "interval": self.interval(level),
            },
            "tasks": {
                "tasks": self.tasks,
                "single": self.single,
                "scored": self.scored,
                "zero_variance": self.zero_variance,
                "mixed": self.scored - self.zero_variance,
                "zero_variance_share": self.zero_variance / self.scored if self.scored else None,
                "mean_reward": {
                    "edges": list(EDGES),
                    "counts": self.histogram,
                    "below": self.below,
                    "above": self.above,
                },
            },
            "pass_at_k": {str(k): 100.0 * t / n for k, (t, n) in sorted(self.passes.items()) if n},
            # output tokens in [from, to): the rollouts there and their mean reward
            "reward_by_output_tokens": [
                {
                    "from": 0 if b == 0 else 1 << (b - 1),
                    "to": None if b == TOKEN_BINS - 1 else 1 << b,
                    "rollouts": n,
                    "mean": _finite(total / n),
                }
                for b, (n, total) in sorted(self.tokens.items())
                if n
            ],
        }

    def interval(self, level: float) -> dict[str, Any]:
        """The anytime-valid interval of the mean reward (and of pass@1, which estimates the
        same mean: docs/intervals.md); ``lower``/``upper`` are None once a reward fell outside
        the range, which ``outside`` counts. ``sums`` are the tally's ``[n, total, spread]``
        (unit scale): with ``range`` and ``outside`` a client rebuilds the :class:`Tally` and
        its interval at any level (``rewardstream compare``)."""
        t = self.tally
        now = t.interval(level)
        return {
            "level": level,
            "range": [t.lo, t.hi],
            "lower": None if now is None else now.lower,
            "upper": None if now is None else now.upper,
            "outside": t.outside,
            "sums": [t.n, t.total, t.spread],
        }

    def to_wire(self, entries: int = WIRE_ENTRIES) -> AgentProgress:
        """Its wire form, its ladder with at most ``entries`` entries."""
        r, t = self.reward, self.tally
        return AgentProgress(
            rollouts=self.rollouts,
            reward=None
            if not r.count
            else (r.count, _finite(r.mean), _finite(r.m2), _finite(r.min), _finite(r.max)),
            tasks=(self.tasks, self.single, self.scored, self.zero_variance),
            histogram=[*self.histogram, self.below, self.above],
            passes={str(k): v for k, v in self.passes.items()},
            tokens={str(b): v for b, v in self.tokens.items()},
            tally=(t.lo, t.hi, t.n, t.total, t.spread, t.outside),
            sequence=None if self.ladder is None else self.ladder.plain(entries),
        )

    @classmethod
    def from_wire(cls, wire: AgentProgress) -> AgentLive:
        reward = Moments()
        if wire.reward is not None:
            count, mean, m2, lo, hi = wire.reward
            nan = math.nan
            reward = Moments(
                count,
                nan if mean is None else mean,
                nan if m2 is None else m2,
                nan if lo is None else lo,
                nan if hi is None else hi,
            )
        *hist, below, above = wire.histogram
        return cls(
            wire.rollouts,
            reward,
            *wire.tasks,
            histogram=hist,
            below=below,
            above=above,
            passes={int(k): v for k, v in wire.passes.items()},
            tokens={int(b): v for b, v in wire.tokens.items()},
            tally=Tally() if wire.tally is None else Tally(*wire.tally),
            ladder=None if wire.sequence is None else Ladder(*wire.sequence),
        )


def summarize(
    stats: Mapping[str, RunningStats], figures: Mapping[str, TaskFigures]
) -> dict[str, AgentLive]:
    """Per agent, the summary of one part (or any set of parts) from its moments and figures."""
    return {agent: AgentLive.of(s, figures.get(agent)) for agent, s in stats.items()}


def of_state(state: ProfileState, repeat_major: bool = False) -> dict[str, AgentLive]:
    """Per agent, the exact summary of one state (a run's parts merged, when its final is
    written: what every processor then shows of the done run), with its :attr:`spread`, and
    its sequence over every row in dispatch order (``repeat_major``: an early stop's)."""
    figures = live_figures([state], curve_ks)
    out = summarize(state.live(), figures)
    for agent, tally in final_tallies(state, repeat_major).items():
        if agent in out:
            out[agent].tally = tally
    for agent, fig in figures.items():
        d = fig.difficulty
        out[agent].spread = AgentSpread(
            all_max=d["all_max"],
            all_min=d["all_min"],
            mean_le=fig.mean_le,
            mean_sum=_finite(fig.mean_sum),
        )
    return out


def final_figures(agents: Mapping[str, AgentLive]) -> dict[str, Any]:
    """A final record's ``agents`` and ``spread`` fields, from :func:`of_state`."""
    return {
        "agents": {agent: s.to_wire() for agent, s in agents.items()},
        "spread": {agent: s.spread for agent, s in agents.items() if s.spread is not None},
    }


def final_agents(record: FinalRecord) -> dict[str, AgentLive] | None:
    """The whole run's summary a final record carries (None: an evicted run's, which has
    none); a record without ``spread`` (an older processor's) gives summaries without it."""
    agents = {a: AgentLive.from_wire(w) for a, w in record.agents.items()}
    for agent, live in agents.items():
        live.spread = record.spread.get(agent)
    return agents or None


def sides(agents: Mapping[str, AgentLive]) -> dict[str, Side]:
    """Per agent of a run's summary, what a comparison of two runs reads of it."""
    return {
        agent: Side(s.rollouts, _finite(s.reward.mean) if s.reward.count else None, s.tally)
        for agent, s in agents.items()
    }


def merge_agents(
    summaries: Mapping[str, Mapping[str, AgentLive]],
    rows: Mapping[str, int],
    every_input: frozenset[str] | None,
    rows_known: bool,
) -> dict[str, AgentLive]:
    """The summaries of disjoint units' parts of a run (per unit name), merged per agent (the
    inputs are not changed); ``rows``: each input unit's rows of the run as heard,
    ``every_input``, ``rows_known``: as :func:`bounds` takes them.

    An agent's tally is its parts' ladders cut at their common frontier
    (:func:`~rewardstream.processors.core.sequence.cut`), every input unit bounding it
    (:func:`bounds`), so the sequence shown is over a prefix of the run's dispatch order; an
    agent a ladder names with no rollout yet is left out (its rows still hold the cut back)."""
    out: dict[str, AgentLive] = {}
    for summary in summaries.values():
        for agent, live in summary.items():
            out.setdefault(agent, AgentLive()).merge(live)
    ladders = {
        unit: {a: s.ladder for a, s in summary.items() if s.ladder is not None}
        for unit, summary in summaries.items()
        if unit.startswith("input-")
    }
    sequenced = {agent for held in ladders.values() for agent in held}
    for agent in sequenced:
        whole = cut(bounds(agent, ladders, rows, every_input, rows_known))
        out[agent].tally, out[agent].cut_at = (Tally(), None) if whole is None else whole
    return {a: s for a, s in sorted(out.items()) if s.rollouts or a not in sequenced}


def bounds(
    agent: str,
    ladders: Mapping[str, Mapping[str, Ladder]],
    rows: Mapping[str, int],
    every_input: frozenset[str] | None,
    rows_known: bool,
) -> list[Ladder]:
    """What each input unit says of ``agent``'s rows in it: its ladder, or, from a unit
    without one, a bound below which it holds none of them not folded.

    A cut is a prefix of the dispatch order only if *every* input unit of the run is cut at
    it, including those whose ladder is not here: a partition not read yet, an agent not seen
    in one, a member record that went without its summaries, a rebalance under way, an older
    peer. So a unit with ladders of other agents bounds this one at their highest frontier
    (rows come in line order: one of this agent's yet to come is after every row read there;
    under an early stop those frontiers are 0 until every row is known), and a unit with none
    at 0 (nothing shown), unless every row of the run is known (``rows_known``) and it holds
    none (``rows``). ``every_input``: every input unit of the topics (None: the units heard
    are all there are, one pipeline reading every event; empty: not known yet, nothing cut)."""
    units = set(ladders) | {u for u, n in rows.items() if n and u.startswith("input-")}
    out = []
    if every_input is not None:
        units |= every_input
        if not every_input and not rows_known:
            out.append(Ladder(0))  # which units there are is not known yet
    for unit in units:
        held = ladders.get(unit, {})
        if agent in held:
            out.append(held[agent])
        elif rows_known and (not rows.get(unit) or held):
            continue  # every row is in: it has none of this agent's
        elif held and all(ld.frontier is not None for ld in held.values()):
            highest = max(ld.frontier for ld in held.values() if ld.frontier is not None)
            first = next(iter(held.values()))  # its keys' order and collection
            out.append(Ladder(highest, order=first.order, epoch=first.epoch))
        elif not held:
            out.append(Ladder(0))
    return out


class History:
    """A run's figures over time, bounded: once ``limit`` points are held every other one is
    dropped and points are kept half as often, so a week-long run costs what an hour does."""

    def __init__(self, every: float, limit: int = 720) -> None:
        self.every, self.limit = every, limit
        self.points: list[dict[str, Any]] = []

    def add(self, at: float, point: dict[str, Any]) -> bool:
        """Keep ``point`` (taken at ``at``, seconds) unless the last is too recent; True if
        kept."""
        if self.points and at - self.points[-1]["at"] < self.every:
            return False
        self.points.append({"at": at, **point})
        if len(self.points) > self.limit:
            self.points = self.points[::2]
            self.every *= 2
        return True
