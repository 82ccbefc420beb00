"""Anytime-valid confidence sequences: intervals a user may re-check after every rollout.

A fixed-sample interval (t, Wilson, bootstrap) covers the truth with its stated probability at
one moment chosen in advance; re-checked as a run grows, the chance that it misses at *some*
moment is far larger (``bench/coverage_bench.py`` measures both). A confidence sequence
``C_t`` covers at all moments at once, ``P(for all t: theta_t in C_t) >= 1 - alpha``, so a
live page can show it after every rollout. Two constructions, each on sums that add up across
partitions and processors (docs/intervals.md states the estimands and assumptions):

- :class:`Tally` and :func:`eb_interval`: the empirical-Bernstein confidence sequence of
  Howard, Ramdas, McAuliffe and Sekhon (Ann. Statist. 49(2), 2021, Theorem 4) with their
  gamma-exponential mixture boundary (Proposition 9), solved once on a grid. For observations
  in a declared range ``[lo, hi]`` it covers ``theta_t``, the average of the observations'
  conditional means so far; rollouts of different tasks have different means, and this is the
  quantity that averages them as the agent's mean reward does. O(1) per rollout.
- :func:`bernoulli_interval`: Robbins' beta-binomial mixture (Jeffreys prior) for 0/1 outcomes
  with one common mean, a task's pass rate. It depends on (successes, trials) alone, so any
  processor computes the same interval, and it is far tighter at the few repeats a task has.

Pure, no I/O. Everything is computed on the unit scale ``z = (x - lo) / (hi - lo)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import special

__all__ = [
    "DEFAULT_LEVEL",
    "Interval",
    "Tally",
    "bernoulli_interval",
    "eb_interval",
    "mixture_boundary",
    "prefix_sums",
    "task_intervals",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DEFAULT_LEVEL = 0.95

_V_OPT = 100.0
"""The intrinsic time (unit-scale variance sum, ~400 rollouts of 0/1 rewards at a 50% rate)
where the boundary is tightest; fixed in advance, as the guarantee needs. Over intrinsic times
4 to 100,000 it is 1.7x to 3.2x a fixed-sample normal bound (measured: docs/intervals.md)."""

_GRID = np.geomspace(1e-3, 1e10, 3001)
"""Intrinsic times the boundary is solved at once; a time between two is given the next one's
(the boundary grows with it, so that is never narrower), 1% apart."""


def _log_mixture(s: F64, v: F64, rho: float) -> F64:
    """Howard et al.'s gamma-exponential mixture supermartingale (scale c = 1), in logs."""
    a0, a, x = rho, v + rho, s + v + rho
    lead = a0 * math.log(a0) - special.gammaln(a0) - math.log(special.gammainc(a0, a0))
    out: F64 = lead + special.gammaln(a) + np.log(special.gammainc(a, x)) - a * np.log(x) + s + v
    return out


@functools.cache
def _boundary_table(alpha: float) -> F64:
    """The one-sided boundary ``u(v) = sup{s : mixture(s, v) < 1/alpha}`` at each :data:`_GRID`
    time, by bisection on all at once (the mixture grows with ``s``)."""
    one_sided = math.log(1 / (2 * alpha))  # the two-sided normal mixture's rho at 2 alpha
    rho = _V_OPT / (2 * one_sided + math.log(1 + 2 * one_sided))
    level = math.log(1 / alpha)
    lo, hi = np.zeros_like(_GRID), _GRID + 100.0
    while np.any(_log_mixture(hi, _GRID, rho) < level):
        hi = np.where(_log_mixture(hi, _GRID, rho) < level, 2 * hi, hi)
    for _ in range(48):  # to 2^-48 of the bracket
        mid = (lo + hi) / 2
        below = _log_mixture(mid, _GRID, rho) < level
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return hi  # the upper end: never inside the boundary


