"""Task rows are rendered from byte templates and bulk-formatted numbers: they must be exactly
the bytes orjson writes for the same values (what NeMo Gym writes, docs/nemo-gym-compat.md
§Profile rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.processors.core import profile
from rewardstream.processors.core.profile import _tokens, _unique, build_profile
from rewardstream.processors.core.state import ProfileState
from tests.test_state import Rows, collections, state_of


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64)))
def test_float_tokens_are_what_orjson_writes_for_each_float(values: list[float]) -> None:
    assert _tokens(np.array(values, dtype=np.float64)) == [orjson.dumps(v) for v in values]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1)))
def test_int_tokens_are_what_orjson_writes_for_each_int(values: list[int]) -> None:
    assert _tokens(np.array(values, dtype=np.int64)) == [orjson.dumps(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-3, 40)) | st.lists(st.integers(-(2**62), 2**62)),
    st.integers(-(2**40), 2**40),
)
def test_unique_is_numpys_unique(values: list[int], shift: int) -> None:
    """Dense values (a presence table) and sparse ones (numpy's sort) alike."""
    array = np.array(values, dtype=np.int64) + (shift if max(values, default=0) < 2**40 else 0)
    want = np.unique(array, return_inverse=True, return_counts=True)
    got = _unique(array)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert [g.dtype for g in got] == [np.dtype(np.int64)] * 3


def _lines(rows: Rows, results: Rows) -> list[bytes]:
    state = state_of(rows, results)
    profile = build_profile(state, allow_partial=True)
    return [row.render(b'{"s":1}') for row in profile.task_rows]


@settings(max_examples=100, deadline=None)
@given(collections())
def test_every_line_is_orjsons_own_form_of_itself(data: tuple[Rows, Rows]) -> None:
    """Missing stats (omitted keys), bools, ints-only frames, several agents: any mix."""
    for line in _lines(*data):
        assert line.endswith(b"}\n")
        assert orjson.dumps(orjson.loads(line)) == line[:-1]


def test_odd_column_names_and_ints_at_int64s_end_render_like_a_dict() -> None:
    rows = [{"_ng_task_index": 0, "_ng_rollout_index": r} for r in range(2)]
    odd = 'a%sb"%d\\ü'  # a template's own syntax, JSON escapes, non-ASCII
    results = [
        {"reward": 2**63 - 1, odd: 1, "_ng_task_index": 0, "_ng_rollout_index": 0},
        {"reward": 3, odd: 2, "_ng_task_index": 0, "_ng_rollout_index": 1},
    ]
    (line,) = _lines(rows, results)
    row: dict[str, Any] = orjson.loads(line)
    assert orjson.dumps(row) == line[:-1]
    # an all-int frame writes max and min as ints, exact as pandas' int64 (not 2**63, the float)
    assert row["max/reward"] == 2**63 - 1 and row["min/reward"] == 3
    assert (row[f"mean/{odd}"], row[f"max/{odd}"]) == (1.5, 2)
    assert list(row)[:2] == ["_ng_task_index", "mean/reward"]
    assert list(row)[-6:] == [
        "sample",
        "num_rollouts",
        "expected_num_rollouts",
        "missing_num_rollouts",
        "reward_profile_completion_pct",
        "rollout_infos",
    ]


def test_no_numeric_column_renders_the_counts_only() -> None:
    state = ProfileState()
    state.add_input({"_ng_task_index": 5, "_ng_rollout_index": 0}, 0, 0)
    state.add_result({"text": "x", "_ng_task_index": 5, "_ng_rollout_index": 0})
    (row,) = build_profile(state).task_rows
    assert orjson.loads(row.render(b"{}")) == {
        "_ng_task_index": 5,
        "sample": {},
        "num_rollouts": 1,
        "expected_num_rollouts": 1,
        "missing_num_rollouts": 0,
        "reward_profile_completion_pct": 100.0,
        "rollout_infos": [{"rollout_id": "5:0", "_ng_task_index": 5, "_ng_rollout_index": 0}],
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(st.sampled_from([0.0, -0.0, 1.0, float("nan")]), st.floats(-5, 5)),
            min_size=3,
            max_size=3,
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 3),
)
def test_a_group_wider_than_a_chunk_is_described_as_in_one_block(
    values: list[list[float]], groups: int
) -> None:
    """An agent's rows (one group past ``_CHUNK_VALUES``) are described a column at a time:
    the same stats, bit for bit (the sign of a ``-0.0`` median included), as the group alone
    in one block."""
    matrix = np.array(values, dtype=np.float64)
    rows = np.arange(len(matrix), dtype=np.int64)[::-1].copy()
    groups = min(groups, len(matrix))
    size = len(matrix) // groups
    starts = np.arange(groups, dtype=np.int64) * size
    sizes = np.full(groups, size, dtype=np.int64)
    chunk = profile._CHUNK_VALUES
    try:
        profile._CHUNK_VALUES = size * matrix.shape[1]  # one group per chunk, in one block
        block = profile._describe_segments(matrix, rows, starts, sizes)
        profile._CHUNK_VALUES = 1  # every group wider than a chunk: a column at a time
        columns = profile._describe_segments(matrix, rows, starts, sizes)
    finally:
        profile._CHUNK_VALUES = chunk
    for one, other in zip(block, columns, strict=True):
        assert one.tobytes() == other.tobytes()
