"""The shared event pipeline: goldens fed as events give the batch profiler's exact files."""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
import pytest

from processors.pipeline import EventKind, Pipeline, Rejected
from processors.records import slim_result
from processors.state import row_key
from rewardstream.contract import InputEvent, RolloutEvent, RunFinished, RunStarted, encode
from tests.golden import GOLDEN, OUTPUT_SUFFIXES, GoldenCase, golden_cases

CASES = (
    [c for c in golden_cases() if not (c.expected / "error.txt").exists()]
    if GOLDEN.exists()
    else []
)


def events(case: GoldenCase, run_id: str, finish: bool) -> list[tuple[EventKind, bytes]]:
    rows = [
        orjson.loads(x)
        for x in (case.source / f"{case.stem}_materialized_inputs.jsonl").read_bytes().splitlines()
    ]
    results = [
        orjson.loads(x) for x in (case.source / f"{case.stem}.jsonl").read_bytes().splitlines()
    ]
    out: list[tuple[EventKind, bytes]] = [
        ("input", encode(InputEvent(run_id=run_id, line=i, row=r))) for i, r in enumerate(rows)
    ]
    for r in results:
        task, rollout = row_key(r)
        event = RolloutEvent(
            run_id=run_id,
            task=task,
            rollout=rollout,
            result=slim_result(r),
            published_at=time.time(),
        )
        out.append(("rollout", encode(event)))
    out.append(
        (
            "control",
            encode(RunStarted(run_id=run_id, expected_rollouts=len(rows), output_stem=case.stem)),
        )
    )
    if finish:
        out.append(("control", encode(RunFinished(run_id=run_id))))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_events_in_any_order_give_the_golden_files(case: GoldenCase, tmp_path: Path) -> None:
    partial = case.name.endswith("+allow_partial")
    evs = events(case, "run-1", finish=partial)
    shuffled = evs[:-1] if partial else list(evs)
    random.Random(7).shuffle(shuffled)
    if partial:
        shuffled.append(evs[-1])  # "collection finished" comes last
    with Pipeline(tmp_path) as pipeline:
        for kind, raw in shuffled + shuffled[:3]:  # redelivered events count once
            tracker = pipeline.handle(kind, raw)
            assert tracker is not None
            pipeline.maybe_finish(tracker)
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
