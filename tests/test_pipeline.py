"""The shared event pipeline: goldens fed as events give the batch profiler's exact files."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from bench.generate import generate
from rewardstream.contract.events import EventKind
from rewardstream.processors.engine.pipeline import Pipeline, RemoteUnit
from rewardstream.processors.engine.runs import Counts, Done
from rewardstream.processors.http.snapshot import SnapshotJob
from rewardstream.processors.inprocess import finish
from rewardstream.producers.events import rollout_event
from rewardstream.sinks.snapshot_wire import receive
from tests.golden import (
    OUTPUT_SUFFIXES,
    GoldenCase,
    file_events,
    golden_events,
    profiled_cases,
)

CASES = profiled_cases()


def _assert_golden_files(pipeline: Pipeline, case: GoldenCase, folder: Path) -> None:
    assert pipeline.runs["run-1"].done
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (folder / name).read_bytes() == (case.expected / name).read_bytes(), name


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
            if run is not None:  # None: redelivered after the final (rejected, not dropped)
                finish(pipeline, run)
    _assert_golden_files(pipeline, case, tmp_path / "run-1")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_events_in_batches_give_the_golden_files(case: GoldenCase, tmp_path: Path) -> None:
    partial = case.name.endswith("+allow_partial")
    events = golden_events(case, "run-1", finish=partial)
    rng, again = random.Random(3), 0
    with Pipeline(tmp_path) as pipeline:
        for kind, batch in (
            ("input", pipeline.handle_inputs),
            ("rollout", pipeline.handle_rollouts),
        ):
            raws = [raw for k, raw in events if k == kind]
            again += len(raws[:5])
            raws += raws[:5]  # redelivered: counted once
            start = 0
            while start < len(raws):
                size = rng.randint(1, 40)
                runs = batch(raws[start : start + size], f"{kind}-0")
                assert runs is not None and [r.run_id for r in runs] == ["run-1"]
                start += size
        for kind, raw in events:
            if kind == "control":
                pipeline.handle(kind, raw)
        finish(pipeline, pipeline.runs["run-1"])
    _assert_golden_files(pipeline, case, tmp_path / "run-1")
    assert pipeline.runs["run-1"].duplicates == again


def test_a_batch_with_an_event_to_reject_or_rewrite_applies_nothing(tmp_path: Path) -> None:
    events = _collection(tmp_path)
    rollouts = [raw for kind, raw in events if kind == "rollout"][:10]
    spaced = rollouts[1].replace(b'"info":{"', b'"info":{ "')  # valid, not orjson's bytes
    with Pipeline(tmp_path / "out", max_event_bytes=max(map(len, rollouts)) + 100) as pipeline:
        inputs = [raw for kind, raw in events if kind == "input"]
        assert pipeline.handle_inputs(inputs, "input-0") is not None  # rows first: they count
        for odd in (b"not json", spaced, rollouts[2] + b" " * 4096):  # the last: oversized
            assert pipeline.handle_rollouts([rollouts[0], odd], "rollout-0") is None
            assert "rollout-0" not in pipeline.units
        runs = pipeline.handle_rollouts(rollouts[:2], "rollout-0")
        assert runs is not None and runs[0].rollouts == 2
        assert pipeline.handle("rollout", spaced, "rollout-0") is not None  # one by one: kept
        assert runs[0].rollouts == 2 and runs[0].duplicates == 1


def test_a_batch_of_inputs_with_one_to_reject_applies_nothing(tmp_path: Path) -> None:
    inputs = [raw for kind, raw in _collection(tmp_path) if kind == "input"][:10]
    nested = b"[" * 300 + b"0" + b"]" * 300  # orjson reads it, but writes 254 levels at most
    deep = inputs[5].replace(b'"row":{', b'"row":{"x":%b,' % nested)
    no_key = inputs[1].replace(b'"_ng_task_index"', b'"_ng_task"')
    limit = max(map(len, inputs)) + 1000
    with Pipeline(tmp_path / "out", max_event_bytes=limit) as pipeline:
        rejected = pipeline.rejected
        for odd in (b"not json", b"", deep, no_key, inputs[2] + b" " * 4096, b"1,2"):
            assert pipeline.handle_inputs([inputs[0], odd], "input-0") is None
            assert "run" not in pipeline.runs
        runs = pipeline.handle_inputs(inputs[:2], "input-0")
        assert runs is not None and runs[0].inputs == 2
        assert pipeline.handle("input", deep, "input-0") is None  # one by one: rejected
        assert pipeline.handle_inputs(inputs[:3], "input-0") is not None
        assert (runs[0].inputs, runs[0].duplicates) == (3, 2)
    assert ["cannot be written back as JSON" in r.detail for r in rejected] == [True]


def test_bad_events_are_rejected_with_reason(tmp_path: Path) -> None:
    with Pipeline(tmp_path) as pipeline:
        rejected = pipeline.rejected
        assert pipeline.handle("rollout", b"not json") is None
        assert pipeline.handle("input", b'{"run_id":"r","line":0,"row":{}}') is None
        assert pipeline.handle("control", b'{"type":"run_started","run_id":"r"}') is None
    assert [r.kind for r in rejected] == ["rollout", "input", "control"]
    assert [r.reason for r in rejected] == ["not-json", "missing-id", "invalid-event"]
    assert "_ng_task_index" in rejected[1].detail
    assert rejected[0].raw == b"not json"


def _collection(tmp_path: Path) -> list[tuple[EventKind, bytes]]:
    """A small generated collection (three agents) as wire events, RunStarted last."""
    data = tmp_path / "data"
    generate(tasks=40, repeats=3, out=data / "r", text_bytes=50, seed=1)
    return file_events(data / "r_materialized_inputs.jsonl", data / "r.jsonl", "run", "r", False)


def _feed(pipeline: Pipeline, events: list[tuple[EventKind, bytes]]) -> None:
    """Apply ``events`` through two units per topic (by task parity), as two partitions."""
    for kind, raw in events:
        unit = None if kind == "control" else f"{kind}-{_task(raw) % 2}"
        run = pipeline.handle(kind, raw, unit)
        if run is not None:  # None: rejected (e.g. after the run's final)
            finish(pipeline, run)


def test_a_done_run_keeps_its_counts_only_and_later_events_are_rejected(tmp_path: Path) -> None:
    events, out = _collection(tmp_path), tmp_path / "out"
    with Pipeline(out) as pipeline:
        rejected = pipeline.rejected
        _feed(pipeline, events[:-1])
        run = pipeline.runs["run"]
        live, tasks = run.live(), run.tasks_complete()
        _feed(pipeline, events[-1:])  # RunStarted: complete, so written and retired
        assert run.done and all(p.final is not None for p in run.parts.values())
        assert not list((out / "run" / ".state").glob("*.spill"))  # spills gone
        assert (run.rollouts, run.inputs, tasks) == (120, 120, 40)
        assert (run.live(), run.tasks_complete()) == (live, tasks)  # metrics keep their values
        paths = pipeline.paths(run)
        written = [p.read_bytes() for p in paths]
        job = SnapshotJob(pipeline, "run")  # a done run's snapshot: its final files
        with open(job.fd, "rb") as fh:
            head = receive(fh, tmp_path / "snap", "test")
        assert job.wait() == 0 and (head.rollouts, head.inputs) == (120, 120)
        assert [(tmp_path / "snap" / p.name).read_bytes() for p in paths] == written
        late = rollout_event(
            {"reward": 1.0, "_ng_task_index": 500, "_ng_rollout_index": 0}, "run", Path("x"), 1
        )
        _feed(pipeline, [*events[:-1], ("rollout", late.value)])  # republished, one never seen
        assert (run.rollouts, run.inputs, run.duplicates) == (120, 120, 0)
        # none dropped silently; the one of no row of the final is that, not just late
        assert [r.reason for r in rejected] == ["run-final"] * 240 + ["unknown-key"]
        assert [p.read_bytes() for p in paths] == written


def test_a_replay_skips_what_the_final_covers_and_rejects_what_came_after(tmp_path: Path) -> None:
    """After a restart a unit is read again from its committed offset: the events of a run
    whose final record is known are replays up to the record's cut, dead letters after it."""
    events = _collection(tmp_path)
    data = [(k, raw) for k, raw in events if k != "control"]
    with Pipeline(tmp_path / "out") as pipeline:
        rejected = pipeline.rejected
        units = {"input-0": 0, "rollout-0": 0}
        done = Done(120, 120, {}, {"input-0": 120, "rollout-0": 100}, "r")
        pipeline.mark_final("run", done)
        for kind, raw in [*data, *data[-5:]]:
            unit = f"{kind}-0"
            assert pipeline.handle(kind, raw, unit, units[unit]) is None
            units[unit] += 1
        run = pipeline.runs["run"]
        assert (run.replays, len(rejected), run.parts) == (220, 25, {})
        assert {r.reason for r in rejected} == {"run-final"}


