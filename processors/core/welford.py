"""Running per-column statistics: Welford updates, Chan's merge.

These give live monitoring (Prometheus, partial glimpses) an O(1) read of mean, std, min and
max per agent while rollouts stream in. They are *not* used for the written profile: NeMo Gym's
numbers depend on numpy's pairwise summation order, so the final files are computed from the
kept values by :mod:`rewardstream.processors.core.kernels`; the two agree to ~1e-12 relative
(property-tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["Moments", "RunningStats"]


@dataclass
class Moments:
    """Welford state of one column: count, mean, sum of squared deviations, min, max."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def update(self, x: float) -> None:
        """Welford's single-value update."""
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)
        self.min = min(self.min, x)
        self.max = max(self.max, x)

    def merge(self, other: Moments) -> None:
        """Chan et al.'s pairwise combination of two partial states."""
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2 = other.count, other.mean, other.m2
            self.min, self.max = other.min, other.max
            return
        n = self.count + other.count
        delta = other.mean - self.mean
        self.mean += delta * other.count / n
        self.m2 += other.m2 + delta * delta * self.count * other.count / n
        self.count = n
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @classmethod
    @np.errstate(over="ignore", invalid="ignore")  # huge values overflow to inf: no warning
    def of(cls, values: npt.NDArray[np.float64]) -> Moments:
        """Two-pass state of a whole batch (cheaper than one update per value)."""
        if len(values) == 0:
            return cls()
        mean = float(values.mean())
        d = values - mean
        return cls(
            len(values), mean, float((d * d).sum()), float(values.min()), float(values.max())
        )

    @property
    def std(self) -> float:
        """Sample std (ddof=1); NaN with fewer than two values."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else math.nan


@dataclass
class RunningStats:
    """Moments per column name for one agent; a rollout counts once whatever its columns."""

    rollouts: int = 0
    columns: dict[str, Moments] = field(default_factory=dict)

    def merge(self, other: RunningStats) -> None:
        """Chan's merge, column by column (another part's stats of the same agent)."""
        self.rollouts += other.rollouts
        for name, moments in other.columns.items():
            self.columns.setdefault(name, Moments()).merge(moments)
