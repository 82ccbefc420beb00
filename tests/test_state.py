"""Property tests of the profile state: merge, arrival order, partial prefixes, live stats."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.errors import ProfileError
from rewardstream.processors.core.profile import Profile, build_profile
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.core.welford import Moments, RunningStats

Rows = list[dict[str, Any]]

value = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 100), st.floats(-1e3, 1e3, allow_nan=False)
)


@st.composite
def collections(draw: st.DrawFn) -> tuple[Rows, Rows]:
    """Materialized rows and results: several agents, repeats, gaps, bools, nulls."""
    agents = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    n_tasks = draw(st.integers(1, 6))
    repeats = draw(st.integers(1, 4))
    rows, results = [], []
    for t in range(n_tasks):
        agent = agents[t % len(agents)]
        for r in range(repeats):
            rows.append(
                {
                    "q": f"task {t}",
                    "agent_ref": {"name": agent},
                    "_ng_task_index": t,
                    "_ng_rollout_index": r,
                }
            )
            result: dict[str, Any] = {"reward": draw(value)}
            for col in ("score", "flag"):
                if draw(st.booleans()):
                    result[col] = draw(value)
            if draw(st.booleans()):
                result["response"] = {
                    "usage": {"input_tokens": draw(st.integers(0, 50)), "total_tokens": draw(value)}
                }
            result |= {"_ng_task_index": t, "_ng_rollout_index": r}
            results.append(result)
    return rows, results


def state_of(rows: Rows, results: Rows) -> ProfileState:
    state = ProfileState()
    for i, row in enumerate(rows):
        state.add_input(row, i, i)
    for result in results:
        state.add_result(result, agent=None)
    return state


def render(profile: Profile, rows: Rows) -> tuple[bytes, ...]:
    def sample(i: int) -> bytes:
        return orjson.dumps(
            {k: v for k, v in rows[i].items() if k not in ("_ng_task_index", "_ng_rollout_index")}
        )

    lines = b"".join(row.render(sample(row.sample_locator)) for row in profile.task_rows)
    return lines, orjson.dumps(profile.agent_metrics), orjson.dumps(profile.repeat_metrics)


@settings(max_examples=60, deadline=None)
@given(collections(), st.integers(2, 4), st.randoms(use_true_random=False))
def test_shards_merged_equal_one_pass(data: tuple[Rows, Rows], k: int, rnd: Any) -> None:
    rows, results = data
    whole = render(build_profile(state_of(rows, results)), rows)
    merged = ProfileState()
    for shard in range(k):
        part = ProfileState()
        for i, row in enumerate(rows):
            if i % k == shard:
                part.add_input(row, i, i)
        for j, result in enumerate(results):
            if (j * 7 + 3) % k == shard:
                part.add_result(result)
        merged.merge(part)
    assert render(build_profile(merged), rows) == whole


@settings(max_examples=60, deadline=None)
@given(collections(), st.randoms(use_true_random=False))
def test_any_arrival_order_gives_identical_bytes(data: tuple[Rows, Rows], rnd: Any) -> None:
    """Rows too may arrive in any order (several partitions): their file order is kept."""
    rows, results = data
    shuffled = list(results)
    rnd.shuffle(shuffled)
    arrival = list(enumerate(rows))
    rnd.shuffle(arrival)
    state = ProfileState()
    for i, row in arrival:
        state.add_input(row, i, i)
    for result in shuffled:
        state.add_result(result)
    assert render(build_profile(state), rows) == render(
        build_profile(state_of(rows, results)), rows
    )


@settings(max_examples=60, deadline=None)
@given(collections(), st.data())
def test_prefix_partial_profile_equals_state_partial(
    data: tuple[Rows, Rows], d: st.DataObject
) -> None:
    rows, results = data
    cut = d.draw(st.integers(0, len(results)))
    state = ProfileState()
    for i, row in enumerate(rows):
        state.add_input(row, i, i)
    for result in results[:cut]:
        state.add_result(result)
    partial = render(build_profile(state, allow_partial=True), rows)  # what a snapshot shows
    assert partial == render(build_profile(state_of(rows, results[:cut]), allow_partial=True), rows)
    if cut < len(results):
        with pytest.raises(ProfileError, match="allow_partial_rollouts"):
            build_profile(state)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.integers(1, 5))
def test_welford_and_chan_merge_equal_two_pass(values: list[float], parts: int) -> None:
    x = np.array(values)
    merged = Moments()
    for chunk in np.array_split(x, parts):
        m = Moments()
        for v in chunk.tolist():
            m.update(v)
        merged.merge(m)
    assert merged.count == len(x)
    assert math.isclose(merged.mean, float(x.mean()), rel_tol=1e-12, abs_tol=1e-9)
    if len(x) > 1:
        assert math.isclose(merged.std, float(x.std(ddof=1)), rel_tol=1e-9, abs_tol=1e-6)
    assert (merged.min, merged.max) == (float(x.min()), float(x.max()))
    assert Moments.of(x).count == len(x)


def test_live_stats_follow_agent_hint() -> None:
    state = ProfileState()
    state.add_result({"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0}, agent="a")
    state.add_result({"reward": 0.0, "_ng_task_index": 0, "_ng_rollout_index": 1}, agent="a")
    state.add_result(
        {"reward": 1.0, "mask_sample": True, "_ng_task_index": 1, "_ng_rollout_index": 0}, agent="a"
    )
    live: RunningStats = state.live()["a"]
    assert live.rollouts == 2
    assert live.columns["reward"].mean == 0.5


def test_rows_are_profiled_in_file_order_whatever_their_arrival() -> None:
    """A server fronting two agents is labelled by the agent of its *first row in the file*
    (docs/nemo-gym-compat.md §Run labels), even when a later row arrives first (another
    partition was faster)."""
    rows = [
        {"agent_ref": {"name": a}, "_ng_environment_server": "env"}
        | {"_ng_task_index": t, "_ng_rollout_index": 0}
        for t, a in enumerate(("alpha", "beta"))
    ]
    state = ProfileState()
    for line in (1, 0):
        state.add_input(rows[line], line, line)
    for t in (0, 1):
        state.add_result({"reward": 1.0, "_ng_task_index": t, "_ng_rollout_index": 0})
    labels = [e["agent_ref"]["name"] for e in build_profile(state).agent_metrics]
    assert labels == ["alpha"]


def test_columns_are_stored_as_their_records_are() -> None:
    """``add_columns`` (the lean reader's) and ``add_records`` (one record per result) give
    one state, schemas shared, entries at the same offsets."""
    results: list[dict[str, Any]] = [
        {"reward": 1.0, "n": 2, "_ng_task_index": 0, "_ng_rollout_index": 0},
        {"reward": 0.5, "n": 3, "_ng_task_index": 0, "_ng_rollout_index": 1},
        {"reward": True, "mask_sample": 1, "_ng_task_index": 1, "_ng_rollout_index": 0},
    ]
    records = [extract_result(r, r["_ng_task_index"], r["_ng_rollout_index"]) for r in results]
    tasks = [r["_ng_task_index"] for r in results]
    rollouts = [r["_ng_rollout_index"] for r in results]
    by_records, by_columns = ProfileState(), ProfileState()
    by_records.add_records(tasks, rollouts, records, [None] * 3)
    names, is_int, values, infos, masked, answers, _ = zip(*records, strict=True)
    schemas = list(zip(names, is_int, strict=True))
    flat = [v for row in values for v in row]
    by_columns.add_columns(tasks, rollouts, schemas, list(masked), list(answers), flat, infos)
    assert by_columns.export_columns() == by_records.export_columns()
    assert len(by_columns.schemas) == 2
