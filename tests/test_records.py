"""``extract_result`` reads rows by their shape's plan; ``extract_result_reference`` by the
rules, one value at a time. They must agree on every row, errors included (the profile and
every wire record depend on it), whatever the keys, types, usage and values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.errors import InvalidRow
from rewardstream.processors.core import records
from rewardstream.processors.core.records import extract_result, extract_result_reference

KEYS = st.sampled_from(
    [
        *("reward", "score", "n", "flag", "_private", "agent_name", "mask_sample", "response"),
        *("total_tokens", "input_tokens", "", "ключ", "a" * 40, "100%s", 'q"\\'),
        *("rollout_id", "_ng_task_index"),
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) - 2, 2**53 + 2),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=2),
    st.dictionaries(st.text(max_size=2), SCALARS, max_size=2),
    st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=2), max_leaves=4),
)
USAGE = st.one_of(
    st.none(),
    st.just({}),
    st.just([]),
    st.integers(0, 1),
    st.dictionaries(KEYS, VALUES, max_size=5),
)
RESPONSE = st.one_of(
    st.none(),
    st.just(""),
    st.just("text"),
    st.integers(0, 1),
    st.fixed_dictionaries({"usage": USAGE}, optional={"id": st.text(max_size=3)}),
)


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    row = draw(st.dictionaries(KEYS, VALUES, max_size=8))
    if draw(st.booleans()):
        row["response"] = draw(RESPONSE)
    return row


def _either(extract: Any, row: dict[str, Any], answer_key: str | None) -> Any:
    try:
        return extract(row, 3, 1, answer_key)
    except InvalidRow as exc:
        return ("error", str(exc))


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(rows(), min_size=1, max_size=4),
    st.sampled_from([None, "score", "reward", "mask_sample"]),
)
def test_the_plan_reads_what_the_rules_read(batch: list[dict[str, Any]], key: str | None) -> None:
    records._PLANS.clear()
    for row in batch * 2:  # the second time through a known plan
        assert _either(extract_result, row, key) == _either(extract_result_reference, row, key)


def test_rows_of_one_shape_share_one_plan_and_its_names() -> None:
    records._PLANS.clear()
    one = extract_result({"reward": 1.0, "n": 2, "response": {"usage": {"x": 3}}}, 0, 0)
    two = extract_result({"reward": 0.5, "n": 7, "response": {"usage": {"x": 4}}}, 0, 1)
    assert len(records._PLANS) == 1 and one.names is two.names and one.is_int is two.is_int
    three = extract_result({"reward": 0.5, "n": 7.5, "response": {"usage": {"x": 4}}}, 0, 2)
    assert len(records._PLANS) == 2 and three.is_int == (False, False, True)


@pytest.mark.parametrize(
    "row",
    [
        {"reward": 1.0, "n": 2**53 + 1},  # beyond 2**53: exact ints, by the rules
        {"reward": 1.0, "n": 2**64},  # beyond int64: no column
        {"reward": [[[[1]]]], "x": 1},
    ],
)
def test_rows_off_the_common_path_are_read_by_the_rules(row: dict[str, Any]) -> None:
    assert _either(extract_result, row, None) == _either(extract_result_reference, row, None)


@pytest.mark.parametrize("mask", [False, 0, None, "", [], {}])
def test_mask_sample_as_the_answer_key_gives_no_answer(mask: Any) -> None:
    """NeMo Gym strips ``mask_sample`` from a scored result before it reads answers: the
    plan must not hash the mask's value (it did, where the rules gave no answer)."""
    records._PLANS.clear()
    row = {"reward": 1.0, "mask_sample": mask}
    for extract in (extract_result, extract_result_reference):
        assert extract(row, 0, 0, "mask_sample").answer == records.NO_ANSWER
