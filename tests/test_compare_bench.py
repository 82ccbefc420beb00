"""bench/compare_bench.py can fail: A/A comparisons with the product's intervals pass its judge;
with the planted textbook two-sample interval of the difference checked after every rollout
pair they say ``better`` or ``worse`` too often and the judge reports it;
and the A/B figures are what they claim (better is said, the fixed-size test has its power)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy import special

from bench.compare_bench import judged, null, power
from bench.coverage_bench import Setting

F64 = npt.NDArray[np.float64]

SETTING = Setting("binary", 0.5, 1.0, "shuffled", tasks=100, repeats=8)


def _textbook(n: F64, total: F64, spread: F64, alpha: float) -> tuple[F64, F64]:
    """Each run's part of the textbook two-sample interval of the difference, valid at one
    moment fixed in advance only: asked at ``alpha / 2``, the half-width ``z_(1 - alpha/2) s
    / sqrt(n)`` over sqrt(2), so that two of them add up to ``z_(1 - alpha/2) sqrt(s_A^2 / n
    + s_B^2 / n)`` for runs of equal spread."""
    half = special.ndtri(1 - alpha) * np.sqrt(spread) / n / np.sqrt(2)
    return total / n - half, total / n + half


def test_the_product_passes_the_judge() -> None:
    outcome = null(SETTING, 1000, 0.95, seed=5)
    assert judged([outcome], 0.95) == []
    assert outcome.ever[0.0] <= 0.05 and outcome.ever[0.01] <= outcome.ever[0.0]


def test_a_planted_narrow_interval_is_a_finding() -> None:
    outcome = null(SETTING, 1000, 0.95, seed=5, interval=_textbook)
    findings = judged([outcome], 0.95)
    assert any("better or worse said in" in f for f in findings), (outcome, findings)
    assert outcome.ever[0.0] > 0.15, outcome


def test_a_real_difference_is_found_and_the_fixed_size_is_a_fair_yardstick() -> None:
    p = power(Setting("binary", 0.5, 50.0, "shuffled", tasks=250), 0.2, 300, 0.95, seed=6)
    assert p.never[0.0] < 0.05 and p.fixed[0.0] < p.median[0.0] < 8 * p.fixed[0.0]
    assert 0.72 < p.fixed_power[0.0] < 0.88  # 80% within the simulation's noise
