"""The soak (bench/soak.py) in miniature against the real broker: every run profiled in turn,
compared runs equal to ``ng_reward_profile``, the memory samples written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import Plan, soak

pytestmark = pytest.mark.kafka


def test_a_small_soak_profiles_every_run_and_samples_memory(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    plan = Plan(runs=3, tasks=150, repeats=2, partitions=2, ahead=1, compare=frozenset({0, 2}))
    summary = soak(plan, kafka_bootstrap, tmp_path / "work", tmp_path / "results", idle_s=1.0)
    assert (summary["rollouts"], summary["equal_to_batch"]) == (900, ["soak-000", "soak-002"])
    assert [r["run"] for r in summary["per_run"]] == [0, 1, 2]
    lines = (tmp_path / "results" / "soak-memory.csv").read_text().splitlines()
    assert lines[0].startswith("t,rss_mib,rollouts") and len(lines) > 2
