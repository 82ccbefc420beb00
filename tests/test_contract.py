"""The wire contract: each event is one msgspec struct that encodes the schema-2 bytes, decodes
what an independent transcription of the rules (the oracle below) accepts, rejects the rest for
the oracle's reason, and writes itself as JSON Schema."""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract.events import (
    BadEvent,
    Input,
    Rollout,
    RolloutRecord,
    RunFinished,
    RunStarted,
    Topics,
    checked,
    decode_control,
    decode_input,
    decode_rollout,
    decode_rollouts,
    encode,
    encode_input,
    encode_rollout,
    reject_reason,
    task_key,
)
from rewardstream.processors.core.records import ResultRecord, extract_result

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(), JSON_VALUES, max_size=6), st.integers(0, 2**40), st.booleans())
def test_encode_input_is_the_events_own_encoding(row: dict[str, Any], line: int, bad: bool) -> None:
    """The input encoder joins a head to the row's dump: the bytes (or the error) of
    ``encode(Input(...))``, a bad run id refused alike."""
    run_id = "run id" if bad else "run-1"
    try:
        want: Any = encode(Input(run_id=run_id, line=line, row=row))
    except (BadEvent, orjson.JSONEncodeError) as exc:
        want = (type(exc), str(exc))
    try:
        got: Any = encode_input(run_id, line, row)
    except (BadEvent, orjson.JSONEncodeError) as exc:
        got = (type(exc), str(exc))
    assert got == want


def test_encoders_write_the_schema_2_bytes() -> None:
    row = {"q": "é", "_ng_task_index": 3, "_ng_rollout_index": 1, "x": [1.5, None]}
    raw = encode_input("r", 7, row)
    assert raw == (
        b'{"v":2,"run_id":"r","type":"input","line":7,'
        b'"row":{"q":"\xc3\xa9","_ng_task_index":3,"_ng_rollout_index":1,"x":[1.5,null]}}'
    )
    assert encode(Input(run_id="r", line=7, row=row)) == raw
    assert decode_input(raw) == Input(run_id="r", line=7, row=row)
    record = ResultRecord(("reward", "n"), (True, True), (1.0, 1e16), b'{"reward":true}', False)
    raw = encode_rollout("r", 3, 1, None, record, 12.5)
    assert raw == (
        b'{"v":2,"run_id":"r","type":"rollout","task":3,"rollout":1,"agent":null,'
        b'"record":{"names":["reward","n"],"ints":[true,true],"values":[1.0,1e+16],'
        b'"info":{"reward":true},"masked":false},"published_at":12.5}'
    )  # orjson's numbers (msgspec would write 1e16)
    event = Rollout(run_id="r", task=3, rollout=1, agent=None, record=record, published_at=12.5)
    assert encode(event) == raw
    assert decode_rollout(raw) == event
    assert decode_rollouts([raw, raw]) == [event, event]


def test_exact_ints_travel_with_their_record() -> None:
    big = 2**62 + 1
    record = extract_result({"n": big, "reward": 1}, 0, 0)
    assert record.big == ((0, big),) and record.values[0] == float(big)
    raw = encode_rollout("r", 0, 0, None, record, 1.0)
    assert b'"big":[[0,4611686018427387905]]' in raw
    assert decode_rollout(raw).record == record
    assert b'"big"' not in encode_rollout("r", 0, 0, None, extract_result({"n": 2**53}, 0, 0), 1.0)
    for bad in (b"[[1,4611686018427387905]]", b"[[0,4611686018427387904000]]", b"[[0,7]]"):
        with pytest.raises(BadEvent, match=r"record\.big"):
            decode_rollout(raw.replace(b"[[0,4611686018427387905]]", bad))


def test_control_events_round_trip() -> None:
    started = RunStarted(run_id="r", expected_rollouts=4, output_stem="rollouts")
    assert encode(started) == (
        b'{"v":2,"run_id":"r","type":"run_started","expected_rollouts":4,"output_stem":"rollouts"}'
    )
    assert decode_control(encode(started)) == started
    assert decode_control(encode(RunFinished(run_id="r"))) == RunFinished(run_id="r")
    asked = RunStarted(
        run_id="r", expected_rollouts=4, output_stem="o", aggregate_metrics=True, answer_key="a"
    )
    assert encode(asked).endswith(b'"output_stem":"o","aggregate_metrics":true,"answer_key":"a"}')
    assert decode_control(encode(asked)) == asked


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"v":1,"run_id":"r","type":"run_finished"}', "schema-version"),  # older version
        (b'{"v":2,"run_id":"","type":"run_finished"}', "invalid-event"),  # empty run id
        (b'{"v":2,"run_id":"../etc","type":"run_finished"}', "invalid-event"),  # leaves the folder
        (b'{"v":2,"run_id":"..","type":"run_finished"}', "invalid-event"),
        (
            b'{"v":2,"run_id":"r","type":"run_started","expected_rollouts":1,"output_stem":"../x"}',
            "invalid-event",
        ),
        (b'{"v":2,"run_id":"r","type":"nope"}', "invalid-event"),
        (b'{"v":2,"type":"run_finished"}', "missing-id"),
    ],
)
def test_bad_control_events_are_rejected(raw: bytes, reason: str) -> None:
    with pytest.raises(BadEvent) as caught:
        decode_control(raw)
    assert reject_reason(caught.value) == reason


