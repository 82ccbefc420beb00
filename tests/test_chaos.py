"""Fast fault-injection trials (``bench/chaos.py``): every fault kind once or twice, on small
collections, with real processes and a real broker. The full runs are in RELIABILITY.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import FAST, run_trial
from processors.checkpoint import CheckpointStore
from processors.runs import Unit


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("fault", "seed"),
    [
        ("kill-processor", 1),  # aimed at a checkpoint write in progress
        ("group-rebalance", 0),
        ("publisher-rerun", 0),
        ("disorder", 1),  # two processors in one group
    ],
)
def test_trial_loses_nothing_and_counts_nothing_twice(
    kafka_bootstrap: str, tmp_path: Path, fault: str, seed: int
) -> None:
    result = run_trial(fault, seed, kafka_bootstrap, tmp_path / "trial", FAST)
    assert result.ok, result.line()


@pytest.mark.kafka
def test_broker_restart_trial(tmp_path: Path) -> None:
    """Its own broker, stopped and started again on the same data dir mid-run."""
    result = run_trial("broker-restart", 1, None, tmp_path / "trial", FAST)
    assert result.ok, result.line()


def test_a_zombie_never_rolls_a_checkpoint_back(tmp_path: Path) -> None:
    """A processor paused past its session timeout still holds a unit the group gave to
    another: its checkpoint, behind the new owner's, must not be written (``pause-member``)."""
    store = CheckpointStore(tmp_path / ".checkpoint")
    owner, zombie = Unit("rollout-0", tmp_path), Unit("rollout-0", tmp_path)
    owner.position, zombie.position = 900, 400
    assert store.save(owner)
    zombie.dirty = True
    assert not store.save(zombie) and not zombie.dirty
    unit = store.load("rollout-0")
    assert unit is not None and unit.position == 900
    owner.position = 1000  # the owner moves on as before
    assert store.save(owner)
