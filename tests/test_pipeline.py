"""The shared event pipeline: goldens fed as events give the batch profiler's exact files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from processors.pipeline import Pipeline, Rejected, Snapshot
from tests.golden import GOLDEN, OUTPUT_SUFFIXES, GoldenCase, golden_cases, golden_events

CASES = (
    [c for c in golden_cases() if not (c.expected / "error.txt").exists()]
    if GOLDEN.exists()
    else []
)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_events_in_any_order_give_the_golden_files(case: GoldenCase, tmp_path: Path) -> None:
    partial = case.name.endswith("+allow_partial")
    evs = golden_events(case, "run-1", finish=partial)
    shuffled = evs[:-1] if partial else list(evs)
    random.Random(7).shuffle(shuffled)
    if partial:
        shuffled.append(evs[-1])  # "collection finished" comes last
    with Pipeline(tmp_path) as pipeline:
        for kind, raw in shuffled + shuffled[:3]:  # redelivered events count once
            run = pipeline.handle(kind, raw)
            assert run is not None
            pipeline.maybe_finish(run)
        assert pipeline.runs["run-1"].done
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (tmp_path / "run-1" / name).read_bytes() == (case.expected / name).read_bytes(), name


def test_bad_events_are_rejected_with_reason(tmp_path: Path) -> None:
    rejected: list[Rejected] = []
    with Pipeline(tmp_path, on_reject=rejected.append) as pipeline:
        assert pipeline.handle("rollout", b"not json") is None
        assert pipeline.handle("input", b'{"run_id":"r","line":0,"row":{}}') is None
        assert pipeline.handle("control", b'{"type":"run_started","run_id":"r"}') is None
    assert [r.kind for r in rejected] == ["rollout", "input", "control"]
    assert "_ng_task_index" in rejected[1].reason
    assert rejected[0].raw == b"not json"


def test_snapshot_wire_form_round_trips_and_rejects_other_bodies() -> None:
    snap = Snapshot("r", 3, 4, {"rollout-0": 9}, {"a.jsonl": b'{"x":1}\n', "b.json": b"[]"})
    assert Snapshot.from_bytes(snap.to_bytes()) == snap
    for body in (b'{"status":"ok"}', snap.to_bytes() + b"x", b"<html>"):
        with pytest.raises((ValueError, TypeError, KeyError)):
            Snapshot.from_bytes(body)