def test_a_struct_built_in_python_checks_its_names_and_checked_the_rest() -> None:
    with pytest.raises(BadEvent, match=r"matching regex .* - at `\$\.run_id`") as caught:
        RunStarted(run_id="../x", expected_rollouts=0, output_stem="r")
    assert (caught.value.field, caught.value.reason) == ("run_id", "invalid-event")
    with pytest.raises(BadEvent, match="at most 200 bytes") as caught:
        RunStarted(run_id="r", expected_rollouts=0, output_stem="é" * 101)  # 101 chars, 202 B
    assert caught.value.field == "output_stem"
    with pytest.raises(BadEvent, match="at most 200 bytes"):
        Input(run_id="é" * 101, line=0, row={})
    with pytest.raises(BadEvent) as caught:
        checked(RunStarted(run_id="r", expected_rollouts=-1, output_stem="r"))
    assert str(caught.value) == "Expected `int` >= 0 - at `$.expected_rollouts`"
    good = RunStarted(run_id="r", expected_rollouts=1, output_stem="r")
    assert checked(good) == good


def test_topics_and_keys() -> None:
    assert Topics.for_prefix("p") == Topics("p.inputs", "p.rollouts", "p.control", "p.dead-letters")
    assert task_key(42) == b"42"
    assert task_key(-1) == b"-1"


def test_each_event_writes_its_json_schema() -> None:
    schemas, components = msgspec.json.schema_components([Input, Rollout, RunStarted, RunFinished])
    assert [s["$ref"] for s in schemas] == [
        "#/$defs/Input",
        "#/$defs/Rollout",
        "#/$defs/RunStarted",
        "#/$defs/RunFinished",
    ]
    rollout, record = components["Rollout"], components["RolloutRecord"]
    assert list(rollout["properties"]) == list(json.loads(encode_rollout_example()))
    assert rollout["required"] == ["run_id", "task", "rollout", "record", "published_at"]
    assert rollout["additionalProperties"] is False
    assert rollout["properties"]["v"] == {"enum": [2], "default": 2}
    assert rollout["properties"]["run_id"]["pattern"] == r"^\w[\w.-]*$"
    assert rollout["properties"]["run_id"]["maxLength"] == 200
    assert rollout["properties"]["task"]["maximum"] == 2**63 - 1
    assert rollout["properties"]["record"] == {"$ref": "#/$defs/RolloutRecord"}
    assert "published_at" in rollout["description"]  # field docs: the class docstring
    assert list(record["properties"]) == [
        *("names", "ints", "values", "info", "masked", "answer", "big")
    ]
    assert record["required"] == [
        "names",
        "ints",
        "values",
        "info",
        "masked",
    ]  # answer, big: optional
    assert record["properties"]["info"] == {"type": "object"}
    assert record["properties"]["values"]["items"]["maximum"] == sys.float_info.max  # finite
    assert components["Input"]["properties"]["line"]["minimum"] == 0
    assert components["RunStarted"]["properties"]["output_stem"]["pattern"] == r"^[\w.-]+$"
    fields = ("names", "ints", "values", "info", "masked", "answer", "big")
    assert RolloutRecord.__struct_encode_fields__ == fields


def encode_rollout_example() -> bytes:
    record = ResultRecord(("reward",), (False,), (0.5,), b"{}", False)
    return encode_rollout("r", 0, 0, "a", record, 1.0)


# ---------------------------------------------------------------------------------- the oracle
# The rules, transcribed in plain Python over what orjson parses (the batch reader's JSON).
# A verdict is ("ok", fields), ("json", None) for a document that is not JSON by those rules,
# or ("reject", reason).

_INT64 = (-(2**63), 2**63 - 1)
_RUN_ID, _STEM = r"\w[\w.-]*", r"[\w.-]+"


def _int(x: Any, low: int = _INT64[0]) -> bool:
    return type(x) is int and low <= x <= _INT64[1]


