"""The wire contract: hot-path encoders write the models' bytes; decoding validates, and the
fast rollout decoder accepts exactly what the model accepts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from processors.records import ResultRecord
from rewardstream.contract import (
    Input,
    InputEvent,
    Rollout,
    RolloutEvent,
    RunFinished,
    RunStarted,
    Topics,
    decode_control,
    decode_input,
    decode_rollout,
    encode,
    encode_input,
    encode_rollout,
    rollout_of,
    task_key,
)


def test_fast_encoders_equal_model_encoding() -> None:
    row = {"q": "é", "_ng_task_index": 3, "_ng_rollout_index": 1, "x": [1.5, None]}
    assert encode_input("r", 7, row) == encode(InputEvent(run_id="r", line=7, row=row))
    assert decode_input(encode_input("r", 7, row)).row == row
    record = ResultRecord(("reward", "n"), (True, True), (1.0, 3.0), b'{"reward":true}', False)
    fast = encode_rollout("r", 3, 1, None, record, 12.5)
    assert fast == encode(RolloutEvent.model_validate(orjson.loads(fast)))
    assert decode_rollout(fast) == Rollout("r", 3, 1, None, record, 12.5)


def test_control_events_round_trip() -> None:
    started = RunStarted(run_id="r", expected_rollouts=4, output_stem="rollouts")
    assert decode_control(encode(started)) == started
    assert decode_control(encode(RunFinished(run_id="r"))) == RunFinished(run_id="r")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":1,"run_id":"r","type":"run_finished"}',  # an older schema version
        b'{"v":2,"run_id":"","type":"run_finished"}',  # empty run id
        b'{"v":2,"run_id":"../etc","type":"run_finished"}',  # would leave the output folder
        b'{"v":2,"run_id":"..","type":"run_finished"}',
        b'{"v":2,"run_id":"r","type":"run_started","expected_rollouts":1,"output_stem":"../x"}',
        b'{"v":2,"run_id":"r","type":"nope"}',
    ],
)
def test_bad_control_events_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_control(raw)


def test_topics_and_keys() -> None:
    assert Topics.for_prefix("p") == Topics("p.inputs", "p.rollouts", "p.control", "p.dead-letters")
    assert task_key(42) == b"42"
    assert task_key(-1) == b"-1"


_GOOD: dict[str, Any] = orjson.loads(
    encode_rollout(
        "run-1",
        7,
        2,
        "agent",
        ResultRecord(("reward", "tokens"), (False, True), (0.5, 12.0), b'{"reward":0.5}', False),
        1.5,
    )
)
_PATHS: list[tuple[str, ...]] = [
    ("v",),
    ("run_id",),
    ("type",),
    ("task",),
    ("rollout",),
    ("agent",),
    ("published_at",),
]
_PATHS += [("record",), *(("record", k) for k in ("names", "ints", "values", "info", "masked"))]
_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # what orjson writes
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(["run\n", "ré", "a" * 201, ".x", "rollout", "x y"]),
    st.lists(st.one_of(st.text(max_size=3), st.booleans(), st.floats(-9, 9), st.integers(-9, 9))),
    st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
)


def _edited(event: dict[str, Any], edits: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """``event`` with each (path, value) set, or removed where the value is KeyError."""
    event = copy.deepcopy(event)
    for path, value in edits:
        target = event
        for key in path[:-1]:
            target = target[key] if isinstance(target.get(key), dict) else {}
        if value is KeyError:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return event


def _model_unless_rejected(
    model: type[BaseModel], decode: Callable[[bytes], object], event: dict[str, Any]
) -> Any:
    """The validated model of ``event``, or None when the model rejects it, after checking
    that the fast decoder rejects it too."""
    try:
        return model.model_validate(event)
    except ValidationError:
        with pytest.raises(ValueError):
            decode(orjson.dumps(event))
        return None


_EDITS = st.lists(
    st.tuples(st.sampled_from(_PATHS), st.one_of(_ODD, st.just(KeyError))), max_size=3
)


@settings(max_examples=500, deadline=None)
@given(_EDITS)
def test_fast_rollout_decoding_accepts_exactly_what_the_model_accepts(
    edits: list[tuple[tuple[str, ...], Any]],
) -> None:
    event = _edited(_GOOD, edits)
    model = _model_unless_rejected(RolloutEvent, decode_rollout, event)
    if model is None:
        return
    decoded = decode_rollout(orjson.dumps(event))
    assert decoded.run_id == model.run_id and decoded.task == model.task
    assert decoded.record.values == tuple(map(float, model.record.values))
    assert decoded.record.info == orjson.dumps(model.record.info)


_RAW = orjson.dumps(_GOOD)


def _model_path(raw: bytes) -> Rollout | None:
    """What the model alone makes of ``raw`` (None: rejected)."""
    try:
        return rollout_of(RolloutEvent.model_validate(orjson.loads(raw)))
    except ValueError:
        return None


@pytest.mark.parametrize(
    "raw",
    [
        _RAW,
        b" " + _RAW.replace(b",", b" , ") + b"\n",  # spacing: info comes out canonical
        _RAW.replace(b'"v":2,', b'"v":2,"v":3,'),  # duplicate keys: the last one wins
        _RAW.replace(b'"task":7,', b'"task":7,"task":8,'),
        _RAW.replace(b'"reward":0.5}', b'"reward":1e400}'),  # infinite, in info
        _RAW.replace(b"0.5,12.0", b"0.5,1e400"),  # and in values
        _RAW.replace(b'"reward":0.5}', b'"reward":NaN}'),
        _RAW.replace(b'"reward":0.5}', b'"reward":"\xff"}'),  # invalid UTF-8, in info
        _RAW.replace(b'"agent"', b'"\xff"'),
        _RAW.replace(b'"reward":0.5}', b'"reward":"\\ud800"}'),  # a lone surrogate
        _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 300 + b"]" * 300 + b"}"),
        _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        _RAW.replace(b'{"reward":0.5}', b"[1]"),  # info not an object
        _RAW.replace(b"0.5,12.0", b"1,123456789012345678901234567890"),  # ints as values
        _RAW.replace(b'"published_at":1.5', b'"published_at":2'),
        _RAW.replace(b'"task":7', b'"task":9223372036854775808'),
        _RAW.replace(b'"task":7', b'"task":7.0'),
        _RAW.replace(b"[false,true]", b"[0,1]"),
        _RAW.replace(b'"v":2', b'"v":2.0'),
        b"\xef\xbb\xbf" + _RAW,  # a byte order mark
        _RAW + b"x",
    ],
)
def test_rollout_decoding_of_odd_bytes_equals_the_model_path(raw: bytes) -> None:
    expected = _model_path(raw)
    if expected is None:
        with pytest.raises(ValueError):
            decode_rollout(raw)
    else:
        assert decode_rollout(raw) == expected


_INPUT = orjson.loads(encode_input("run-1", 3, {"q": "x", "_ng_task_index": 1}))
_INPUT_PATHS: list[tuple[str, ...]] = [("v",), ("run_id",), ("type",), ("line",), ("row",)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_INPUT_PATHS), st.one_of(_ODD, st.just(KeyError)))))
def test_fast_input_decoding_accepts_exactly_what_the_model_accepts(
    edits: list[tuple[tuple[str, ...], Any]],
) -> None:
    event = _edited(_INPUT, edits)
    model = _model_unless_rejected(InputEvent, decode_input, event)
    if model is not None:
        assert decode_input(orjson.dumps(event)) == Input(model.run_id, model.line, model.row)
