"""The lean reader takes a line only when it reads exactly what the reference reads.

One line at a time: the lean decoding (:mod:`lean`) and extraction (:mod:`lean_records`)
give the reference's record (``parse_line`` + ``row_key`` + ``extract_result``, what the batch
profile stored before) or leave the line to the reference, never a record where the
reference errors. Rows are generated with duplicate keys, odd key names, key orders, number
spellings, hostile and malformed literals at every depth (inside skipped values too, where
msgspec checks less than orjson), then whole files through both readers. The checks are shown
to fail when a fault is planted.
"""

from __future__ import annotations

import decimal
import json
import random
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.generate import input_row, result_row, text
from rewardstream.errors import InvalidRow, LineError
from rewardstream.infra import readers
from rewardstream.infra.jsonl import parse_line
from rewardstream.processors.core import lean, lean_records
from rewardstream.processors.core.lean_records import lean_results
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.state import ProfileState, row_key, row_names
from tests.test_fuzz import _BAD_BYTES, HOSTILE, MALFORMED
from tests.test_records import KEYS, VALUES

# --------------------------------------------------------------------------- one line


def lean_one(raw: bytes, answer_key: str | None) -> tuple[Any, ...] | None:
    """The lean reader's record of one line, or None where it leaves the line."""
    buffer = np.frombuffer(raw + b"\n", np.uint8)
    flagged = lean.suspects(buffer, np.array([0]), np.array([len(raw)]))
    taken = list(lean_results([raw], flagged, answer_key))
    if taken == [0]:
        return None
    (columns,) = taken
    assert isinstance(columns, lean_records.Columns)
    schema = columns.schemas[0]
    return (
        columns.tasks[0],
        columns.rollouts[0],
        schema,
        columns.masked[0],
        columns.answers[0],
        tuple(map(float, columns.values)),
        columns.infos[0],
    )


def reference_one(raw: bytes, answer_key: str | None) -> tuple[Any, ...]:
    """The reference's record of one line, or its error."""
    try:
        value = parse_line(raw, "f", 1)
        task, rollout = row_key(value)
        record = extract_result(value, task, rollout, answer_key)
    except (LineError, InvalidRow) as exc:
        return ("error", str(exc))
    if record.big:
        return ("big", record)
    schema = (record.names, record.is_int)
    return (task, rollout, schema, record.masked, record.answer, record.values, record.info)


def agree(raw: bytes, answer_key: str | None = None) -> bool:
    """Assert the lean reader gives the reference's record or leaves the line; True if taken."""
    got = lean_one(raw, answer_key)
    if got is None:
        return False
    want = reference_one(raw, answer_key)
    assert got == want, (raw[:300], got, want)
    assert got[5] == want[5] and all(  # values bit for bit (-0.0 == 0.0 otherwise)
        struct.pack("<d", a) == struct.pack("<d", b) for a, b in zip(got[5], want[5], strict=True)
    )
    return True


class Lit(NamedTuple):
    """Raw JSON text put in a row as it is (malformed, hostile, spelled oddly)."""

    text: bytes


class Pairs(NamedTuple):
    """An object as its (key, value) pairs: keys may repeat."""

    items: list[tuple[str, Any]]


def render(value: Any, ascii_only: bool) -> bytes:
    if isinstance(value, Lit):
        return value.text
    if isinstance(value, Pairs):
        inner = b",".join(
            json.dumps(k, ensure_ascii=ascii_only).encode() + b":" + render(v, ascii_only)
            for k, v in value.items
        )
        return b"{" + inner + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(render(v, ascii_only) for v in value) + b"]"
    return json.dumps(value, ensure_ascii=ascii_only).encode()


