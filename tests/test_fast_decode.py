"""The processor's fast rollout path against its reference.

``decode_rollout_batch`` and ``Part.add_batch`` (chosen by ``Pipeline.fast``) must give exactly
what ``decode_rollouts`` and ``Part.add_rollouts`` give, or hand the batch over: a wrong result
the fast path accepts would be a silent wrong profile. The properties below run on generated
events, on odd and damaged bytes (the oracle cases of tests/test_contract.py and more), and on
whole pipelines; the last test plants a divergence and shows the property catches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract import events
from rewardstream.contract.events import (
    RolloutBatch,
    RunStarted,
    content_digest,
    content_digests,
    decode_rollout_batch,
    decode_rollouts,
    encode,
    encode_input,
    encode_rollout,
)
from rewardstream.processors.core.records import NO_ANSWER, ResultRecord
from rewardstream.processors.engine.pipeline import Pipeline
from tests.test_contract import _DAMAGE, _EDIT, _GOOD, _RAW, _damaged, _dumps, _edited


def _columns(decoded: list[events.Rollout]) -> RolloutBatch:
    """The reference's events as the fast path's columns."""
    records = [event.record for event in decoded]
    assert not any(record.big for record in records)
    return RolloutBatch(
        decoded[0].run_id,
        [event.task for event in decoded],
        [event.rollout for event in decoded],
        [event.agent for event in decoded],
        [event.published_at for event in decoded],
        [(record.names, record.is_int) for record in records],
        [record.values for record in records],
        [record.info for record in records],
        [record.masked for record in records],
        [record.answer for record in records],
    )


def _agree(raws: list[bytes]) -> RolloutBatch | None:
    """The fast decode of ``raws`` is the reference's, digests included, or None."""
    fast = decode_rollout_batch(raws)
    if fast is not None:
        reference = decode_rollouts(raws)
        assert reference is not None, "the fast path took a batch the reference hands over"
        assert fast == _columns(reference)
        assert [type(value) for value in fast.values[0]] == [float] * len(fast.values[0])
        assert content_digests(fast) == [content_digest(event) for event in reference]
    return fast


_NAME = st.text(min_size=1, max_size=6).filter(lambda name: name not in ("",))
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_INFO_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    _FLOAT,
    st.text(max_size=4),
    st.lists(st.integers(-3, 3), max_size=2),
)


@st.composite
def _record(draw: st.DrawFn) -> ResultRecord:
    names = tuple(draw(st.lists(_NAME, max_size=4)))
    values = tuple(draw(st.lists(_FLOAT, min_size=len(names), max_size=len(names))))
    is_int = tuple(draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names))))
    info = draw(st.dictionaries(st.text(max_size=5), _INFO_VALUE, max_size=4))
    answer = draw(st.one_of(st.just(NO_ANSWER), st.integers(-(2**63), 2**63 - 1)))
    try:
        info_bytes = orjson.dumps(info)
    except orjson.JSONEncodeError:  # an int beyond 64 bits: no producer writes it
        info_bytes = b"{}"
    return ResultRecord(names, is_int, values, info_bytes, draw(st.booleans()), answer)


_EVENT = st.builds(
    encode_rollout,
    st.sampled_from(["run", "run.2"]),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.none(), st.text(max_size=5)),
    _record(),
    _FLOAT,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=6))
def test_generated_batches_decode_as_the_reference(raws: list[bytes]) -> None:
    fast = _agree(raws)
    if len({orjson.loads(raw)["run_id"] for raw in raws}) == 1:
        assert fast is not None  # valid events of one run, as producers write them: taken


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.just([]), st.lists(_EDIT, max_size=2)), min_size=1, max_size=5))
def test_edited_events_decode_as_the_reference_or_hand_over(
    batch: list[list[tuple[tuple[str, ...], Any]]],
) -> None:
    _agree([_dumps(_edited(_GOOD, edits)) for edits in batch])


