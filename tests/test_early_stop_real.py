"""bench/early_stop_real.py, small: a real collection through ng_run's servers, the collector,
a broker and a processor stops early with the curated tasks unchanged; and its judge reports a
planted difference (a check counts only if it can fail)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.early_stop_real import run


def _args(plant: bool) -> argparse.Namespace:
    """40 tasks x 6 at ~80 rows/s (the policy's default 50 ms, 4 in flight): a task settles
    after its second repeat, and its later ones come 40 rows (~0.5 s) apart, so the processor
    would have to lag by seconds for no row to be skipped."""
    return argparse.Namespace(
        tasks=40, repeats=6, parallel=4, band=(0.1, 0.9), latency=0.05, plant=plant
    )


@pytest.mark.kafka
@pytest.mark.parametrize("plant", [False, True])
async def test_a_real_collection_stops_early_with_the_same_curated_tasks(
    kafka_bootstrap: str, tmp_path: Path, plant: bool
) -> None:
    result = await run(_args(plant), tmp_path, kafka_bootstrap)
    if plant:
        assert result["problems"] == ["the curated tasks differ from the full collection's"]
        return
    assert result["problems"] == [], result
    assert 0 < result["saved"] < 1 and result["kept_tasks"] > 0
