"""The confidence sequences of processors/core/confseq.py: their sums, their edges, and
what they claim (coverage itself is simulated by bench/coverage_bench.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize

from rewardstream.processors.core import confseq
from rewardstream.processors.core.confseq import Tally, bernoulli_interval, mixture_boundary


def test_the_boundary_is_the_mixtures_never_inside_it() -> None:
    """Each time's boundary, as read from the grid, against the mixture solved at exactly
    that time by another method (Brent's): at most 1% (the grid's step) above, never below."""
    rng = np.random.default_rng(0)
    times = np.concatenate([[1e-3, 0.5, 1.0, 4.0, 100.0, 1e9], 10 ** rng.uniform(-3, 9, 40)])
    alpha = 0.025
    one_sided = math.log(1 / (2 * alpha))
    rho = confseq._V_OPT / (2 * one_sided + math.log(1 + 2 * one_sided))
    read = mixture_boundary(times, alpha)
    for v, u in zip(times.tolist(), read.tolist(), strict=True):

        def excess(s: float, v: float = v) -> float:
            return float(confseq._log_mixture(np.array(s), np.array(v), rho)) - math.log(1 / alpha)

        exact = optimize.brentq(excess, 0.0, 100.0 + 10 * v, xtol=1e-12)
        assert exact <= u <= exact * 1.0101 + 1e-9, (v, u, exact)


def test_the_boundary_grows_with_the_variance_and_with_the_confidence() -> None:
    v = np.array([0.5, 1.0, 10.0, 100.0, 1e4, 1e6])
    u = mixture_boundary(v, 0.025)
    assert np.all(np.diff(u) > 0)
    assert np.all(mixture_boundary(v, 0.005) > u)
    # near its tuning point it is within 1.75x a fixed-sample normal bound
    assert u[3] / (1.96 * 10) < 1.75
    with pytest.raises(ValueError, match="beyond"):
        mixture_boundary(1e11, 0.025)


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200), st.integers(0, 199))
def test_a_batch_folds_as_one_by_one_and_parts_add(xs: list[float], cut: int) -> None:
    one = Tally()
    for x in xs:
        one.add(x)
    batch = Tally()
    batch.add_many(np.array(xs[:cut]))
    batch.add_many(np.array(xs[cut:]))
    assert (batch.n, batch.outside) == (one.n, one.outside)
    assert math.isclose(batch.total, one.total, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(batch.spread, one.spread, rel_tol=1e-9, abs_tol=1e-12)
    left, right = Tally(), Tally()
    left.add_many(np.array(xs[:cut]))
    right.add_many(np.array(xs[cut:]))
    left.merge(right)
    assert left.n == one.n and math.isclose(left.total, one.total, abs_tol=1e-9)


def test_the_interval_holds_the_mean_and_keeps_to_the_range() -> None:
    t = Tally(lo=-2.0, hi=6.0)
    t.add_many(np.array([0.0, 1.0, 5.0, 2.0] * 50))
    got = t.interval()
    assert got is not None
    assert -2.0 <= got.lower < 2.0 < got.upper <= 6.0
    wider = t.interval(0.99)
    assert wider is not None and wider.lower < got.lower and wider.upper > got.upper


def test_no_interval_before_a_rollout_nor_after_one_outside_the_range() -> None:
    t = Tally()
    assert t.interval() is None
    t.add(0.5)
    assert t.interval() is not None
    for bad in (1.5, -0.1, math.nan):
        u = Tally()
        u.add_many(np.array([0.5, bad]))
        assert u.outside == 1 and u.interval() is None


def test_tallies_over_different_ranges_do_not_merge() -> None:
    with pytest.raises(ValueError, match="over"):
        Tally().merge(Tally(hi=10.0))


def _grid_interval(s: int, n: int, alpha: float) -> tuple[float, float]:
    """The same set found by scanning a fine grid (another method than bisection)."""
    mixture = math.gamma(0.5 + s) * math.gamma(0.5 + n - s) / math.gamma(1.0 + n) / math.pi
    floor = math.log(mixture * alpha)
    p = np.linspace(0.0, 1.0, 200_001)
    with np.errstate(divide="ignore", invalid="ignore"):
        ll = np.where(s > 0, s * np.log(p), 0.0) + np.where(n > s, (n - s) * np.log1p(-p), 0.0)
    inside = p[ll > floor]
    return float(inside.min()), float(inside.max())


@pytest.mark.parametrize(
    ("s", "n"), [(0, 0), (0, 4), (4, 4), (8, 16), (16, 16), (3, 100), (50, 100)]
)
def test_the_task_interval_is_the_mixtures_set(s: int, n: int) -> None:
    lower, upper = bernoulli_interval(np.array([s]), np.array([n]), 0.05)
    grid_lower, grid_upper = _grid_interval(s, n, 0.05)
    assert grid_lower - 1e-5 <= lower[0] <= grid_lower + 1e-9  # never narrower than the set
    assert grid_upper - 1e-9 <= upper[0] <= grid_upper + 1e-5
    if s == 0:
        assert lower[0] == 0.0
    if s == n:
        assert upper[0] == 1.0


def test_task_intervals_of_many_pairs_are_each_pairs_own() -> None:
    s = np.array([4, 0, 4, 8, 4])
    n = np.array([4, 4, 4, 16, 8])
    lower, upper = bernoulli_interval(s, n, 0.05)
    for i in range(len(s)):
        one = bernoulli_interval(s[i : i + 1], n[i : i + 1], 0.05)
        assert (lower[i], upper[i]) == (one[0][0], one[1][0])
    assert lower[0] == lower[2] and lower[0] > lower[4]  # 4 of 4 bounds p higher than 4 of 8