_ODD = [
    b" " + _RAW.replace(b",", b" , ") + b"\n",
    _RAW.replace(b'"v":2,', b'"v":2,"v":3,'),
    _RAW.replace(b'"task":7,', b'"task":7,"task":8,'),
    _RAW.replace(b'"task":7,', b'"task":"x","task":8,'),
    _RAW.replace(b'"reward":0.5}', b'"reward":1e400}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":-1E+999}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":1e-400}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":-0}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":0.50}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":5e-1}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":18446744073709551616}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":0.5,"reward":0.5}'),
    _RAW.replace(b'"reward":0.5}', b'"reward" : 0.5}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\\u00e9"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\xc3\xa9"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\\/"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":NaN}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\xff"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\xed\xa0\x80"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":"\\ud800"}'),
    _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 300 + b"]" * 300 + b"}"),
    _RAW.replace(b'"reward":0.5}', b'"reward":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    _RAW.replace(b'{"reward":0.5}', b"[1]"),
    _RAW.replace(b'{"reward":0.5}', b'"{}"'),
    _RAW.replace(b'"reward","tokens"', b'"rew\xffard","tokens"'),  # skipped by msgspec
    _RAW.replace(b'"reward","tokens"', b'"reward","\\ud800"'),
    _RAW.replace(b'"reward","tokens"', b'"reward",7'),
    _RAW.replace(b'"reward","tokens"', b'"reward"'),
    _RAW.replace(b'"reward","tokens"', b'"reward","tokens","x"'),
    _RAW.replace(b"[false,true]", b"[0,1]"),
    _RAW.replace(b"[false,true]", b"[false]"),
    _RAW.replace(b"[false,true]", b"[false,true,true]"),
    _RAW.replace(b"[false,true]", b"[false, true]"),
    _RAW.replace(b"0.5,12.0", b"0.5,1e400"),
    _RAW.replace(b"0.5,12.0", b"0.5,NaN"),
    _RAW.replace(b"0.5,12.0", b"0.5,12"),
    _RAW.replace(b"0.5,12.0", b"1,123456789012345678901234567890"),
    _RAW.replace(b"0.5,12.0", b"0.5"),
    _RAW.replace(b'"task":7', b'"task":9223372036854775808'),
    _RAW.replace(b'"task":7', b'"task":-9223372036854775809'),
    _RAW.replace(b'"task":7', b'"task":7.0'),
    _RAW.replace(b'"masked":false', b'"masked":false,"answer":9223372036854775807'),
    _RAW.replace(b'"masked":false', b'"masked":false,"answer":9223372036854775808'),
    _RAW.replace(b'"masked":false', b'"masked":false,"big":[[1,9007199254740993]]'),
    _RAW.replace(b'"masked":false', b'"masked":false,"big":[]'),
    _RAW.replace(b'"masked":false', b'"masked":false,"extra":1'),
    _RAW.replace(b'"published_at":1.5', b'"published_at":1e400'),
    _RAW.replace(b'"v":2', b'"v":2.0'),
    _RAW.replace(b'"run-1"', b'"run\\u002d1"'),
    _RAW.replace(b'"run-1"', b'"run 1"'),
    _RAW.replace(b'"run-1"', b'"run-2"'),
    _RAW.replace(b'"run-1"', b'"' + "é".encode() * 101 + b'"'),
    _RAW.replace(b'"agent":"agent"', b'"agent":null'),
    _RAW.replace(b'"agent":"agent"', b'"agent":"\xff"'),
    b"\xef\xbb\xbf" + _RAW,
    _RAW + b"x",
    _RAW + b"," + _RAW,
    b"[]",
    b"{}",
    b"",
]


@pytest.mark.parametrize("raw", _ODD)
def test_odd_bytes_decode_as_the_reference_or_hand_over(raw: bytes) -> None:
    for raws in ([raw], [_RAW, raw], [raw, _RAW]):
        _agree(raws)
    assert _agree([_RAW, _RAW]) is not None


@settings(max_examples=300, deadline=None)
@given(_DAMAGE)
def test_damaged_bytes_decode_as_the_reference_or_hand_over(
    damage: list[tuple[int, int, bytes]],
) -> None:
    _agree([_RAW, _damaged(damage)])


def test_a_shape_is_decoded_once_per_spelling() -> None:
    first = decode_rollout_batch([_RAW, _RAW])
    again = decode_rollout_batch([_RAW])
    assert first is not None and again is not None
    assert first.shapes[0] is first.shapes[1] is again.shapes[0]  # one object: one lookup


# ---------------------------------------------------------------------------- whole pipelines

_TASKS, _REPEATS = 4, 3


def _rollout(task: int, rollout: int, reward: float, agent: str = "a") -> bytes:
    record = ResultRecord(
        ("reward", "tokens"),
        (False, True),
        (reward, 12.0),
        orjson.dumps({"rollout_id": f"{task}:{rollout}", "reward": reward}),
        reward < 0,
    )
    return encode_rollout("run", task, rollout, agent, record, 1.0)


_SLICE = st.lists(
    st.one_of(
        st.builds(
            _rollout,
            st.integers(0, _TASKS),  # task _TASKS has no row
            st.integers(0, _REPEATS - 1),
            st.sampled_from([0.0, 0.5, 1.0, -1.0]),  # a key again: a duplicate, or a conflict
            st.sampled_from(["a", "b"]),
        ),
        st.sampled_from([_RAW, b"{}", b"not json"]),
    ),
    min_size=1,
    max_size=8,
)


def _row(task: int, rollout: int, line: int, run_id: str = "run", **more: Any) -> bytes:
    row = {"_ng_task_index": task, "_ng_rollout_index": rollout, **more}
    return encode_input(run_id, line, row)


_ROWS = [
    _row(t, r, t * _REPEATS + r, agent_ref={"name": "ab"[r % 2]})
    for t in range(_TASKS)
    for r in range(_REPEATS)
]
_ODD_ROW = st.sampled_from(
    [
        _ROWS[0],  # a duplicate
        _row(0, 0, 0, x=1),  # a conflict
        _row(1, 1, 4, "run.2"),  # another run's
        _row(0, 5000, 99),  # an index beyond the key set's bit masks
        b"{}",
    ]
)


