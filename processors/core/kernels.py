"""Bit-exact numeric kernels: the same float64 operations, in the same order, as NeMo Gym.

NeMo Gym computes with pandas/numpy, so every sum is numpy's pairwise sum over the group's
values in (task, rollout) key order (docs/nemo-gym-compat.md §Numeric kernels). ``ndarray.sum``
over the last axis of a C-contiguous array performs exactly that pairwise sum per row
(``tests/test_kernels.py`` checks it against a scalar transcription of those rules), which lets
thousands of equal-sized groups be summed in one vectorised call instead of one call per group.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "GroupStats",
    "Summary",
    "builtin_sum",
    "describe_groups",
    "pairwise_sum",
    "quantile_int64",
    "quantile_linear",
    "summarize_present",
    "t_interval",
    "welch_interval",
]

F64 = npt.NDArray[np.float64]


class GroupStats(NamedTuple):
    """Per (column, group) descriptive stats; NaN where a stat is undefined (then omitted)."""

    n: npt.NDArray[np.int64]
    mean: F64
    max: F64
    min: F64
    median: F64
    std: F64


def pairwise_sum(values: F64) -> float:
    """numpy's pairwise sum of a 1-D float64 array (the reference's summation order)."""
    return float(np.ascontiguousarray(values, dtype=np.float64).sum())


@np.errstate(over="ignore", invalid="ignore")  # huge values overflow to inf, as in pandas
def describe_groups(values: F64, complete: bool | None = None) -> GroupStats:
    """Stats of ``values[c, g, :]`` for every column ``c`` and group ``g`` (NaN = missing).

    Mean: zero-filled pairwise sum over all rows / present count (pandas' nanmean). Std: ddof=1,
    squared deviations zero-filled for missing rows, pairwise-summed (pandas' nanvar). Median,
    max and min are over the present values only. ``complete``: whether every value of the
    batch these columns come from is present (None: these values say); it picks how the middle
    values are found, which decides whether a median of ``0.0`` and ``-0.0`` is written
    with its sign, so columns described apart must be told what the whole batch had.
    """
    present = ~np.isnan(values)
    count = present.sum(axis=-1)
    filled = np.where(present, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(axis=-1) / count
        diff = mean[..., None] - filled
        sq = np.where(present, diff * diff, 0.0)
        var = sq.sum(axis=-1) / (count - 1)
    std = np.sqrt(np.where(count > 1, var, np.nan))
    mx = np.fmax.reduce(values, axis=-1)
    mn = np.fmin.reduce(values, axis=-1)
    n = values.shape[-1]
    if complete is None:
        complete = bool(present.all())
    if n and complete:  # the common case: partition, O(n), at the two middle slots
        ordered = np.partition(values, sorted({max(n // 2 - 1, 0), n // 2}), axis=-1)
    else:
        ordered = np.sort(values, axis=-1)  # NaN sorts last
    hi_idx = np.clip(count // 2, 0, max(values.shape[-1] - 1, 0))
    lo_idx = np.clip(count // 2 - 1 + (count % 2), 0, max(values.shape[-1] - 1, 0))
    if values.shape[-1]:
        hi = np.take_along_axis(ordered, hi_idx[..., None], axis=-1)[..., 0]
        lo = np.take_along_axis(ordered, lo_idx[..., None], axis=-1)[..., 0]
        median = np.where(count % 2 == 1, hi, (lo + hi) / 2.0)
        median = np.where(count > 0, median, np.nan)
    else:
        median = np.full(count.shape, np.nan)
    return GroupStats(count.astype(np.int64), mean, mx, mn, median, std)


class Summary(NamedTuple):
    """Stats of the present values of one column (repeat level and across repeats)."""

    n: int
    mean: float
    median: float
    std: float
    se: float
    min: float
    max: float
    p25: float
    p75: float
    ci: tuple[float, float] | None


def quantile_linear(ordered: F64, p: float) -> float:
    """numpy's default (linear) quantile of sorted values, with its two-sided lerp."""
    n = len(ordered)
    h = (n - 1) * p
    lo = math.floor(h)
    g = h - lo
    if g == 0 or lo == n - 1:
        return float(ordered[lo])
    a, b = float(ordered[lo]), float(ordered[lo + 1])
    d = b - a
    return a + d * g if g < 0.5 else b - d * (1 - g)


def builtin_sum(items: Iterable[Any]) -> Any:
    """CPython >= 3.12's ``sum(items)`` on any Python (NeMo Gym runs on 3.13), transcribed from
    its ``Objects/bltinmodule.c``: ints exactly while only ints come, then floats with
    Neumaier's compensation (an int item after that is added as a float, uncompensated)."""
    if sys.version_info >= (3, 12):
        return sum(items)
    it = iter(items)
    result: Any = 0
    for item in it:
        result = result + item
        if type(result) is float:
            break
    else:
        return result
    f, c = result, 0.0
    for x in it:
        if type(x) is float:
            t = f + x
            c += (f - t) + x if abs(f) >= abs(x) else (x - t) + f
            f = t
        else:
            f += float(x)
    if c and math.isfinite(c):
        f += c
    return f


def quantile_int64(values: list[int], p: float) -> float:
    """numpy's linear quantile of an int64 column (pandas keeps all-int columns so): the gap
    between the two order statistics is taken in int64, wrapping as numpy's does, before the
    float lerp; beyond 2**53 that differs from :func:`quantile_linear` of the rounded floats."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * p
    lo = math.floor(h)
    g = h - lo
    if g == 0 or lo == len(ordered) - 1:
        return float(ordered[lo])
    a, b = ordered[lo], ordered[lo + 1]
    d = float((b - a + 2**63) % 2**64 - 2**63)
    return float(a) + d * g if g < 0.5 else float(b) - d * (1 - g)


@lru_cache(maxsize=4096)
def _t_ppf(q: float, df: float) -> float:
    # scipy.stats.t.ppf(q, df) is stdtrit(df, q) * 1 + 0; scipy.special imports ~10x faster
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


_Q_LO = (1 - 0.95) / 2  # 0.025000000000000022 in binary64, as in the reference
_Q_HI = (1 + 0.95) / 2


def t_interval(mean: float, se: float, n: int) -> tuple[float, float] | None:
    """95 % Student-t interval; (mean, mean) when se == 0; None when n <= 1."""
    if n <= 1:
        return None
    if se == 0:
        return (mean, mean)
    return (_t_ppf(_Q_LO, n - 1) * se + mean, _t_ppf(_Q_HI, n - 1) * se + mean)


_SQUARE = np.asarray(2.0)  # scipy raises deviations to a 0-d float64 2: numpy's power loop


def _sample_variance(x: F64) -> float:
    """scipy's ddof-1 variance: the mean squared deviation, times n / (n - 1)."""
    squared = np.power(x - np.mean(x, keepdims=True), _SQUARE)
    n = float(len(x))
    return float(np.mean(squared)) * (n / (n - 1))


@np.errstate(divide="ignore", invalid="ignore")  # zero variances: df is 0 / 0, then 1
def welch_interval(a: Iterable[float], b: Iterable[float]) -> tuple[float, float]:
    """95 % Welch interval for mean(a) - mean(b), as ``scipy.stats.ttest_ind(a, b,
    equal_var=False).confidence_interval()`` computes it; each side needs 2 or more values.
    The squares of the degrees of freedom are numpy scalar powers (C ``pow``), which differ
    from a product in the last bit."""
    x, y = np.fromiter(a, np.float64), np.fromiter(b, np.float64)
    vx = np.float64(_sample_variance(x) / len(x))
    vy = np.float64(_sample_variance(y) / len(y))
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    se = math.sqrt(vx + vy)
    estimate = float(np.mean(x) - np.mean(y))
    dof = 1.0 if math.isnan(df) else float(df)
    return (_t_ppf(_Q_LO, dof) * se + estimate, _t_ppf(_Q_HI, dof) * se + estimate)


@np.errstate(over="ignore", invalid="ignore")  # huge values overflow to inf, as in pandas
def summarize_present(values: F64) -> Summary | None:
    """Repeat-level stats over the present (non-NaN) values, dropped rather than zero-filled."""
    x = np.ascontiguousarray(values[~np.isnan(values)], dtype=np.float64)
    n = len(x)
    if n == 0:
        return None
    mean = pairwise_sum(x) / n
    if n > 1:
        d = mean - x
        std = math.sqrt(pairwise_sum(d * d) / (n - 1))
    else:
        std = 0.0
    se = std / n**0.5
    mid = n // 2
    needed = {0, n - 1, max(mid - 1, 0), mid}
    for p in (0.25, 0.75):
        lo = math.floor((n - 1) * p)
        needed |= {lo, min(lo + 1, n - 1)}
    ordered = np.partition(x, sorted(needed))  # only these order statistics are read
    median = float(ordered[mid]) if n % 2 else (float(ordered[mid - 1]) + float(ordered[mid])) / 2
    return Summary(
        n=n,
        mean=mean,
        median=median,
        std=std,
        se=se,
        min=float(ordered[0]),
        max=float(ordered[-1]),
        p25=quantile_linear(ordered, 0.25),
        p75=quantile_linear(ordered, 0.75),
        ci=t_interval(mean, se, n),
    )
