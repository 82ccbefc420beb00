"""The kernels reproduce the reference's float64 operations bit for bit.

The rules: docs/nemo-gym-compat.md §Numeric kernels.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.processors.core.kernels import (
    describe_groups,
    pairwise_sum,
    quantile_linear,
    t_interval,
    welch_interval,
)


def spec_sum(x: list[float]) -> float:
    """Scalar transcription of the pairwise sum S (docs/nemo-gym-compat.md §Numeric kernels)."""
    n = len(x)
    if n < 8:
        r = 0.0
        for v in x:
            r += v
        return r
    if n <= 128:
        p = list(x[:8])
        i = 8
        while i < n - n % 8:
            for j in range(8):
                p[j] += x[i + j]
            i += 8
        r = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
        for v in x[i:]:
            r += v
        return r
    m = n // 2
    m -= m % 8
    return spec_sum(x[:m]) + spec_sum(x[m:])


@pytest.mark.parametrize("n", [*range(0, 140), 257, 1000, 4099])
def test_pairwise_sum_is_the_specs_order(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    assert pairwise_sum(x) == spec_sum(x.tolist())


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16, 129, 300])
def test_vectorised_group_sums_equal_per_group_sums(n: int) -> None:
    rng = np.random.default_rng(n)
    block = rng.standard_normal((3, 50, n)) * 10.0 ** rng.integers(-8, 8, (3, 50, n))
    stats = describe_groups(block)
    for c in range(3):
        for g in range(50):
            assert stats.mean[c, g] == spec_sum(block[c, g].tolist()) / n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), min_size=1, max_size=40))
def test_describe_matches_zero_filled_definition(values: list[float | None]) -> None:
    x = np.array([np.nan if v is None else v for v in values])
    s = describe_groups(x[None, None, :])
    present = [v for v in values if v is not None]
    if not present:
        assert s.n[0, 0] == 0 and math.isnan(s.mean[0, 0])
        return
    filled = [0.0 if v is None else v for v in values]
    mean = spec_sum(filled) / len(present)
    assert s.mean[0, 0] == mean
    assert s.max[0, 0] == max(present) and s.min[0, 0] == min(present)
    assert s.median[0, 0] == float(np.median(present))
    if len(present) > 1:
        sq = [0.0 if v is None else (mean - v) * (mean - v) for v in values]
        assert s.std[0, 0] == math.sqrt(spec_sum(sq) / (len(present) - 1))
    else:
        assert math.isnan(s.std[0, 0])


def test_quantile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(0)
    for n in range(1, 60):
        v = np.sort(rng.standard_normal(n))
        for p in (0.25, 0.75):
            assert quantile_linear(v, p) == float(np.quantile(v, p))


def test_t_interval_hand_checked_values() -> None:
    # docs/nemo-gym-compat.md §Worked example: blackjack across-repeats reward
    assert t_interval(0.2, 0.48989794855663565, 5) == (-1.1601747613165114, 1.5601747613165113)
    assert t_interval(1.0, 0.0, 5) == (1.0, 1.0)
    assert t_interval(1.0, 0.5, 1) is None


def test_t_interval_equals_scipy_stats() -> None:
    from scipy.stats import t

    for df in (1, 2, 7, 30, 999):
        low, high = t_interval(0.5, 0.25, df + 1)  # type: ignore[misc]
        assert low == t.ppf((1 - 0.95) / 2, df) * 0.25 + 0.5
        assert high == t.ppf((1 + 0.95) / 2, df) * 0.25 + 0.5


def test_welch_interval_equals_scipy_stats() -> None:
    """``ttest_ind(equal_var=False)``'s interval to the bit, on 0/1, uniform, wide, rounded
    and nearly constant values, and on two constant samples (no variance: df 1, se 0)."""
    from scipy.stats import ttest_ind

    rng = np.random.default_rng(3)

    def draw(kind: int) -> list[float]:
        n = int(rng.integers(2, 40))
        values = [
            rng.integers(0, 2, n).astype(float),
            rng.random(n),
            rng.uniform(-1e6, 1e6, n),
            np.round(rng.random(n), 2),
            rng.normal(100, 1e-3, n),
        ][kind]
        return [float(v) for v in values]

    cases = [([1.0, 1.0], [0.0, 0.0]), ([0.5] * 3, [0.5] * 2)]
    cases += [(draw(i % 5), draw(i % 5)) for i in range(500)]
    for a, b in cases:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's "precision loss" on constant samples
            ci = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert welch_interval(a, b) == (float(ci.low), float(ci.high))