def mixture_boundary(v: F64 | float, alpha: float) -> F64:
    """A one-sided uniform boundary for a sub-exponential process with variance process ``v``
    and scale 1: ``P(exists t: S_t >= u(V_t)) <= alpha`` (the gamma-exponential mixture of
    Howard et al. 2021, tuned at :data:`_V_OPT`)."""
    at = np.searchsorted(_GRID, np.asarray(v, dtype=np.float64), side="left")
    if np.any(at >= len(_GRID)):
        raise ValueError(f"an intrinsic time beyond {_GRID[-1]:g}")
    out: F64 = _boundary_table(alpha)[at]
    return out


class Interval(NamedTuple):
    """A confidence sequence's value at one moment, on the rewards' own scale."""

    lower: float
    upper: float


@dataclass
class Tally:
    """The sums :func:`eb_interval` needs of one stream of observations in ``[lo, hi]``.

    ``spread`` is the empirical-Bernstein variance process ``sum (z_i - c_i)^2`` with the
    predictable centre ``c_i = (1/2 + z_1 + ... + z_{i-1}) / i``, the running mean before the
    ``i``-th observation (shrunk to 1/2 at the start). Tallies of disjoint streams add (their
    interleaving is a stream whose centres are still predictable); ``outside`` counts
    observations that fell outside the range, after which no interval is claimed.
    """

    lo: float = 0.0
    hi: float = 1.0
    n: int = 0
    total: float = 0.0
    spread: float = 0.0
    outside: int = 0

    def add(self, x: float) -> None:
        """Fold one observation."""
        if not self.lo <= x <= self.hi:  # NaN included
            self.outside += 1
            return
        z = (x - self.lo) / (self.hi - self.lo)
        centre = (0.5 + self.total) / (self.n + 1)
        self.n += 1
        self.total += z
        self.spread += (z - centre) ** 2

    def add_many(self, xs: F64) -> None:
        """Fold a batch in its order: the same sums as :meth:`add` one by one (to rounding)."""
        inside = (xs >= self.lo) & (xs <= self.hi)
        self.outside += int(len(xs) - np.count_nonzero(inside))
        z = (xs[inside] - self.lo) / (self.hi - self.lo)
        if not len(z):
            return
        totals, spreads = prefix_sums(z, self.n, self.total)
        self.n += len(z)
        self.total += float(totals[-1])
        self.spread += float(spreads[-1])

    def merge(self, other: Tally) -> None:
        """Add another stream's tally (same range)."""
        if (other.lo, other.hi) != (self.lo, self.hi):
            raise ValueError(f"tallies over [{self.lo}, {self.hi}] and [{other.lo}, {other.hi}]")
        self.n += other.n
        self.total += other.total
        self.spread += other.spread
        self.outside += other.outside

    def interval(self, level: float = DEFAULT_LEVEL) -> Interval | None:
        """The sequence's current value; None before any observation or once one fell
        outside the range (the bound would no longer hold)."""
        if self.outside or not self.n:
            return None
        lower, upper = eb_interval(
            np.array([self.n]), np.array([self.total]), np.array([self.spread]), 1 - level
        )
        scale = self.hi - self.lo
        return Interval(self.lo + scale * float(lower[0]), self.lo + scale * float(upper[0]))


def prefix_sums(z: F64, n: int = 0, total: float = 0.0) -> tuple[F64, F64]:
    """:class:`Tally`'s ``total`` and ``spread`` after each item of ``z`` (unit scale, along
    the last axis), starting from ``n`` earlier items summing to ``total``: what a sequence
    shows at every moment, for the coverage bench and batch folds alike."""
    totals = np.cumsum(z, axis=-1)
    before = total + totals - z
    centres = (0.5 + before) / (n + np.arange(1, z.shape[-1] + 1))
    return totals, np.cumsum((z - centres) ** 2, axis=-1)