SPELLED = st.sampled_from(
    [
        *(b"1E2", b"1.0e+2", b"-0", b"-0.0", b"0e0", b"1e-400", b"123456789012345678901234"),
        *(b"0.1", b"9007199254740993", b"-9007199254740992", b"9007199254740992", b"5e-324"),
    ]
)
ODD = st.one_of(
    st.sampled_from(MALFORMED + HOSTILE).map(Lit),
    SPELLED.map(Lit),
    _BAD_BYTES.map(lambda b: Lit(b'"a' + b + b'"')),
    st.integers(985, 1030).map(lambda d: Lit(b"[" * d + b"]" * d)),
    st.sampled_from([Lit(b'"\t"'), Lit(b'"\\ud800"'), Lit(b"[1,]")]),
)
PLAIN = st.one_of(VALUES, SPELLED.map(Lit))
PLACES = ("top", "usage", "skipped", "list")


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A rollouts line: generated keys and values, the key fields (usually good), maybe a
    response with usage, maybe one odd literal somewhere, keys maybe repeated, any order."""
    top: list[tuple[str, Any]] = draw(st.lists(st.tuples(KEYS, PLAIN), max_size=7))
    usage: list[tuple[str, Any]] = draw(st.lists(st.tuples(KEYS, PLAIN), max_size=5))
    key = st.one_of(st.integers(0, 5), st.integers(-(2**64), 2**64), VALUES)
    good = st.integers(0, 9)
    top.append(("_ng_task_index", draw(st.one_of(good, good, good, key))))
    top.append(("_ng_rollout_index", draw(st.one_of(good, good, good, key))))
    response: Any = Pairs([("id", "r"), ("usage", Pairs(usage))])
    response = draw(st.sampled_from([response, response, None, Lit(b'"x"'), Lit(b"[]")]))
    if draw(st.booleans()):
        top.append(("response", response))
    top.append(("responses_create_params", Pairs([("input", [{"content": "hi"}])])))
    if draw(st.booleans()):
        odd = draw(ODD)
        place = draw(st.sampled_from(PLACES))
        name = draw(KEYS)
        if place == "top":
            top.append((name, odd))
        elif place == "usage":
            usage.append((name, odd))
        elif place == "skipped":
            top.append(("verifier_metadata", Pairs([("deep", Pairs([("x", odd)]))])))
        else:
            top.append(("extra", [1, "two", Pairs([("x", odd)])]))
    for group in (top, usage):
        repeat: bool = draw(st.booleans())
        if group and repeat:  # a repeated key, with another value
            k, _ = draw(st.sampled_from(group))
            group.insert(draw(st.integers(0, len(group))), (k, draw(PLAIN)))
    top = draw(st.permutations(top))
    return render(Pairs(top), draw(st.booleans()))


ANSWER_KEYS = st.sampled_from([None, "score", "reward", "response", "mask_sample", "n"])


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines(), ANSWER_KEYS)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":{"y":1e400}}', None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":"\xff"}', None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":[' + b"1" * 320 + b"]}", None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":' + b"[" * 1000 + b"]" * 1000 + b"}", None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"n":18446744073709551616}', None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"n":1,"n":2.5,"r":true}', "n")
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"100%s":1,"q\\"\\\\":2}', None)
@example(b'{"_ng_task_index":0,"_ng_rollout_index":0,"reward":"a,b],[c"}', None)
def test_a_line_is_read_as_the_reference_reads_it_or_left_to_it(
    raw: bytes, answer_key: str | None
) -> None:
    lean_records._PLANS.clear()
    agree(raw, answer_key)
    agree(raw, answer_key)  # through a known plan


@pytest.mark.parametrize(
    "raw",
    [
        # usage values win at the row key's position; rollout_infos keeps the row's at usage's
        b'{"a":1,"response":{"usage":{"a":2.5,"b":true}},"b":3,"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"reward":1,"response":{"usage":{"reward":0.5}},"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"response":{"usage":{"rollout_id":7}},"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"mask_sample":[0],"x":1,"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"mask_sample":"","x":1,"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"reward":null,"x":false,"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"reward":true,"x":-0.0,"y":-0,"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"response":{"usage":{}},"_ng_task_index":1,"_ng_rollout_index":2}\r',
    ],
)
def test_collisions_and_kinds_are_taken_exactly(raw: bytes) -> None:
    assert agree(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"reward":[1],"_ng_task_index":1,"_ng_rollout_index":2}',  # raw into rollout_infos
        b'{"reward":{"a":1},"_ng_task_index":1,"_ng_rollout_index":2}',
        b'{"mask_sample":{},"_ng_task_index":1,"_ng_rollout_index":2}',  # empty or not: unread
        b'{"n":9007199254740993,"_ng_task_index":1,"_ng_rollout_index":2}',  # needs big
        b'{"_ng_task_index":1.0,"_ng_rollout_index":2}',
        b'{"_ng_rollout_index":2}',
        b'{"response":"x","_ng_task_index":1,"_ng_rollout_index":2}',
        b"[1,2]",
        b"",
    ],
)
def test_lines_off_the_common_shape_are_left_to_the_reference(raw: bytes) -> None:
    assert lean_one(raw, None) is None


def test_a_shape_change_mid_batch_keeps_line_order() -> None:
    rows = [
        b'{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":0}',
        b'{"reward":1,"_ng_task_index":0,"_ng_rollout_index":1}',
        b'{"reward":[1],"_ng_task_index":0,"_ng_rollout_index":2}',
        b'{"_ng_rollout_index":3,"reward":0.5,"_ng_task_index":0}',
    ]
    taken = list(lean_results(rows, set(), None))
    assert [type(t).__name__ for t in taken] == ["Columns", "int", "Columns"]
    first, _, last = taken
    assert isinstance(first, lean_records.Columns) and isinstance(last, lean_records.Columns)
    assert first.rollouts == [0, 1] and taken[1] == 2 and last.rollouts == [3]
    assert first.schemas == [(("reward",), (False,)), (("reward",), (True,))]


# --------------------------------------------------------------------------- inputs


def reference_input(raw: bytes) -> tuple[Any, ...]:
    try:
        value = parse_line(raw, "f", 1)
        return (*row_key(value), *row_names(value))
    except (LineError, InvalidRow) as exc:
        return ("error", str(exc))


def lean_input(raw: bytes) -> tuple[Any, ...] | None:
    buffer = np.frombuffer(raw + b"\n", np.uint8)
    if lean.suspects(buffer, np.array([0]), np.array([len(raw)])):
        return None
    return lean.decode_input(raw)


AGENT_REFS = st.one_of(
    st.just(Pairs([])),
    st.builds(
        lambda n: Pairs([("type", "x"), ("name", n)]), st.one_of(st.text(max_size=3), VALUES)
    ),
    PLAIN,
    ODD,
)


@st.composite
def input_lines(draw: st.DrawFn) -> bytes:
    key = st.one_of(st.integers(0, 5), st.integers(-(2**65), 2**65), VALUES)
    pairs: list[tuple[str, Any]] = [
        ("responses_create_params", Pairs([("input", draw(st.one_of(PLAIN, ODD)))])),
        ("_ng_task_index", draw(st.one_of(st.integers(0, 9), key))),
        ("_ng_rollout_index", draw(st.one_of(st.integers(0, 9), key))),
    ]
    if draw(st.booleans()):
        pairs.append(("agent_ref", draw(AGENT_REFS)))
    if draw(st.booleans()):
        pairs.append(("_ng_environment_server", draw(st.one_of(st.text(max_size=3), PLAIN))))
    if draw(st.booleans()):
        k, _ = draw(st.sampled_from(pairs))
        pairs.insert(draw(st.integers(0, len(pairs))), (k, draw(st.one_of(PLAIN, AGENT_REFS))))
    if draw(st.booleans()):
        pairs = [p for p in pairs if p[0] != draw(st.sampled_from([p[0] for p in pairs]))]
    return render(Pairs(draw(st.permutations(pairs))), draw(st.booleans()))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(input_lines())
@example(b'{"agent_ref":{},"_ng_task_index":0,"_ng_rollout_index":0}')
@example(b'{"agent_ref":null,"agent_ref":{"name":"a"},"_ng_task_index":0,"_ng_rollout_index":0}')
@example(b'{"q":"\xff","_ng_task_index":0,"_ng_rollout_index":0}')
def test_an_inputs_line_is_read_as_the_reference_reads_it_or_left_to_it(raw: bytes) -> None:
    got = lean_input(raw)
    if got is not None:
        assert got == reference_input(raw), raw[:300]


# --------------------------------------------------------------------------- msgspec's behaviours


def test_msgspec_behaviours_the_lean_decoder_relies_on() -> None:
    """Pinned: an upgrade that changes one fails here instead of going wrong silently."""
    dec = lean.decode_result
    row = dec(b'{"a":1,"c":2,"b":2.5,"a":3.5}')
    assert row is not None and list(row.items()) == [("a", 3.5), ("c", 2), ("b", 2.5)]
    kinds = dec(b'{"a":1,"b":1.0,"c":1e2,"d":-0,"e":-0.0,"f":true,"g":0e0}')
    assert kinds is not None
    assert [type(v) for v in kinds.values()] == [int, float, float, int, float, bool, float]
    assert str(kinds["e"]) == "-0.0"
    assert dec(b'{"a":9007199254740992}') == {"a": 2**53}
    assert dec(b'{"a":9007199254740993}') is None  # bounded: beyond 2**53 is the reference's
    assert dec(b'{"a":{"usage":{"x":1},"usage":null}}') == {"a": lean.Obj(None)}
    assert dec(b'{"a":"\xff"}') is None  # decoded strings are checked
    assert dec(b'{"a":{"b":"\xff","c":1e400}}') is not None  # skipped ones are not: suspects
    assert dec(b"[" + b"]") is None  # not an object
    assert isinstance(msgspec.ValidationError("x"), ValueError)


FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
    st.floats(allow_nan=False, allow_infinity=False).map(orjson.dumps),
    st.builds(
        lambda d, e: b"1.%se%d" % (d.encode(), e),
        st.text("0123456789", min_size=15, max_size=40),
        st.integers(-340, 307),
    ),
    st.sampled_from(
        [
            *(b"1.7976931348623157e308", b"1.7976931348623158e308", b"2.2250738585072011e-308"),
            *(b"2.4703282292062327e-324", b"2.4703282292062328e-324", b"4.9406564584124654e-324"),
        ]
    ),
)


@settings(max_examples=5000, deadline=None)
@given(FLOATS)
def test_floats_are_orjsons_bit_for_bit(number: bytes) -> None:
    want = orjson.loads(number)
    row = lean.decode_result(b'{"x":' + number + b"}")
    assert row is not None
    assert type(row["x"]) is type(want) and struct.pack("<d", row["x"]) == struct.pack("<d", want)


def test_floats_at_midpoints_between_doubles() -> None:
    rng = random.Random(28)
    for _ in range(2000):
        a = struct.unpack("<d", rng.getrandbits(63).to_bytes(8, "little"))[0]
        if a != a or a in (float("inf"),):
            continue
        b = np.nextafter(a, np.inf)
        if not np.isfinite(b):
            continue
        with decimal.localcontext() as context:
            context.prec = 1000
            mid = format((decimal.Decimal(a) + decimal.Decimal(float(b))) / 2, "e").encode()
        for number in (repr(a).encode(), mid):
            row = lean.decode_result(b'{"x":' + number + b"}")
            assert row is not None
            assert struct.pack("<d", row["x"]) == struct.pack("<d", orjson.loads(number))


# --------------------------------------------------------------------------- the line check

NUMBERS = st.builds(
    lambda sign, digits, frac, exp: sign + digits + frac + exp,
    st.sampled_from([b"", b"-"]),
    st.one_of(
        st.integers(0, 10**30).map(lambda n: str(n).encode()),
        st.integers(150, 400).map(lambda n: b"1" + b"0" * n),
    ),
    st.one_of(
        st.just(b""), st.text("0123456789", min_size=1, max_size=5).map(lambda s: b"." + s.encode())
    ),
    st.one_of(
        st.just(b""),
        st.builds(
            lambda e, s, d: e + s + d,
            st.sampled_from([b"e", b"E"]),
            st.sampled_from([b"", b"+", b"-"]),
            st.text("0123456789", min_size=1, max_size=5).map(str.encode),
        ),
    ),
)


@settings(max_examples=3000, deadline=None)
@given(NUMBERS, st.integers(0, 70))
def test_every_number_orjson_refuses_is_flagged(number: bytes, pad: int) -> None:
    raw = b'{"a":"' + b"x" * pad + b'","s":{"b":[' + number + b"]}}"
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        buffer = np.frombuffer(raw + b"\n", np.uint8)
        assert lean.suspects(buffer, np.array([0]), np.array([len(raw)])) == {0}, raw


@settings(max_examples=1000, deadline=None)
@given(st.binary(min_size=1, max_size=8), st.integers(0, 3))
def test_every_invalid_utf8_is_flagged_and_only_it(junk: bytes, line: int) -> None:
    rows = [b'{"a":"ok \xc3\xa9"}'] * 4
    rows[line] = b'{"a":"' + junk.replace(b"\n", b" ") + b'"}'
    data = b"\n".join(rows)
    buffer = np.frombuffer(data, np.uint8)
    starts = np.r_[0, np.flatnonzero(buffer == 10) + 1]
    ends = np.r_[np.flatnonzero(buffer == 10), len(data)]
    flagged = lean.suspects(buffer, starts, ends)
    try:
        rows[line].decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    if not valid:
        assert line in flagged
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(rows[line])
    assert flagged <= {line}


def test_a_planted_fault_in_the_line_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agreement check fails when the line check misses an overflow or bad UTF-8."""
    overflow = b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":{"y":1e400}}'
    utf8 = b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":{"y":"\xff"}}'
    long_int = b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":[' + b"9" * 320 + b"]}"
    for raw in (overflow, utf8, long_int):
        assert not agree(raw)
    monkeypatch.setattr(lean, "suspects", lambda *_: set())
    for raw in (overflow, utf8, long_int):
        with pytest.raises(AssertionError):
            agree(raw)


