"""pass@k, avg-of-k and majority@k from columns equal NeMo Gym's reference, to the bit."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.processors.core.passk import key_metrics, pass_majority_metrics
from rewardstream.processors.core.profile import build_profile
from rewardstream.processors.core.records import NO_ANSWER, answer_id
from rewardstream.processors.core.state import ProfileState
from tests import nemo_passk

ANSWERS = st.one_of(st.none(), st.sampled_from(["1", "2", "x"]), st.integers(0, 2), st.booleans())
BINARY = st.sampled_from([0, 1, 0.0, 1.0, True, False])
CONTINUOUS = st.one_of(BINARY, st.floats(-3, 3, allow_nan=False, width=32), st.integers(-2, 3))


@st.composite
def collections(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Tasks of rollouts (gaps and uneven counts included), binary or continuous rewards."""
    reward = draw(st.sampled_from([BINARY, CONTINUOUS]))
    tasks = draw(
        st.lists(
            st.lists(
                st.fixed_dictionaries({"reward": reward, "a": ANSWERS}), min_size=1, max_size=9
            ),
            min_size=1,
            max_size=12,
        )
    )
    return tasks


def columns(tasks: list[list[dict[str, Any]]]) -> tuple[Any, Any, Any, Any]:
    task = np.array([t for t, rollouts in enumerate(tasks) for _ in rollouts], dtype=np.int64)
    reward = np.array([float(r["reward"]) for rollouts in tasks for r in rollouts])
    answers = np.array([answer_id(r["a"]) for rollouts in tasks for r in rollouts], dtype=np.int64)
    ints = np.array([type(r["reward"]) is not float for rollouts in tasks for r in rollouts])
    return task, reward, answers, ints.astype(bool)


@settings(max_examples=400, deadline=None)
@given(collections(), st.booleans())
def test_equal_to_the_reference(tasks: list[list[dict[str, Any]]], with_answers: bool) -> None:
    task, reward, answers, ints = columns(tasks)
    got = pass_majority_metrics(task, reward, answers if with_answers else None, ints)
    want = nemo_passk.compute_pass_majority_metrics(tasks, "a" if with_answers else None)
    assert list(got) == list(want)
    assert got == want  # exact: the same sums in the same order
    assert key_metrics(got) == nemo_passk.get_key_metrics(want)


def test_answer_identity_follows_python_equality() -> None:
    assert answer_id(1) == answer_id(1.0) == answer_id(True)
    assert answer_id("1") != answer_id(1)
    assert answer_id(None) == NO_ANSWER
    assert answer_id({"b": 1, "a": [2.0]}) == answer_id({"a": [2], "b": True})


def test_no_rollouts_no_metrics() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert pass_majority_metrics(empty, np.zeros(0)) == {}


@st.composite
def shards(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Rows and results of two agents (gaps, masked results), the results dealt into shards in
    any order: what partitions and processors hold."""
    reward = draw(st.sampled_from([BINARY, CONTINUOUS]))
    rows, results = [], []
    for task in range(draw(st.integers(1, 8))):
        agent = draw(st.sampled_from(["a", "b"]))
        for rollout in range(draw(st.integers(1, 6))):
            row = {
                "_ng_task_index": task,
                "_ng_rollout_index": rollout,
                "agent_ref": {"name": agent},
            }
            rows.append(row)
            if draw(st.integers(0, 9)) == 0:
                continue  # not collected (yet)
            result = row | {"reward": draw(reward), "a": draw(ANSWERS)}
            if draw(st.integers(0, 9)) == 0:
                result["mask_sample"] = True
            results.append(result)
    order = draw(st.permutations(results))
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=3)))
    parts = [list(order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]
    return rows, parts


@settings(max_examples=150, deadline=None)
@given(shards())
def test_merged_shards_in_any_order_equal_the_reference(
    data: tuple[list[dict[str, Any]], list[list[dict[str, Any]]]],
) -> None:
    rows, parts = data
    state = ProfileState()
    for i, row in enumerate(rows):
        state.add_input(row, 0, i)
    for part in parts:
        shard = ProfileState()
        for result in part:
            shard.add_result(result, answer_key="a")
        state.merge(shard)
    profile = build_profile(state, allow_partial=True)
    measured = [r for part in parts for r in part if not r.get("mask_sample")]
    for entry in profile.aggregate_metrics(answers=True):
        agent = entry["agent_ref"]["name"]
        mine = sorted(
            (r for r in measured if r["agent_ref"]["name"] == agent),
            key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]),
        )
        tasks: dict[int, list[dict[str, Any]]] = {}
        for r in mine:
            tasks.setdefault(r["_ng_task_index"], []).append(r)
        want = nemo_passk.compute_pass_majority_metrics(list(tasks.values()), "a")
        assert {k: entry["agent_metrics"][k] for k in want} == want


_REFERENCE = """
import json, sys
from nemo_gym.reward_profile import compute_pass_majority_metrics
for case in json.load(open(sys.argv[1])):
    metrics = compute_pass_majority_metrics(case["tasks"], answer_key=case["answer_key"])[0]
    print(json.dumps(metrics))
"""


def test_side_by_side_with_the_installed_nemo_gym(tmp_path: Path, nemo_python: Path) -> None:
    """Its own ``compute_pass_majority_metrics`` on generated sets, not a transcription."""
    sets = [_seeded(seed, continuous=seed % 2 == 1) for seed in range(40)]
    keys = ["a" if seed % 3 else None for seed in range(40)]
    path = tmp_path / "cases.json"
    cases = [{"tasks": t, "answer_key": k} for t, k in zip(sets, keys, strict=True)]
    path.write_text(json.dumps(cases))
    proc = subprocess.run(
        [str(nemo_python), "-c", _REFERENCE, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    theirs = [json.loads(line) for line in proc.stdout.splitlines()]
    for tasks, key, want in zip(sets, keys, theirs, strict=True):
        task, reward, answers, ints = columns(tasks)
        got = pass_majority_metrics(task, reward, answers if key else None, ints)
        assert json.loads(json.dumps(got)) == want


def _seeded(seed: int, continuous: bool) -> list[list[dict[str, Any]]]:
    """200 tasks of 1-16 rollouts, 0/1 rewards or a mix of floats and JSON ints, answers
    sometimes missing."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(200):
        skill = rng.random()
        tasks.append(
            [
                {
                    "reward": (rng.choice([rng.uniform(-1, 2), rng.randint(0, 3)]))
                    if continuous
                    else float(rng.random() < skill),
                    "a": None if rng.random() < 0.1 else str(rng.randrange(4)),
                }
                for _ in range(rng.randint(1, 16))
            ]
        )
    return tasks
