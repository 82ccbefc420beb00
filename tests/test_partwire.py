"""Parts sent over the wire merge into the very profile the parts themselves give, and bytes
that are not such a part are refused in one clear line."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract.events import Input, Rollout
from rewardstream.processors.core.profile import build_profile
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.engine import runs
from rewardstream.processors.engine.partwire import (
    VERSION,
    PartFormatError,
    ReceivedPart,
    decode_parts,
    encode_parts,
)
from rewardstream.processors.engine.runs import Merged, Part, PartView, merge_parts
from rewardstream.sinks.files import ProfilePaths, write_profile

ME = {"group": "g", "run_id": "r"}

number = st.one_of(
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.integers(-(2**63), 2**63 - 1),  # beyond 2**53: exact ints travel beside the floats
    st.floats(-1e6, 1e6, allow_nan=False),
)
text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)


def _row(task: int, rollout: int, agent: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    ref = {"name": agent} if agent else None
    return {**extra, "agent_ref": ref, "_ng_task_index": task, "_ng_rollout_index": rollout}


@st.composite
def collections(draw: st.DrawFn) -> tuple[list[Input], list[Rollout]]:
    """Input events and rollout events for a subset of their keys, several result schemas
    (non-ASCII columns, usage, masked rows), some rollouts sent twice."""
    keys = draw(st.sets(st.tuples(st.integers(-3, 6), st.integers(0, 3)), max_size=25))
    agents = [None, "agent-ä", "b", "エージェント"]
    # a task's rows under several agents: fan-out (docs/nemo-gym-compat.md §Run labels)
    mixed = draw(st.booleans())
    inputs, rollouts = [], []
    for line, (task, rollout) in enumerate(sorted(keys)):
        agent = agents[(task + rollout * mixed) % len(agents)]
        extra = {"prompt": draw(text), "ключ": draw(text)}
        inputs.append(Input(run_id="r", line=line, row=_row(task, rollout, agent, extra)))
        if not draw(st.integers(0, 4)):
            continue  # no result yet: a partial profile
        result: dict[str, Any] = {"reward": draw(number)}
        for column in draw(st.lists(st.sampled_from(["score", "größe", "flag", "ok"]))):
            result[column] = draw(number)
        if draw(st.booleans()):
            result["response"] = {"usage": {"input_tokens": draw(st.integers(0, 99))}}
        if draw(st.integers(0, 5)) == 0:
            result["mask_sample"] = True
        result |= {"_ng_task_index": task, "_ng_rollout_index": rollout}
        record = extract_result(result, task, rollout)
        rollouts += [
            Rollout(
                run_id="r", task=task, rollout=rollout, agent=agent, record=record, published_at=0.0
            )
        ] * draw(st.integers(1, 2))
    return inputs, rollouts


_FRAME = 8  # the length before each part of a body


def _one(
    part: Part, identity: Mapping[str, str | int], expect: Mapping[str, str | int]
) -> ReceivedPart:
    """``part`` sent alone (every sample row goes: no results beside it) and received."""
    return decode_parts(encode_parts([(part, identity)]), expect)[0]


def _parts(folder: Path, inputs: list[Input], rollouts: list[Rollout], units: int) -> list[Part]:
    """The events spread over ``units`` input and as many rollout parts, a task per unit."""
    ins = [Part(folder / f"input-{i}.spill") for i in range(units)]
    outs = [Part(folder / f"rollout-{i}.spill") for i in range(units)]
    for event in inputs:
        ins[event.row["_ng_task_index"] % units].add_input(event)
    for i, part in enumerate(outs):
        mine = [event for event in rollouts if event.task % units == i]
        for at in range(0, len(mine), 3):  # batches, as the processor applies them
            part.add_rollouts(mine[at : at + 3])
    return ins + outs


def _written(merged: Merged, folder: Path) -> list[bytes]:
    folder.mkdir(exist_ok=True)
    paths = ProfilePaths.next_to(folder / "rollouts.jsonl")
    write_profile(build_profile(merged.state, allow_partial=True), paths, merged.sample)
    return [path.read_bytes() for path in paths]


@settings(max_examples=60, deadline=None)
@given(collections(), st.integers(1, 3), st.sampled_from([1 << 20, 150, 1]))
def test_decoded_parts_merge_into_the_same_profile(
    events: tuple[list[Input], list[Rollout]], units: int, chunk: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(runs, "_INFO_CHUNK", chunk):
        folder = Path(tmp)
        parts = _parts(folder, *events, units)
        one = [_one(p, {**ME, "unit": i}, ME) for i, p in enumerate(parts)]  # none filtered
        body = encode_parts([(p, {**ME, "unit": i}) for i, p in enumerate(parts)])
        many = decode_parts(body, ME)
        assert [r.header["unit"] for r in many] == list(range(len(parts)))
        expected = _written(merge_parts(parts), folder / "local")
        for received in (one, many):
            views: list[PartView] = list(received)
            assert _written(merge_parts(views), folder / "received") == expected
        for part, got in zip(parts, many, strict=True):
            assert (got.inputs, got.rollouts, got.duplicates) == (
                part.inputs,
                part.rollouts,
                part.duplicates,
            )
            assert got.state.live() == part.live()
        if chunk == 1 and events[1]:
            assert any(p.state.info_taken for p in parts)  # entries were moved to the spill
        for part in parts:
            part.close()


def test_a_decoded_state_is_whole_and_its_indices_are_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs, "_INFO_CHUNK", 1)  # every entry goes to the spill
    part = Part(tmp_path / "rollout-0.spill")
    record = extract_result({"reward": 1.0}, 0, 0)
    part.add_rollouts(
        [Rollout(run_id="r", task=0, rollout=0, agent="a", record=record, published_at=0.0)]
    )
    assert part.state.info_taken
    state = _one(part, {}, {}).state
    state.add_record(1, 0, record, "a")  # dedupes against the decoded names and schemas
    assert (state.names, len(state.schemas), state.num_results) == (["a"], 1, 2)
    assert state.live()["a"].rollouts == 2
    assert state.info_taken == 0 and b"".join(state.info_segments()) == record.info * 2


def test_the_owner_keeps_ingesting_after_an_encode(tmp_path: Path) -> None:
    """The encoded bytes are a copy: neither they nor the decoded part pin the owner's arrays
    (``array.extend`` raises ``BufferError`` while a view of the array lives)."""
    inputs, rollouts = Part(tmp_path / "input-0.spill"), Part(tmp_path / "rollout-0.spill")
    record = extract_result({"reward": 0.5}, 0, 0)
    sent: list[ReceivedPart] = []
    for task in range(50):
        inputs.add_input(Input(run_id="r", line=task, row=_row(task, 0, "a", {"q": task})))
        rollouts.add_rollouts(
            [Rollout(run_id="r", task=task, rollout=0, agent="a", record=record, published_at=0.0)]
        )
        sent += [_one(part, {}, {}) for part in (inputs, rollouts)]
    assert [r.state.num_inputs for r in sent[::2]] == list(range(1, 51))
    assert sent[0].state.num_inputs == 1 and inputs.state.num_inputs == 50
    reader = sent[-2].sample_reader()
    assert reader is not None and reader(0) == b'{"q":0,"agent_ref":{"name":"a"}}'


def test_an_answer_sends_only_the_samples_a_profile_can_read(tmp_path: Path) -> None:
    """With a task's results beside its rows, only rows up to its first unmasked result can be
    sampled: here 14 rows of 40; every row whose results are not in yet (task 9) goes."""
    inputs, rollouts = Part(tmp_path / "input-0.spill"), Part(tmp_path / "rollout-0.spill")
    for line, (task, rollout) in enumerate((t, r) for t in range(10) for r in range(4)):
        inputs.add_input(Input(run_id="r", line=line, row=_row(task, rollout, "a", {"q": line})))
        masked = {"mask_sample": True} if (task, rollout) == (3, 0) else {}
        if task < 9:
            record = extract_result({"reward": 1.0, **masked}, task, rollout)
            rollouts.add_rollout(
                Rollout(
                    run_id="r",
                    task=task,
                    rollout=rollout,
                    agent="a",
                    record=record,
                    published_at=0.0,
                )
            )
    sent = decode_parts(encode_parts([(inputs, ME), (rollouts, ME)]), ME)[0]
    read = sent.sample_reader()
    assert read is not None
    readable = []
    for line, locator in enumerate(sent.state.column(sent.state.in_locator).tolist()):
        try:
            assert read(locator) == orjson.dumps({"q": line, "agent_ref": {"name": "a"}})
            readable.append(line)
        except PartFormatError as exc:
            assert "no sample row" in str(exc)
    assert readable == [0, 4, 8, 12, 13, 16, 20, 24, 28, 32, 36, 37, 38, 39]


@pytest.fixture
def wire(tmp_path: Path) -> bytes:
    part = Part(tmp_path / "input-0.spill")
    for task in range(3):
        part.add_input(Input(run_id="r", line=task, row=_row(task, 0, "a", {"q": task})))
    return encode_parts([(part, ME)])[_FRAME:]  # one part, without its length


def _edited(data: bytes, **fields: Any) -> bytes:
    line, _, rest = data.partition(b"\n")
    return orjson.dumps(orjson.loads(line) | fields) + b"\n" + rest


def _refused(data: bytes, expect: Mapping[str, str | int] = ME) -> str:
    with pytest.raises(PartFormatError) as info:
        decode_parts(len(data).to_bytes(_FRAME, "big") + data, expect)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("junk", [b"", b"hello", b"\xff\xfe\n", b"[1]\n", b'{"format":"x"}\n'])
def test_bytes_that_are_no_part_are_refused(junk: bytes) -> None:
    assert _refused(junk).startswith("not a rewardstream.part body")


@pytest.mark.parametrize("version", [VERSION + 1, 0])
def test_another_version_is_refused(wire: bytes, version: int) -> None:
    assert _refused(_edited(wire, v=version)) == (
        f"part format v{version} is not one this processor reads (v{VERSION}); "
        "run the same rewardstream version on every processor"
    )


def test_another_byte_order_is_refused(wire: bytes) -> None:
    assert "big-endian, this processor's are little-endian" in _refused(
        _edited(wire, byteorder="big")
    )


def test_a_part_for_another_processor_is_refused(wire: bytes) -> None:
    message = _refused(wire, {"group": "b", "run_id": "r"})
    assert message == "the part is for group 'g', this processor's group is 'b'"
    assert _refused(wire, {"unit": 3}) == "the part names no unit, this processor's unit is 3"


def test_truncated_or_oversized_parts_are_refused(wire: bytes) -> None:
    assert _refused(wire[:-1]).startswith("the part is truncated")
    assert _refused(wire + b"x").startswith("the part is oversized")
    for body in (b"\0\0\0", (len(wire) + 1).to_bytes(8, "big") + wire):
        with pytest.raises(PartFormatError, match=r"^the parts are truncated: part 0 has"):
            decode_parts(body, ME)


def test_inconsistent_columns_are_refused(tmp_path: Path) -> None:
    part = Part(tmp_path / "input-0.spill")
    part.add_input(Input(run_id="r", line=0, row=_row(0, 0, "a", {"q": 0})))
    part.state.in_task.append(1)  # one task more than rows
    message = _refused(encode_parts([(part, ME)])[_FRAME:])
    assert message.startswith("the part's state is unusable: inconsistent columns")
    assert message.endswith("'in_rollout' holds 1 of the state's 2 inputs")


def test_an_exact_int_that_is_not_its_value_is_refused(tmp_path: Path) -> None:
    part = Part(tmp_path / "rollout-0.spill")
    record = extract_result({"n": 2**60 + 1, "_ng_task_index": 0, "_ng_rollout_index": 0}, 0, 0)
    part.add_rollouts([Rollout(run_id="r", task=0, rollout=0, record=record, published_at=0.0)])
    part.state.big_value[0] += 2**20  # no longer what the pool's float rounds
    message = _refused(encode_parts([(part, ME)])[_FRAME:])
    assert message.endswith("inconsistent columns: an exact int is not one of the pool's")


def test_identity_fields_cannot_shadow_the_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inputs"):
        encode_parts([(Part(tmp_path / "p"), {"inputs": 3})])
