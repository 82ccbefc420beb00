"""The candidate-minus-baseline difference of two runs' mean rewards, valid while peeking.

Each run's confidence sequence (:class:`~rewardstream.processors.core.confseq.Tally`) is taken
at level ``1 - alpha / 2``; the difference's interval is ``[lower_B - upper_A, upper_B -
lower_A]``. By the union bound both sequences hold at every moment at once with probability at
least ``1 - alpha``, and then so does the difference's; each of its ends alone misses at some
moment with probability at most ``alpha / 2`` (docs/intervals.md §Comparing two runs states the
estimand and the verdict's guarantee). It needs only the sums the processors already show, so
the runs may have any numbers of rollouts and be read from any processors. Pure, no I/O; the
bounds and :func:`decided` take floats or arrays alike, for the command and the bench.
"""

from __future__ import annotations

from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from rewardstream.processors.core.confseq import Interval, Tally

__all__ = [
    "BETTER",
    "NO_DIFFERENCE",
    "UNDECIDED",
    "WORSE",
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
