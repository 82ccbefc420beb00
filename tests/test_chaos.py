"""Fast fault-injection trials (``bench/chaos.py``): every fault kind once or twice, on small
collections, with real processes and a real broker. The full runs are in RELIABILITY.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import FAST, run_trial
from bench.generate import generate
from processors.checkpoint import CheckpointStore
from processors.pipeline import Pipeline
from processors.runs import Unit
from tests.golden import file_events


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


def test_a_restart_from_a_checkpoint_older_than_the_final_keeps_the_run_whole(
    tmp_path: Path,
) -> None:
    """What ``kill -9`` after the final profile but before the next checkpoint leaves
    (``kill-processor`` seed 15, ``group-rebalance`` seed 9, RELIABILITY.md): the restarted
    processor must report the run neither short of the rollouts its profile holds, nor
    holding their replay as duplicates, in all and per unit."""
    data, out = tmp_path / "data", tmp_path / "out"
    generate(tasks=20, repeats=2, out=data / "r", text_bytes=50, seed=2)
    *body, started = file_events(
        data / "r_materialized_inputs.jsonl", data / "r.jsonl", "run", "r", finish=False
    )
    store, cut = CheckpointStore(out / ".checkpoint"), len(body) - 15
    with Pipeline(out) as first:
        for kind, raw in [started, *body[:cut]]:
            first.handle(kind, raw)
        for unit in first.units.values():  # the last checkpoint: 15 rollouts short
            store.save(unit)
        for kind, raw in body[cut:]:
            run = first.handle(kind, raw)
            assert run is not None
            first.maybe_finish(run)
        assert first.runs["run"].done  # final profile written; killed before a checkpoint
    with Pipeline(out) as second:
        for name in ("input-0", "rollout-0"):
            loaded = store.load(name)
            assert loaded is not None
            second.adopt(loaded)
        for kind, raw in [started, *body[cut:]]:  # the replay after the checkpoint
            second.handle(kind, raw)
        run = second.runs["run"]
        assert (run.done, run.rollouts, run.inputs, run.duplicates) == (True, 40, 40, 0)
        parts = second.units["input-0"].parts["run"], second.units["rollout-0"].parts["run"]
        assert [(p.inputs, p.rollouts) for p in parts] == [(40, 0), (0, 40)]
        for kind, raw in body:  # republished: every event now a duplicate
            second.handle(kind, raw)
        assert (run.rollouts, run.inputs, run.duplicates) == (40, 40, len(body))
