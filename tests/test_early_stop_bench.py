"""bench/early_stop_bench.py can fail: the product's rules pass its judge; a task rule that
decides one rollout too early and an agent rule on an interval half as wide are reported; and
the simulated collector dispatches as the real one does (rollout-major, in flight, no row
after its decision)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.early_stop_bench import DIFFICULTIES, collect, judged, measure
from rewardstream.processors.core import stopping
from rewardstream.processors.core.confseq import Interval, Tally
from rewardstream.processors.core.stopping import StopRule

UNIFORM = DIFFICULTIES[0]
_product_place = stopping.task_place
_product_interval = Tally.interval


def _one_rollout_early(total: float, n: int, rule: StopRule) -> stopping.Reason | None:
    """Decides as if the next rollout had come in, scoring the running mean."""
    return _product_place(total + total / n, n + 1, rule)


def _half_as_wide(self: Tally, level: float = 0.95) -> Interval | None:
    now = _product_interval(self, level)
    if now is None:
        return None
    middle, half = (now.lower + now.upper) / 2, (now.upper - now.lower) / 2
    return Interval(middle - half / 2, middle + half / 2)


def test_the_product_rules_pass_the_judge() -> None:
    band = measure(UNIFORM, "binary", StopRule(16, band=(0.2, 0.8)), 3, 500, seed=1)
    agent = measure(UNIFORM, "binary", StopRule(16, half_width=0.05), 100, 2000, seed=2)
    assert judged([band, agent], 0.95) == []
    assert min(band.saved) > 0.1 and band.mismatches == [0, 0, 0]
    assert sum(agent.covered) / len(agent.covered) > 0.97 and min(agent.saved) > 0.9


def test_a_task_rule_deciding_one_rollout_early_is_a_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stopping, "task_place", _one_rollout_early)
    outcome = measure(UNIFORM, "binary", StopRule(16, band=(0.2, 0.8)), 3, 500, seed=1)
    findings = judged([outcome], 0.95)
    assert findings and all("curate keeps" in f for f in findings), findings


def test_an_agent_rule_at_half_the_width_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Tally, "interval", _half_as_wide)
    outcome = measure(UNIFORM, "binary", StopRule(16, half_width=0.05), 300, 2000, seed=2)
    assert sum(outcome.covered) / len(outcome.covered) < 0.94  # far enough from a fluke
    assert judged([outcome], 0.95) == [
        f"h 0.05: the full mean inside the interval in "
        f"{sum(outcome.covered) / len(outcome.covered):.4f} of runs"
    ]


def test_rows_are_dispatched_rollout_major_and_never_after_their_decision() -> None:
    """Task 0 always right, task 1 always wrong, task 2 alternating, 8 repeats, one in flight:
    with the band [0.2, 0.8] the first two are settled after 7 (6 of 8 would still allow
    6/8), the third after two of each."""
    rewards = np.array([[1.0] * 8, [0.0] * 8, [1.0, 0.0] * 4])
    run = collect(rewards, np.ones_like(rewards), StopRule(8, band=(0.2, 0.8)), in_flight=1)
    assert run.got.sum(axis=1).tolist() == [7, 7, 4]
    # rollout-major: every task's repeat 0 before any repeat 1; collected rows are prefixes
    assert all(row[: row.sum()].all() for row in run.got)
    wide = collect(rewards, np.ones_like(rewards), StopRule(8, band=(0.2, 0.8)), in_flight=64)
    assert wide.got.all()  # every row dispatched before the first result: nothing saved