def test_a_finished_run_waits_while_its_end_offsets_are_unknown(tmp_path: Path) -> None:
    """A processor that reads ``run_finished`` before it knows the data partitions (just after
    a restart) must not write a partial final profile from what it holds so far."""
    with Pipeline(tmp_path) as pipeline:
        run = pipeline.run("r")
        run.finished, run.finish_at = True, None
        assert not pipeline.ready(run)
        run.finish_at = {"rollout-0": 5}
        assert not pipeline.ready(run)
        run.finish_at = {}
        assert pipeline.ready(run)


def test_a_run_first_seen_after_the_peers_were_heard_still_counts_their_parts(
    tmp_path: Path,
) -> None:
    """A restarted leader may meet a run only after it read its peers' member records; the
    run must still count the peers' parts, or ``run_finished`` would end it without them."""
    events, out = _collection(tmp_path), tmp_path / "out"
    data = events[:-1]
    odd = [e for e in data if _task(e[1]) % 2 == 1]
    with Pipeline(out) as leader:
        counts = Counts(
            sum(1 for k, _ in odd if k == "input"), sum(1 for k, _ in odd if k == "rollout")
        )
        leader.set_remote({"rollout-1": RemoteUnit(50, {"run": counts}, {})})  # before the run
        _feed(leader, [e for e in data if _task(e[1]) % 2 == 0] + events[-1:])
        run = leader.runs["run"]
        assert (run.rollouts, run.inputs) == (120, 120) and run.complete
        assert finish(leader, run) is None  # parts elsewhere: the Kafka processor's job