class _Scene(NamedTuple):
    """When the inputs come (before slice ``inputs_at``; after the last when it is their
    count), in two slices, ``extra`` inputs in the first; whether every row is known then
    (else the run expects one more), and whether the slices have offsets (else held rollouts
    keep their bytes)."""

    slices: list[list[bytes]]
    inputs_at: int
    extra: list[bytes]
    all_rows: bool
    offsets: bool


_SCENE = st.builds(
    lambda slices, at, extra, all_rows, offsets: _Scene(
        slices, at % (len(slices) + 1), extra, all_rows, offsets
    ),
    st.lists(_SLICE, min_size=1, max_size=4),
    st.integers(0, 4),
    st.lists(_ODD_ROW, max_size=2),
    st.booleans(),
    st.booleans(),
)


def _fold(folder: Path, fast: bool, scene: _Scene) -> tuple[Any, ...]:
    """Everything a pipeline holds after ``scene``'s events."""
    expected = len(_ROWS) + (not scene.all_rows)
    half = len(_ROWS) // 2
    inputs = [[*_ROWS[:half], *scene.extra], _ROWS[half:]]
    with Pipeline(folder, fast=fast) as pipeline:
        started = RunStarted(run_id="run", expected_rollouts=expected, output_stem="r")
        pipeline.handle("control", encode(started))
        offset = 0
        for at, chunk in enumerate([*scene.slices, []]):
            if at == scene.inputs_at:
                for n, rows in enumerate(inputs, 1):
                    pipeline.apply("input", rows, "input-0", range(n * 100, n * 100 + len(rows)))
            if not chunk:
                continue
            if scene.offsets:
                pipeline.apply("rollout", chunk, "rollout-0", range(offset, offset + len(chunk)))
            elif pipeline.handle_rollouts(chunk, "rollout-0") is None:
                for raw in chunk:
                    pipeline.handle("rollout", raw, "rollout-0")
            offset += len(chunk)
        rejected = [(r.reason, r.offset, r.raw, r.detail) for r in pipeline.take_rejected()]
        parts = {}
        for run_id, run in sorted(pipeline.runs.items()):
            for name, part in sorted(run.parts.items()):
                header, sections = part.state.export_columns(part.taken_infos())
                state = (header, [bytes(section) for section in sections])
                counts = (part.duplicates, part.conflicts, part.content, part.foreign)
                held = list(part.unmatched.items())
                parts[run_id, name] = (state, counts, held, part.first_offset, part.live())
        return rejected, pipeline.strays, parts


@settings(max_examples=200, deadline=None)
@given(_SCENE)
def test_the_fast_fold_is_the_reference_fold(
    tmp_path_factory: pytest.TempPathFactory, scene: _Scene
) -> None:
    folder = tmp_path_factory.mktemp("fold")
    assert _fold(folder / "fast", True, scene) == _fold(folder / "ref", False, scene)


def test_the_fast_path_folds_the_common_batch(tmp_path: Path) -> None:
    chunk = [_rollout(t, r, 0.5) for t in range(_TASKS) for r in range(_REPEATS)]
    taken: list[bool] = []
    original = Pipeline._fold_batch

    def spy(self: Pipeline, unit: str, batch: RolloutBatch, raws: Any, offsets: Any) -> bool:
        taken.append(original(self, unit, batch, raws, offsets))
        return taken[-1]

    scene = _Scene([chunk, chunk, chunk], 1, [], True, True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Pipeline, "_fold_batch", spy)
        assert _fold(tmp_path / "fast", True, scene) == _fold(tmp_path / "ref", False, scene)
    # held before their rows, then folded with them; then duplicates: the reference's work
    assert taken == [True, False, False]


# ------------------------------------------------------------------------- a planted fault

_SPELLINGS = st.lists(
    st.sampled_from(
        [
            *(b'"reward":0.5', b'"reward" :0.5', b'"reward": 0.5', b'"reward":5e-1', b'"a":1'),
            *(b'"a":1.0', b'"a":-0', b'"a":"\\u0061"', b'"a":1,"a":1', b'"a":[ ]', b'"a":[]'),
            *(b'"a":1e400', b'"a":"\xff"', b'"\xc3\xa9":true'),
        ]
    ),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_SPELLINGS, min_size=1, max_size=3))
def test_info_spellings_decode_as_the_reference(spellings: list[list[bytes]]) -> None:
    raws = [_RAW.replace(b'{"reward":0.5}', b"{%b}" % b",".join(info)) for info in spellings]
    _agree(raws)


def test_the_property_catches_a_fast_path_that_diverges() -> None:
    """A fast path that checked only that ``info`` is valid JSON, keeping it as sent where the
    reference hands the batch over to have it written canonical, is caught."""

    def lenient(infos: list[bytes]) -> bool:
        return all(type(orjson.loads(info)) is dict for info in infos)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events, "_objects_as_orjson_writes_them", lenient)
        with pytest.raises(AssertionError, match="the fast path took a batch"):
            test_info_spellings_decode_as_the_reference()