def _number(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def _name(x: Any, pattern: str) -> bool:
    return type(x) is str and re.fullmatch(pattern, x) is not None and len(x.encode()) <= 200


def _envelope(d: Any, kind: str, ids: tuple[str, ...], fields: set[str]) -> str | None:
    """The reason shared by every event, or None: an object, ``v`` 2 (or absent), its ids, only
    its fields, ``type`` its own (or absent), a good run id."""
    if type(d) is not dict:
        return "invalid-event"
    v = d.get("v", 2)
    if type(v) is not int or v != 2:
        return "schema-version"
    if any(k not in d for k in ids):
        return "missing-id"
    if not set(d) <= fields | {"v", "run_id", "type"} or d.get("type", kind) != kind:
        return "invalid-event"
    return None if _name(d["run_id"], _RUN_ID) else "invalid-event"


def _parsed(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _NOT_JSON


_NOT_JSON = object()


def oracle_rollout(raw: bytes) -> tuple[str, Any]:
    d = _parsed(raw)
    if d is _NOT_JSON:
        return ("json", None)
    fields = {"task", "rollout", "agent", "record", "published_at"}
    reason = _envelope(d, "rollout", ("run_id", "task", "rollout"), fields)
    if reason:
        return ("reject", reason)
    rec, at = d.get("record"), d.get("published_at")
    ok = (
        _int(d["task"])
        and _int(d["rollout"])
        and (d.get("agent") is None or type(d["agent"]) is str)
        and _number(at)
        and type(rec) is dict
        and set(rec) - {"answer", "big"} == {"names", "ints", "values", "info", "masked"}
        and ("answer" not in rec or _int(rec["answer"]))
        and (
            type(rec.get("big", [])) is list
            and all(type(p) is list and len(p) == 2 for p in rec.get("big", []))
            and all(_int(c, 0) and _int(v) for c, v in rec.get("big", []))
        )
    )
    if not ok:
        return ("reject", "invalid-event")
    names, ints, values, info = rec["names"], rec["ints"], rec["values"], rec["info"]
    ok = (
        type(names) is list
        and all(type(n) is str for n in names)
        and type(ints) is list
        and all(type(i) is bool for i in ints)
        and type(values) is list
        and all(_number(x) for x in values)
        and len(names) == len(ints) == len(values)
        and type(rec["masked"]) is bool
        and type(info) is dict
    )
    if not ok:
        return ("reject", "invalid-event")
    big = tuple((c, v) for c, v in rec.get("big", []))
    exact = all(
        c < len(values) and ints[c] and float(v) == float(values[c]) and abs(v) > 2**53
        for c, v in big
    )
    if not exact:
        return ("reject", "invalid-event")
    try:
        info_bytes = orjson.dumps(info)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes
        return ("reject", "invalid-event")
    answer = rec.get("answer", -(2**63))
    record = (
        tuple(names),
        tuple(ints),
        tuple(map(float, values)),
        info_bytes,
        rec["masked"],
        answer,
        big,
    )
    return ("ok", (d["run_id"], d["task"], d["rollout"], d.get("agent"), record, float(at)))


def oracle_input(raw: bytes) -> tuple[str, Any]:
    d = _parsed(raw)
    if d is _NOT_JSON:
        return ("json", None)
    reason = _envelope(d, "input", ("run_id",), {"line", "row"})
    if reason:
        return ("reject", reason)
    if not ("line" in d and _int(d["line"], 0) and type(d.get("row")) is dict):
        return ("reject", "invalid-event")
    return ("ok", (d["run_id"], d["line"], d["row"]))


def oracle_control(raw: bytes) -> tuple[str, Any]:
    d = _parsed(raw)
    if d is _NOT_JSON:
        return ("json", None)
    kind = d.get("type") if type(d) is dict else None
    if kind not in ("run_started", "run_finished"):
        return ("reject", "invalid-event")
    started = {"expected_rollouts", "output_stem", "aggregate_metrics", "answer_key"}
    reason = _envelope(d, kind, ("run_id",), started if kind == "run_started" else set())
    if reason:
        return ("reject", reason)
    if kind == "run_finished":
        return ("ok", (kind, d["run_id"]))
    aggregates, answer_key = d.get("aggregate_metrics", False), d.get("answer_key")
    if not (
        _int(d.get("expected_rollouts"), 0)
        and _name(d.get("output_stem"), _STEM)
        and type(aggregates) is bool
        and (answer_key is None or type(answer_key) is str)
    ):
        return ("reject", "invalid-event")
    fields = (d["run_id"], d["expected_rollouts"], d["output_stem"], aggregates, answer_key)
    return ("ok", (kind, *fields))


def _verdict(decode: Any, raw: bytes) -> tuple[str, Any]:
    """What the decoder makes of ``raw``, as a verdict."""
    try:
        event = decode(raw)
    except orjson.JSONDecodeError as exc:
        assert reject_reason(exc) in ("not-json", "non-finite-number")
        return ("json", None)
    except BadEvent as exc:
        text = str(exc)
        assert "\n" not in text and text, text  # one line
        if exc.field:
            assert text.endswith(f" - at `$.{exc.field}`"), text
        return ("reject", reject_reason(exc))
    if isinstance(event, Rollout):
        fields = (event.run_id, event.task, event.rollout, event.agent, event.record)
        assert type(event.record) is ResultRecord
        return ("ok", (*fields, event.published_at))
    if isinstance(event, Input):
        return ("ok", (event.run_id, event.line, event.row))
    if isinstance(event, RunStarted):
        started = (event.run_id, event.expected_rollouts, event.output_stem)
        return ("ok", (event.type, *started, event.aggregate_metrics, event.answer_key))
    return ("ok", (event.type, event.run_id))


def _dumps(event: Any) -> bytes:
    """JSON of a test event (json, not orjson: ints beyond 64 bits too)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


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
    ("extra",),
]
_PATHS += [
    ("record",),
    *(("record", k) for k in ("names", "ints", "values", "info", "masked", "answer", "big")),
]
_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # what orjson reads as ints
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(["run\n", "ré", "a" * 201, "é" * 101, "é" * 100, ".x", "rollout", "x y", ""]),
    st.sampled_from([2, 2.0, "2", 0, -1, "input", "run_started", "run_finished", "../x"]),
    st.lists(st.one_of(st.text(max_size=3), st.booleans(), st.floats(-9, 9), st.integers(-9, 9))),
    st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
)
_EDIT = st.tuples(st.sampled_from(_PATHS), st.one_of(_ODD, st.just(KeyError)))


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


@settings(max_examples=600, deadline=None)
@given(st.lists(_EDIT, max_size=3))
def test_rollout_decoding_agrees_with_the_oracle(edits: list[tuple[tuple[str, ...], Any]]) -> None:
    raw = _dumps(_edited(_GOOD, edits))
    assert _verdict(decode_rollout, raw) == oracle_rollout(raw)


_RAW = orjson.dumps(_GOOD)


@pytest.mark.parametrize(
    "raw",
    [
        _RAW,
        b" " + _RAW.replace(b",", b" , ") + b"\n",  # spacing: info comes out canonical
        _RAW.replace(b'"v":2,', b'"v":2,"v":3,'),  # duplicate keys: the last one wins
        _RAW.replace(b'"task":7,', b'"task":7,"task":8,'),
        _RAW.replace(b'"task":7,', b'"task":"x","task":8,'),  # an invalid value, then a good one
        _RAW.replace(b'"reward":0.5}', b'"reward":1e400}'),  # infinite, in info
        _RAW.replace(b"0.5,12.0", b"0.5,1e400"),  # and in values
        _RAW.replace(b'"reward":0.5}', b'"reward":NaN}'),
        _RAW.replace(b'"reward":0.5}', b'"reward":"\xff"}'),  # invalid UTF-8, in info
        _RAW.replace(b'"agent"', b'"\xff"'),
        _RAW.replace(b'"reward":0.5}', b'"reward":"\\ud800"}'),  # a lone surrogate
        _RAW.replace(b'"agent":"agent"', b'"agent":"\\ud800"'),
        _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 300 + b"]" * 300 + b"}"),
        _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        _RAW.replace(b'{"reward":0.5}', b"[1]"),  # info not an object
        _RAW.replace(b"0.5,12.0", b"1,123456789012345678901234567890"),  # ints as values
        _RAW.replace(b'"published_at":1.5', b'"published_at":2'),
        _RAW.replace(b'"task":7', b'"task":9223372036854775808'),
        _RAW.replace(b'"task":7', b'"task":7.0'),
        _RAW.replace(b"[false,true]", b"[0,1]"),
        _RAW.replace(b"[false,true]", b"[false]"),  # columns of different lengths
        _RAW.replace(b'"v":2', b'"v":2.0'),
        _RAW.replace(b'"run-1"', b'"run\\u002d1"'),  # an escaped run id
        _RAW.replace(b'"run-1"', b'"' + "é".encode() * 101 + b'"'),  # 101 chars, 202 bytes
        b"\xef\xbb\xbf" + _RAW,  # a byte order mark
        _RAW + b"x",
        b"[]",
        b"{}",
        b"null",
    ],
)
def test_rollout_decoding_of_odd_bytes_agrees_with_the_oracle(raw: bytes) -> None:
    assert _verdict(decode_rollout, raw) == oracle_rollout(raw)


_DAMAGE = st.lists(
    st.tuples(st.integers(0, len(_RAW)), st.integers(0, 4), st.binary(max_size=4)),
    min_size=1,
    max_size=3,
)


def _damaged(damage: list[tuple[int, int, bytes]]) -> bytes:
    """``_RAW`` with each (at, size) span replaced by the bytes given."""
    raw = bytearray(_RAW)
    for at, size, inserted in damage:
        raw[at : at + size] = inserted
    return bytes(raw)


@settings(max_examples=300, deadline=None)
@given(_DAMAGE)
def test_rollout_decoding_of_damaged_bytes_agrees_with_the_oracle(
    damage: list[tuple[int, int, bytes]],
) -> None:
    raw = _damaged(damage)
    assert _verdict(decode_rollout, raw) == oracle_rollout(raw)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just([]), st.lists(_EDIT, max_size=2)), min_size=1, max_size=6))
def test_the_batch_path_decodes_as_one_by_one_or_hands_over(
    batch: list[list[tuple[tuple[str, ...], Any]]],
) -> None:
    raws = [_dumps(_edited(_GOOD, edits)) for edits in batch]
    events = decode_rollouts(raws)
    valid = [oracle_rollout(raw)[0] == "ok" for raw in raws]
    if all(valid) and all(orjson.dumps(orjson.loads(raw)) == raw for raw in raws):
        assert events is not None  # valid events as orjson writes them: the batch path
    if events is not None:
        assert events == [decode_rollout(raw) for raw in raws]


def test_the_batch_path_hands_over_what_orjson_cannot_write_back() -> None:
    deep = _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 300 + b"]" * 300 + b"}")
    assert decode_rollouts([_RAW, deep]) is None
    with pytest.raises(BadEvent, match=r"cannot be written back as JSON.* - at `\$\.record\.info`"):
        decode_rollout(deep)
    also_bad_task = deep.replace(b'"task":7', b'"task":"7"')
    with pytest.raises(BadEvent, match=r"Expected `int`, got `str` - at `\$\.task`"):
        decode_rollout(also_bad_task)


_INPUT = orjson.loads(encode_input("run-1", 3, {"q": "x", "_ng_task_index": 1}))
_INPUT_PATHS = [("v",), ("run_id",), ("type",), ("line",), ("row",), ("extra",)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_INPUT_PATHS), st.one_of(_ODD, st.just(KeyError)))))
def test_input_decoding_agrees_with_the_oracle(edits: list[tuple[tuple[str, ...], Any]]) -> None:
    raw = _dumps(_edited(_INPUT, edits))
    assert _verdict(decode_input, raw) == oracle_input(raw)


_STARTED = orjson.loads(encode(RunStarted(run_id="r", expected_rollouts=4, output_stem="x")))
_FINISHED = orjson.loads(encode(RunFinished(run_id="r")))
_CONTROL_PATHS = [("v",), ("run_id",), ("type",), ("expected_rollouts",), ("output_stem",)]
_CONTROL_PATHS += [("aggregate_metrics",), ("answer_key",)]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([_STARTED, _FINISHED]),
    st.lists(st.tuples(st.sampled_from(_CONTROL_PATHS), st.one_of(_ODD, st.just(KeyError)))),
)
def test_control_decoding_agrees_with_the_oracle(
    event: dict[str, Any], edits: list[tuple[tuple[str, ...], Any]]
) -> None:
    raw = _dumps(_edited(event, edits))
    assert _verdict(decode_control, raw) == oracle_control(raw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "1"}, "Expected `int`, got `str` - at `$.task`"),
        ({"agent": ["a"]}, "Expected `str | null`, got `array` - at `$.agent`"),
        ({"run_id": "../x"}, r"Expected `str` matching regex '^\\w[\\w.-]*$' - at `$.run_id`"),
        ({"v": 3}, "Expected schema version 2, got 3 - at `$.v`"),
        ({"task": KeyError}, "Object missing required field `task`"),
        ({"record": {}}, "Object missing required field `names` - at `$.record`"),
    ],
)
def test_an_error_is_one_line_naming_the_field(change: dict[str, Any], message: str) -> None:
    event = {k: v for k, v in (_GOOD | change).items() if v is not KeyError}
    with pytest.raises(BadEvent) as caught:
        decode_rollout(orjson.dumps(event))
    assert str(caught.value) == message