def _task(raw: bytes) -> int:
    event = orjson.loads(raw)
    return int(event.get("task", event.get("row", {}).get("_ng_task_index")))


def _key(raw: bytes) -> tuple[int, int]:
    """A rollout event's (task, rollout)."""
    event = orjson.loads(raw)
    return event["task"], event["rollout"]


def test_a_run_that_cannot_be_profiled_is_tried_again_only_after_new_events(
    tmp_path: Path,
) -> None:
    """Not with every batch: a leader would log the same error a few times a second."""
    events = _collection(tmp_path)
    inputs: list[tuple[EventKind, bytes]] = [(k, raw) for k, raw in events if k == "input"]
    rollouts: list[tuple[EventKind, bytes]] = [(k, raw) for k, raw in events if k == "rollout"]
    started = [(k, raw) for k, raw in events if k == "control"]
    far = 2**62  # a key the profile cannot place: indices spanning too wide a range
    row = orjson.loads(inputs[0][1])
    key = (row["row"]["_ng_task_index"], row["row"]["_ng_rollout_index"])
    at = next(i for i, (_, r) in enumerate(rollouts) if _key(r) == key)
    wrong = orjson.loads(rollouts[at][1])
    row["row"]["_ng_task_index"], wrong["task"] = far, far
    inputs[0], rollouts[at] = ("input", orjson.dumps(row)), ("rollout", orjson.dumps(wrong))
    with Pipeline(tmp_path / "out") as pipeline:
        for kind, raw in [*inputs[1:], *rollouts]:
            pipeline.handle(kind, raw)
        run = pipeline.handle(*started[0])
        assert run is not None and run.expected is not None
        assert run.rollouts == run.inputs == run.expected - 1
        pipeline.handle(*inputs[0])  # its row comes last: the rollout held counts now
        assert run.complete and pipeline.ready(run)
        assert finish(pipeline, run) is None and run.error is not None
        assert "span too wide" in run.error
        assert not pipeline.ready(run)  # the same events: the same error
        pipeline.handle(*inputs[0])  # a duplicate changes nothing
        assert not pipeline.ready(run)
