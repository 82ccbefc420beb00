"""bench/coverage_bench.py can fail: an interval that undercovers is reported, the product's
is not, a fold in arrival order (what rewardstream did before) is reported where wrong rollouts
are slower, and the fixed-sample contrast undercovers as the docs say."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bench.coverage_bench import Setting, arrival_fold, judged, measure
from rewardstream.processors.core.confseq import bernoulli_interval, eb_interval

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

SETTING = Setting("binary", 0.5, 1.0, "collector", tasks=100, repeats=8)
HARSH = Setting("binary", 0.5, 50.0, "collector", tasks=100, repeats=8, in_flight=256, slower=3)
"""Many rollouts in flight, wrong ones 3x slower: the first to arrive are the right ones."""


def _narrowed(lower: F64, upper: F64) -> tuple[F64, F64]:
    middle, half = (lower + upper) / 2, (upper - lower) / 2
    return middle - half / 2, middle + half / 2


def _half_as_wide(n: F64, total: F64, spread: F64, alpha: float) -> tuple[F64, F64]:
    return _narrowed(*eb_interval(n, total, spread, alpha))


def _task_half_as_wide(successes: I64, trials: I64, alpha: float) -> tuple[F64, F64]:
    return _narrowed(*bernoulli_interval(successes, trials, alpha))


def test_the_product_sequence_passes_the_judge() -> None:
    outcome = measure(SETTING, 1000, 0.95, seed=3)
    assert judged([outcome], 0.95) == []
    assert outcome.sequence >= 0.95 and outcome.task is not None and outcome.task >= 0.95


def test_a_planted_narrow_interval_is_a_finding() -> None:
    outcome = measure(SETTING, 1000, 0.95, seed=3, interval=_half_as_wide)
    findings = judged([outcome], 0.95)
    assert len(findings) == 1 and "sequence covered in" in findings[0], findings


def test_a_planted_narrow_task_interval_is_a_finding() -> None:
    outcome = measure(SETTING, 1000, 0.95, seed=3, task_interval=_task_half_as_wide)
    findings = judged([outcome], 0.95)
    assert len(findings) == 1 and "task covered in" in findings[0], findings


def test_a_fixed_sample_interval_peeked_at_undercovers() -> None:
    outcome = measure(
        Setting("binary", 0.5, 50.0, "shuffled", tasks=100, repeats=20), 1000, 0.95, seed=4
    )
    assert outcome.t_every_100 < 0.90 < outcome.sequence


def test_the_arrival_order_fold_is_a_finding_where_wrong_rollouts_are_slower() -> None:
    """The fault dispatch order fixes: folded as results arrive, the right (fast) ones first,
    the sequence leans high and misses; folded in dispatch order it holds."""
    planted = measure(HARSH, 500, 0.95, seed=5, fold=arrival_fold)
    findings = judged([planted], 0.95)
    assert len(findings) == 1 and "collector 256 x3: sequence covered in" in findings[0]
    assert planted.sequence < 0.5 and planted.sequence == planted.arrival
    product = measure(HARSH, 500, 0.95, seed=5)
    assert judged([product], 0.95) == [] and product.sequence >= 0.95
    assert product.arrival == planted.arrival  # the contrast column: the same fold, measured