def eb_interval(n: npt.NDArray[Any], total: F64, spread: F64, alpha: float) -> tuple[F64, F64]:
    """Unit-scale empirical-Bernstein sequences for arrays of tallies (``n >= 1``):
    ``mean -+ u(spread; alpha / 2) / n``, clipped to [0, 1]; each side spends half of
    ``alpha``. The scale ``c`` of the sub-exponential bound is the range's width, 1."""
    mean = total / n
    radius = mixture_boundary(spread, alpha / 2) / n
    return np.maximum(mean - radius, 0.0), np.minimum(mean + radius, 1.0)


@functools.cache
def _bernoulli_pair(s: int, n: int, alpha: float) -> tuple[float, float]:
    """One pair's interval in scalar arithmetic: the same bits whatever batch asks for it."""
    floor = (
        math.lgamma(0.5 + s)
        + math.lgamma(0.5 + n - s)
        - math.lgamma(1.0 + n)
        - 2 * math.lgamma(0.5)
        + math.log(alpha)
    )  # p is in the set where s log p + (n - s) log(1 - p) > floor (B(1/2, 1/2) = pi)

    def inside(p: float) -> bool:
        if (s and p == 0.0) or (n > s and p == 1.0):
            return False
        return (s * math.log(p) if s else 0.0) + (
            (n - s) * math.log1p(-p) if n > s else 0.0
        ) > floor

    def edge(outer: float) -> float:
        if inside(outer):  # the set reaches 0 (s = 0) or 1 (s = n)
            return outer
        a, b = outer, s / n if n else 0.5  # a outside, b inside
        for _ in range(60):
            mid = (a + b) / 2
            a, b = (a, mid) if inside(mid) else (mid, b)
        return a  # the outer side: never narrower than the set

    return edge(0.0), edge(1.0)


def bernoulli_interval(successes: I64, trials: I64, alpha: float) -> tuple[F64, F64]:
    """Per pair: ``{p : M(p) < 1/alpha}`` with Robbins' mixture martingale
    ``M(p) = B(1/2 + s, 1/2 + n - s) / B(1/2, 1/2) / (p^s (1 - p)^(n - s))``; by Ville's
    inequality it excludes the true ``p`` at some moment with probability at most ``alpha``.
    Solved by bisection on each side of ``s / n``, once per distinct pair (a task has few)."""
    width = int(trials.max(initial=0)) + 1  # one code per pair
    codes, inverse = np.unique(trials * width + successes, return_inverse=True)
    ends = [_bernoulli_pair(int(c % width), int(c // width), alpha) for c in codes.tolist()]
    table = np.array(ends, dtype=np.float64).reshape(-1, 2)
    flat = inverse.ravel()
    return table[flat, 0], table[flat, 1]


def task_intervals(task: I64, values: F64, alpha: float) -> tuple[I64, I64, F64, F64]:
    """Per task of ``task`` (runs of equal ids, values in rollout order within each): its id,
    rollouts, and interval of its mean reward, the pass rate for a task of 0/1 rewards
    (:func:`bernoulli_interval`), else the empirical-Bernstein sequence over its rollouts in
    order; NaN for a task with a reward outside [0, 1]."""
    if not len(task):
        empty = np.zeros(0)
        return task[:0], task[:0], empty, empty
    starts = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
    n = np.diff(np.r_[starts, len(task)])
    outside = np.add.reduceat(~((values >= 0) & (values <= 1)), starts) > 0
    z = np.where((values >= 0) & (values <= 1), values, 0.5)
    binary = np.add.reduceat((z != 0) & (z != 1), starts) == 0
    total = np.add.reduceat(z, starts)
    running = np.cumsum(z) - z  # the sum before each item, over all tasks
    before = running - np.repeat(running[starts], n)
    position = np.arange(len(z)) - np.repeat(starts, n)
    spread = np.add.reduceat((z - (0.5 + before) / (position + 1)) ** 2, starts)
    lower, upper = eb_interval(n, total, spread, alpha)
    b_lower, b_upper = bernoulli_interval(total.astype(np.int64), n, alpha)
    lower, upper = np.where(binary, b_lower, lower), np.where(binary, b_upper, upper)
    lower[outside] = upper[outside] = np.nan
    return task[starts], n, lower, upper
