"""``ng_reward_profile +aggregate_metrics=true [+answer_key=F]``: pass@k, avg-of-k and majority@k
per agent equal NeMo Gym's reference computed from the files directly, and task difficulty."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from rewardstream.cli import ng_reward_profile
from tests import nemo_passk
from tests.golden import GOLDEN

AGENTS = ("alpha", "beta")


def write_collection(folder: Path, seed: int, continuous: bool = False) -> tuple[Path, Path]:
    """Two agents, 40 tasks each with up to 8 rollouts (some missing, some masked), answers
    that are sometimes null, rewards 0/1 or continuous."""
    rng = random.Random(seed)
    rows, results = [], []
    for task in range(40):
        agent = AGENTS[task % 2]
        skill = rng.random()
        for rollout in range(8):
            row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "q": f"t{task}"}
            row["agent_ref"] = {"name": agent}
            rows.append(row)
            if rng.random() < 0.1:
                continue  # never collected: a partial run
            right = rng.random() < skill
            reward: Any = round(rng.uniform(-1, 2), 3) if continuous else float(right)
            answer = None if rng.random() < 0.15 else str(task if right else rng.randrange(3))
            result = row | {"reward": reward, "extracted_answer": answer, "output_tokens": 7}
            if rng.random() < 0.05:
                result["mask_sample"] = True
            results.append(result)
    rng.shuffle(results)  # any order in the file
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    return inputs, rollouts


def reference(rollouts: Path, agent: str, answer_key: str | None) -> dict[str, Any]:
    """NeMo Gym's computation on one agent's measured results, grouped by task ascending."""
    results = [orjson.loads(line) for line in rollouts.read_bytes().splitlines()]
    mine = [r for r in results if r["agent_ref"]["name"] == agent and not r.get("mask_sample")]
    mine.sort(key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    tasks: dict[int, list[dict[str, Any]]] = {}
    for r in mine:
        tasks.setdefault(r["_ng_task_index"], []).append(r)
    return nemo_passk.compute_pass_majority_metrics(list(tasks.values()), answer_key)


@pytest.mark.parametrize("continuous", [False, True], ids=["binary", "continuous"])
@pytest.mark.parametrize("answer_key", [None, "extracted_answer"])
def test_aggregate_metrics_equal_the_reference(
    tmp_path: Path, continuous: bool, answer_key: str | None
) -> None:
    inputs, rollouts = write_collection(tmp_path, seed=7, continuous=continuous)
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    argv += ["++allow_partial_rollouts=True", "+quiet=true", "+aggregate_metrics=true"]
    argv += [f"+answer_key={answer_key}"] if answer_key else []
    assert ng_reward_profile(argv) == 0
    agents = orjson.loads((tmp_path / "r_agent_metrics.json").read_bytes())
    written = orjson.loads((tmp_path / "r_aggregate_metrics.json").read_bytes())
    assert [e["agent_ref"]["name"] for e in written] == list(AGENTS)
    for entry, profile_entry in zip(written, agents, strict=True):
        want = reference(rollouts, entry["agent_ref"]["name"], answer_key)
        metrics = entry["agent_metrics"]
        profile_part = {k: v for k, v in profile_entry.items() if k != "agent_ref"}
        assert list(metrics)[: len(profile_part)] == list(profile_part)  # the profile first
        got = {k: metrics[k] for k in want}
        assert got == want  # exact, in NeMo Gym's key order
        assert list(metrics)[len(profile_part) : -1] == list(want)
        assert metrics["num_repeats"] == 8
        assert entry["key_metrics"] == nemo_passk.get_key_metrics(metrics)
        assert ("majority@8/accuracy" in metrics) is (answer_key is not None)


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    inputs, rollouts = write_collection(tmp_path, seed=1)
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "++allow_partial_rollouts=True", "+quiet=true"]) == 0
    assert not (tmp_path / "r_aggregate_metrics.json").exists()
    assert not (tmp_path / "r_task_difficulty.json").exists()


def test_answer_key_alone_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, rollouts = write_collection(tmp_path, seed=1)
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "+answer_key=extracted_answer"]) == 2
    err = capsys.readouterr().err
    assert err == "ng_reward_profile: error: +answer_key applies with +aggregate_metrics=true\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r_materialized_inputs.jsonl"]


def test_the_golden_asr_keys_of_the_pass_at_k_hook(tmp_path: Path) -> None:
    """NeMo Gym's own aggregate file for asr_with_pc holds pass@1 of accuracy and no_answer
    (its server adds a ``per`` score of its own): ours equals it on those."""
    src = GOLDEN / "asr_with_pc" / "upstream"
    for name in ("example_rollouts.jsonl", "example_rollouts_materialized_inputs.jsonl"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    inputs = tmp_path / "example_rollouts_materialized_inputs.jsonl"
    argv = [
        f"+materialized_inputs_jsonl_fpath={inputs}",
        f"+rollouts_jsonl_fpath={tmp_path / 'example_rollouts.jsonl'}",
        "+quiet=true",
        "+aggregate_metrics=true",
        "+answer_key=pred_text",
    ]
    assert ng_reward_profile(argv) == 0
    (ours,) = orjson.loads((tmp_path / "example_rollouts_aggregate_metrics.json").read_bytes())
    (theirs,) = orjson.loads((src / "example_rollouts_aggregate_metrics.json").read_bytes())
    keys = [k for k in theirs["agent_metrics"] if k.endswith(("/accuracy", "/no_answer"))]
    assert len(keys) == 4
    assert {k: ours["agent_metrics"][k] for k in keys} == {
        k: theirs["agent_metrics"][k] for k in keys
    }
    per_sample = theirs["agent_metrics"]["per_sample_aggregate"]
    assert ours["agent_metrics"]["per_sample_aggregate"] == {
        k: per_sample[k] for k in ("accuracy", "no_answer")
    }


def test_task_difficulty(tmp_path: Path) -> None:
    rows, results = [], []
    rewards: dict[int, list[float]] = {
        0: [1, 1, 1],
        1: [0, 0, 0],
        2: [1, 0, 1],
        3: [0],
        4: [0.5, 0.5],
    }
    for task, values in rewards.items():
        for rollout, reward in enumerate(values):
            row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": "a"}}
            rows.append(row)
            results.append(row | {"reward": reward})
    inputs, rollouts = tmp_path / "d_materialized_inputs.jsonl", tmp_path / "d.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "+quiet=true", "+aggregate_metrics=true"]) == 0
    (got,) = orjson.loads((tmp_path / "d_task_difficulty.json").read_bytes())
    assert got["agent_ref"] == {"name": "a"}
    counts = {k: got[k] for k in ("tasks", "rollouts", "single", "scored", "all_max", "all_min")}
    assert counts == {
        "tasks": 5,
        "rollouts": 12,
        "single": 1,
        "scored": 4,
        "all_max": 1,
        "all_min": 1,
    }
    assert (got["zero_variance"], got["mixed"], got["zero_variance_share"]) == (3, 1, 0.75)
    # per-task means 1, 0, 2/3, 0, 0.5 in ten bins over [0, 1]
    assert got["mean_reward"]["counts"] == [2, 0, 0, 0, 0, 1, 1, 0, 0, 1]
