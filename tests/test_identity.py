"""Content is identity: an event whose (run, task, rollout) key was folded already is a duplicate
only when its content is the same; with other content it is a conflict, reported, never
dropped as a duplicate (issue 24, finding 2)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import orjson
import pytest

from rewardstream.contract import (
    Input,
    Rollout,
    content_digest,
    content_sum,
    decode_input,
    decode_rollout,
    encode,
)
from rewardstream.processors.pipeline import EventKind, Pipeline, Rejected
from rewardstream.processors.records import extract_result
from rewardstream.processors.runs import Part
from rewardstream.sinks.metrics import Metrics


def _rollout(task: int, rollout: int, reward: float = 1.0, at: float = 0.0) -> bytes:
    row = {"reward": reward, "_ng_task_index": task, "_ng_rollout_index": rollout}
    record = extract_result(row, task, rollout)
    event = Rollout(run_id="r", task=task, rollout=rollout, record=record, published_at=at)
    return encode(event)


def _input(task: int, rollout: int, question: str = "q", line: int = 0) -> bytes:
    row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "question": question}
    return encode(Input(run_id="r", line=line, row=row))


def _metrics(pipeline: Pipeline) -> Metrics:
    return Metrics(lambda: pipeline.runs)


def _rejected(metrics: Metrics, kind: str, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "rewardstream_events_rejected_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def _apply(pipeline: Pipeline, kind: EventKind, batches: list[list[bytes]], batch: bool) -> None:
    """Apply the batches to unit ``<kind>-0``, as batches or one event at a time."""
    at = 0
    for raws in batches:
        if batch:
            handle = pipeline.handle_rollouts if kind == "rollout" else pipeline.handle_inputs
            assert handle(raws, f"{kind}-0", at) is not None
        else:
            for i, raw in enumerate(raws):
                pipeline.handle(kind, raw, f"{kind}-0", at + i)
        at += len(raws)


@pytest.mark.parametrize("batch", [False, True])
def test_a_rollout_of_a_folded_key_is_a_duplicate_only_with_the_same_content(
    tmp_path: Path, batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    rejected: list[Rejected] = []
    with Pipeline(tmp_path, rejected.append) as pipeline:
        pipeline.metrics = metrics = _metrics(pipeline)
        first = [_rollout(0, 0), _rollout(0, 1), _rollout(1, 0)]
        again = [
            _rollout(0, 0, at=99.0),  # republished: a duplicate (published_at is no content)
            _rollout(0, 1, reward=0.0),  # same key, other reward: a conflict
            _rollout(2, 0),  # new
            _rollout(2, 0, reward=0.5),  # same key as the one before it, in one batch
        ]
        _apply(pipeline, "rollout", [first, again], batch)
        run = pipeline.runs["r"]
        assert (run.rollouts, run.duplicates) == (4, 1)
        assert [r.reason for r in rejected] == ["conflict", "conflict"]
        assert [r.raw for r in rejected] == [again[1], again[3]]
        assert "run 'r' task 0 rollout 1" in rejected[0].detail
        assert "--run-id" in rejected[0].detail
        assert _rejected(metrics, "rollout", "conflict") == 2
        part = pipeline.units["rollout-0"].parts["r"]
        assert part.conflicts == 2
        # the first content stands
        assert part.state.pool.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_a_conflict_is_an_error_line_naming_run_task_and_rollout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Pipeline(tmp_path) as pipeline, caplog.at_level(logging.WARNING):
        pipeline.handle("rollout", _rollout(3, 2), "rollout-0", 0)
        pipeline.handle("rollout", _rollout(3, 2, reward=0.0), "rollout-0", 1)
    [line] = [r for r in caplog.records if "conflict" in r.getMessage()]
    assert line.levelno == logging.ERROR
    assert "run 'r' task 3 rollout 2" in line.getMessage()


@pytest.mark.parametrize("batch", [False, True])
def test_an_input_row_of_a_folded_key_is_a_duplicate_only_with_the_same_content(
    tmp_path: Path, batch: bool
) -> None:
    rejected: list[Rejected] = []
    with Pipeline(tmp_path, rejected.append) as pipeline:
        pipeline.metrics = metrics = _metrics(pipeline)
        first = [_input(0, 0, line=0), _input(0, 1, line=1)]
        again = [
            _input(0, 0, line=0),  # the same row again
            _input(0, 1, question="other", line=1),  # other content
            _input(0, 1, line=5),  # the same row at another line of the inputs file
        ]
        _apply(pipeline, "input", [first, again], batch)
        run = pipeline.runs["r"]
        assert (run.inputs, run.duplicates) == (2, 1)
        assert [(r.kind, r.reason, r.raw) for r in rejected] == [
            ("input", "conflict", again[1]),
            ("input", "conflict", again[2]),
        ]
        assert "run 'r' task 0 rollout 1" in rejected[0].detail
        assert _rejected(metrics, "input", "conflict") == 2


def test_a_key_looked_up_again_after_more_keys_came_is_judged_by_its_own_content(
    tmp_path: Path,
) -> None:
    """The key index is built on the first repeat and kept up to date after it, whatever the
    indices (packed, or not: negative or large rollout indices, huge task indices)."""
    keys = [(t, r) for t in range(300) for r in (0, 1, 4095, 4096, -1)] + [(2**62, 3)]
    rng = random.Random(0)
    rng.shuffle(keys)
    part = Part(tmp_path / "s")
    half = len(keys) // 2
    reward = {key: float(rng.random()) for key in keys}
    for key in keys[:half]:
        assert part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
    assert not part.add_rollout(decode_rollout(_rollout(*keys[0], reward=reward[keys[0]])))
    for key in keys[half:]:
        assert part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
    for key in rng.sample(keys, 200):
        assert not part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
        assert not part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key] + 1)))
    assert (part.duplicates, part.conflicts) == (201, 200)


def test_a_parts_content_is_the_sum_of_its_keys_digests_whatever_the_order(
    tmp_path: Path,
) -> None:
    rollouts = [_rollout(t, r, reward=t * 0.5 + r) for t in range(20) for r in range(3)]
    inputs = [_input(t, r, line=3 * t + r) for t in range(20) for r in range(3)]
    want = content_sum(
        [content_digest(decode_rollout(raw)) for raw in rollouts]
        + [content_digest(decode_input(raw)) for raw in inputs]
    )
    for seed in range(3):
        rng = random.Random(seed)
        shuffled = rng.sample(rollouts, len(rollouts)) + rng.sample(rollouts, 10)
        with Pipeline(tmp_path / str(seed)) as pipeline:
            for raw in shuffled:
                pipeline.handle("rollout", raw, f"rollout-{rng.randrange(1)}")
            for raw in rng.sample(inputs, len(inputs)):
                pipeline.handle("input", raw, "input-0")
            parts = pipeline.runs["r"].parts.values()
            assert content_sum(p.contents.total for p in parts) == want


def test_the_digest_reads_content_not_bytes_nor_publish_time() -> None:
    spaced = _rollout(1, 2).replace(b'"info":{"', b'"info":{ "')
    assert spaced != _rollout(1, 2)
    same = {content_digest(decode_rollout(raw)) for raw in (_rollout(1, 2), spaced)}
    same.add(content_digest(decode_rollout(_rollout(1, 2, at=5.0))))
    assert len(same) == 1
    others = [_rollout(1, 3), _rollout(2, 2), _rollout(1, 2, reward=2.0)]
    assert len({content_digest(decode_rollout(raw)) for raw in others} | same) == 4
    row = orjson.loads(_input(1, 2))["row"]
    assert content_digest(decode_input(_input(1, 2))) == content_digest(
        Input(run_id="other", line=0, row=row)
    )
