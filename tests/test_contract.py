"""The wire contract: hot-path encoders write the models' bytes; decoding validates."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rewardstream.contract import (
    InputEvent,
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
    task_key,
)


def test_fast_encoders_equal_model_encoding() -> None:
    row = {"q": "é", "_ng_task_index": 3, "_ng_rollout_index": 1, "x": [1.5, None]}
    assert encode_input("r", 7, row) == encode(InputEvent(run_id="r", line=7, row=row))
    assert decode_input(encode_input("r", 7, row)).row == row
    result = {"reward": True, "response": {"usage": {"input_tokens": 3}}}
    fast = encode_rollout("r", 3, 1, None, result, 12.5)
    model = RolloutEvent(run_id="r", task=3, rollout=1, result=result, published_at=12.5)
    assert fast == encode(model)
    assert decode_rollout(fast) == model


def test_control_events_round_trip() -> None:
    started = RunStarted(run_id="r", expected_rollouts=4, output_stem="rollouts")
    assert decode_control(encode(started)) == started
    assert decode_control(encode(RunFinished(run_id="r"))) == RunFinished(run_id="r")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":2,"run_id":"r","type":"run_finished"}',  # unknown schema version
        b'{"v":1,"run_id":"","type":"run_finished"}',  # empty run id
        b'{"v":1,"run_id":"../etc","type":"run_finished"}',  # would leave the output folder
        b'{"v":1,"run_id":"..","type":"run_finished"}',
        b'{"v":1,"run_id":"r","type":"run_started","expected_rollouts":1,"output_stem":"../x"}',
        b'{"v":1,"run_id":"r","type":"nope"}',
    ],
)
def test_bad_control_events_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_control(raw)


def test_topics_and_keys() -> None:
    assert Topics.for_prefix("p") == Topics("p.inputs", "p.rollouts", "p.control", "p.dead-letters")
    assert task_key(42) == b"42"
    assert task_key(-1) == b"-1"
