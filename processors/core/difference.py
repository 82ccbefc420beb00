"""The candidate-minus-baseline difference of two runs' mean rewards, valid while peeking.

Each run's confidence sequence (:class:`~rewardstream.processors.core.confseq.Tally`) is taken
at level ``1 - alpha / 2``; the difference's interval is ``[lower_B - upper_A, upper_B -
lower_A]``. By the union bound both sequences hold at every moment at once with probability at
least ``1 - alpha``, and then so does the difference's; each of its ends alone misses at some
moment with probability at most ``alpha / 2`` (docs/intervals.md §Comparing two runs states the
estimand and the verdict's guarantee). It needs only the sums the processors already show, so
the runs may have any numbers of rollouts and be read from any processors. Pure, no I/O; the
bounds and :func:`decided` take floats or arrays alike, for the command and the bench.

:func:`compare_agents` is the per-agent comparison every face shows (``rewardstream compare``,
the processor's ``/metrics`` and its page): one function, so the three never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from rewardstream.processors.core.confseq import Interval, Tally

__all__ = [
    "BETTER",
    "NO_DIFFERENCE",
    "NO_INTERVAL",
    "UNDECIDED",
    "WORSE",
    "Rule",
    "Side",
    "compare_agents",
    "decided",
    "difference",
    "difference_bounds",
    "run_level",
    "verdict",
]

BETTER: Final = "better"
WORSE: Final = "worse"
NO_DIFFERENCE: Final = "no difference larger than the noise floor"
UNDECIDED: Final = "undecided"
NO_INTERVAL: Final = "no interval"

X = TypeVar("X", float, npt.NDArray[np.float64])
Bools = npt.NDArray[np.bool_]


def run_level(level: float) -> float:
    """The level each run's sequence is taken at for a difference at ``level``: each spends
    half of ``alpha``."""
    return 1 - (1 - level) / 2


def difference_bounds(baseline: tuple[X, X], candidate: tuple[X, X]) -> tuple[X, X]:
    """``[lower_B - upper_A, upper_B - lower_A]`` from each run's ``(lower, upper)``."""
    return candidate[0] - baseline[1], candidate[1] - baseline[0]


def difference(baseline: Tally, candidate: Tally, level: float) -> Interval | None:
    """The difference's interval at ``level``; None while a run has no interval (no rollout
    yet, or a reward outside its range)."""
    a, b = baseline.interval(run_level(level)), candidate.interval(run_level(level))
    if a is None or b is None:
        return None
    return Interval(*difference_bounds((a.lower, a.upper), (b.lower, b.upper)))


def decided(lower: npt.ArrayLike, upper: npt.ArrayLike, noise_floor: float) -> tuple[Bools, Bools]:
    """Where the verdict is :data:`BETTER` (``lower > d``) and where :data:`WORSE`
    (``upper < -d``), for a noise floor ``d >= 0``."""
    return np.asarray(lower) > noise_floor, np.asarray(upper) < -noise_floor


def verdict(interval: Interval, noise_floor: float) -> str:
    """better if ``lower > d``; worse if ``upper < -d``; no difference larger than the noise
    floor if ``-d <= lower`` and ``upper <= d``; otherwise undecided. The four exclude each
    other for ``d >= 0``; each claim is wrong at some moment with probability at most
    ``alpha / 2`` (docs/intervals.md)."""
    if noise_floor < 0:
        raise ValueError(f"a noise floor of {noise_floor} (it is >= 0)")
    better, worse = decided(interval.lower, interval.upper, noise_floor)
    if better.all():
        return BETTER
    if worse.all():
        return WORSE
    if -noise_floor <= interval.lower and interval.upper <= noise_floor:
        return NO_DIFFERENCE
    return UNDECIDED


@dataclass(frozen=True)
class Rule:
    """What a comparison is judged by: the difference's level and the noise floor ``d``."""

    level: float = 0.95
    noise_floor: float = 0.01


class Side(NamedTuple):
    """One agent of one run as a comparison reads it. ``tally`` is None when the run is shown
    without its sums (an older processor's ``/runs/<id>``); an empty one, before any reward."""

    rollouts: int
    mean: float | None
    tally: Tally | None

    def why(self, role: str) -> str:
        """Why this side has no interval ("" when it has one)."""
        if self.tally is None:
            return f"the {role}'s processor shows no sums (an older version)"
        t = self.tally
        if not t.n and not t.outside:
            return f"no rollouts in the {role} yet"
        if t.outside:
            return f"{t.outside} reward(s) outside [{t.lo:g}, {t.hi:g}] in the {role}"
        return ""

    def view(self, level: float) -> dict[str, Any]:
        """Its rollouts, mean and interval at ``level`` (the run's share of the difference's)."""
        now = None if self.tally is None else self.tally.interval(level)
        return {
            "rollouts": self.rollouts,
            "mean": self.mean,
            "lower": None if now is None else now.lower,
            "upper": None if now is None else now.upper,
        }


def compare_agents(
    baseline: Mapping[str, Side],
    candidate: Mapping[str, Side],
    rule: Rule,
    agent: str | None = None,
) -> dict[str, Any]:
    """Per agent in both runs (or ``agent`` alone), each run's figures with its interval at
    :func:`run_level`, the candidate-minus-baseline difference, its interval and verdict (or
    :data:`NO_INTERVAL` and the reason), as JSON."""
    empty = Side(0, None, Tally())
    agents = [agent] if agent is not None else sorted(baseline.keys() & candidate.keys())
    rows = []
    for name in agents:
        a, b = baseline.get(name, empty), candidate.get(name, empty)
        why = "; ".join(w for w in (a.why("baseline"), b.why("candidate")) if w)
        now = None
        if a.tally is not None and b.tally is not None:
            now = difference(a.tally, b.tally, rule.level)
        point = None if a.mean is None or b.mean is None else b.mean - a.mean
        rows.append(
            {
                "agent": name,
                "baseline": a.view(run_level(rule.level)),
                "candidate": b.view(run_level(rule.level)),
                "difference": point,
                "lower": None if now is None else now.lower,
                "upper": None if now is None else now.upper,
                "verdict": NO_INTERVAL if now is None else verdict(now, rule.noise_floor),
                "reason": why or None,
            }
        )
    only = agent is None
    return {
        "level": rule.level,
        "run_level": run_level(rule.level),
        "noise_floor": rule.noise_floor,
        "agents": rows,
        "only_in_baseline": sorted(baseline.keys() - candidate.keys()) if only else [],
        "only_in_candidate": sorted(candidate.keys() - baseline.keys()) if only else [],
    }