def test_a_planted_fault_in_the_plan_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lean plan that hashes an object answer (its content unread) gives another answer."""
    raw = b'{"score":{"a":1},"x":2,"_ng_task_index":1,"_ng_rollout_index":2}'
    assert not agree(raw, "score")
    monkeypatch.setattr(lean_records, "_UNREAD", (list,))
    lean_records._PLANS.clear()
    with pytest.raises(AssertionError):
        agree(raw, "score")
    lean_records._PLANS.clear()


# --------------------------------------------------------------------------- the bench shapes


def bench_lines(shape: str, n: int) -> tuple[list[bytes], list[bytes]]:
    rng = random.Random(0)
    bodies = [text(rng, 2000) for _ in range(16)]
    results = [
        orjson.dumps(result_row(i // 8, i % 8, i, f"p{i}", bodies, shape=shape)) for i in range(n)
    ]
    inputs = [orjson.dumps(input_row(i // 8, i % 8, "agent", f"p{i}")) for i in range(n)]
    return results, inputs


@pytest.mark.parametrize("shape", ["nemo", "hidden"])
def test_the_lean_reader_takes_every_line_of_the_bench_shapes(shape: str) -> None:
    """A regression that silently sends lines to the reference (speed only) fails here."""
    results, inputs = bench_lines(shape, 1000)
    data = b"\n".join(results)
    buffer = np.frombuffer(data, np.uint8)
    starts = np.r_[0, np.flatnonzero(buffer == 10) + 1]
    ends = np.r_[np.flatnonzero(buffer == 10), len(data)]
    assert lean.suspects(buffer, starts, ends) == set()
    taken = list(lean_results(results, set(), None))
    assert len(taken) == 1 and isinstance(taken[0], lean_records.Columns)
    assert all(lean.decode_input(line) is not None for line in inputs)
    for raw in results[:50]:
        assert agree(raw)


# --------------------------------------------------------------------------- whole files


def _states(path: Path, answer_key: str | None) -> Iterator[tuple[Any, ...]]:
    for load in (readers.load_results_lean, readers.load_results_reference):
        state = ProfileState()
        try:
            load(state, path, 0, path.stat().st_size, answer_key)
        except LineError as exc:
            yield ("error", str(exc))
            continue
        header, sections = state.export_columns()
        yield header, [bytes(s) for s in sections]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=12), ANSWER_KEYS, st.booleans())
def test_a_file_is_read_by_both_readers_into_one_state(
    rows: list[bytes], answer_key: str | None, crlf: bool
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "r.jsonl"
        path.write_bytes(b"".join(row + (b"\r\n" if crlf else b"\n") for row in rows))
        lean_state, reference_state = _states(path, answer_key)
        assert lean_state == reference_state


def test_both_readers_give_one_state_on_long_lines_and_chunk_edges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readers, "_CHUNK", 4096)  # lines cross and exceed chunks
    results, inputs = bench_lines("hidden", 40)
    results[17] = results[17].replace(b'"reward":', b'"reward":[1],"x":', 1)  # a fallback
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(results))  # no newline at the end
    lean_state, reference_state = _states(path, "extracted_answer")
    assert lean_state == reference_state
    inputs_path = tmp_path / "i.jsonl"
    inputs_path.write_bytes(b"\n".join(inputs) + b"\n")
    for end in (inputs_path.stat().st_size, len(inputs[0]) + 1, len(inputs[0]) + 3):
        states = []
        for load in (readers.load_inputs_lean, readers.load_inputs_reference):
            state = ProfileState()
            load(state, inputs_path, 0, end)
            states.append(state.export_columns()[0])
        assert states[0] == states[1]


def test_a_bad_line_after_fallbacks_is_the_first_error_with_its_number(tmp_path: Path) -> None:
    good = b'{"reward":1.0,"_ng_task_index":%d,"_ng_rollout_index":0}\n'
    rows = [good % t for t in range(3000)]
    rows[5] = b'{"reward":[1],"_ng_task_index":5,"_ng_rollout_index":0}\n'
    rows[2500] = b'{"reward":1.0,"x":{"y":1e400},"_ng_task_index":1,"_ng_rollout_index":0}\n'
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(rows))
    lean_error, reference_error = _states(path, None)
    assert lean_error == reference_error
    assert lean_error[0] == "error" and "at line 2501: number is infinity" in lean_error[1]


def test_depth_is_checked_whatever_the_recursion_limit() -> None:
    """msgspec's depth guard is the recursion limit (hypothesis raises it): the line check
    flags a line nested as deeply as orjson refuses, at any limit."""
    deep = b"[" * 1030 + b"]" * 1030
    raw = b'{"_ng_task_index":0,"_ng_rollout_index":0,"x":{"y":' + deep + b"}}"
    saved = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        assert lean.decode_result(raw) is not None  # msgspec alone would take it
        assert lean_one(raw, None) is None
    finally:
        sys.setrecursionlimit(saved)
    assert reference_one(raw, None)[0] == "error"


def test_valid_non_ascii_lines_are_taken() -> None:
    rows = [
        b'{"q":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80","reward":1.0,"_ng_task_index":%d,'
        b'"_ng_rollout_index":0}' % t
        for t in range(5)
    ]
    data = b"\n".join(rows)
    buffer = np.frombuffer(data, np.uint8)
    starts = np.r_[0, np.flatnonzero(buffer == 10) + 1]
    ends = np.r_[np.flatnonzero(buffer == 10), len(data)]
    assert lean.suspects(buffer, starts, ends) == set()
    assert all(agree(row) for row in rows)


def test_a_part_that_mostly_falls_back_is_read_on_by_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``_TRIAL`` lines mostly left to the reference, whole chunks go to it: one state."""
    monkeypatch.setattr(readers, "_CHUNK", 4096)
    calls: list[int] = []
    real = readers._reference_lines

    def counted(state: ProfileState, path: Path, chunk: Any, lines: Any, key: Any) -> None:
        calls.append(len(lines))
        real(state, path, chunk, lines, key)

    monkeypatch.setattr(readers, "_reference_lines", counted)
    row = b'{"reward":[%d],"n":1,"_ng_task_index":%d,"_ng_rollout_index":0}\n'
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(row % (t % 2, t) for t in range(3000)))
    lean_state, reference_state = _states(path, None)
    assert lean_state == reference_state
    assert max(calls) > 1  # whole chunks, once the trial is over
