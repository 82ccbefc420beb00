"""``ng_reward_profile +aggregate_metrics=true [+answer_key=F]``: pass@k, avg-of-k and majority@k
per agent equal NeMo Gym's reference computed from the files directly, task difficulty and the
intervals."""

from __future__ import annotations

import asyncio
import math
import random
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from rewardstream.commands.cli import main, ng_reward_profile
from rewardstream.contract.events import Topics
from rewardstream.processors.core.confseq import Tally, bernoulli_interval
from tests import nemo_passk
from tests.golden import GOLDEN
from tests.processes import Processor, make_topics

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
    assert not (tmp_path / "r_intervals.json").exists()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["+answer_key=extracted_answer"], "+answer_key applies with +aggregate_metrics=true"),
        (["+interval_level=0.9"], "+interval_level applies with +aggregate_metrics=true"),
        (
            ["+aggregate_metrics=true", "+interval_level=1"],
            "invalid configuration 'interval_level': input should be less than 1, got 1",
        ),
        (
            ["+aggregate_metrics=true", "+interval_level=95%"],
            "invalid configuration 'interval_level': expected a number, got '95%'",
        ),
    ],
)
def test_extras_alone_or_a_bad_level_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str], said: str
) -> None:
    inputs, rollouts = write_collection(tmp_path, seed=1)
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, *given]) == 2
    assert capsys.readouterr().err == f"ng_reward_profile: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r_materialized_inputs.jsonl"]


def test_profiles_interval_level_is_the_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rewardstream profile --interval-level`` writes what ``+interval_level`` does; a level
    outside (0, 1) is one line, exit 2."""
    inputs, rollouts = write_collection(tmp_path, seed=3)
    files = ["--inputs", str(inputs), "--rollouts", str(rollouts), "--quiet", "--aggregate-metrics"]
    files += ["--allow-partial-rollouts"]
    with pytest.raises(SystemExit) as exc:
        main(["profile", *files, "--interval-level", "1.5"])
    assert exc.value.code == 2
    said = capsys.readouterr().err.splitlines()[-1]
    assert said == (
        "rewardstream profile: error: argument --interval-level: expected a level in (0, 1), "
        "e.g. 0.95, got '1.5'"
    )
    assert main(["profile", *files, "--interval-level", "0.8"]) == 0
    flag = (tmp_path / "r_intervals.json").read_bytes()
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    more = ["++allow_partial_rollouts=True", "+quiet=true", "+aggregate_metrics=true"]
    assert ng_reward_profile([*argv, *more, "+interval_level=0.8"]) == 0
    assert (tmp_path / "r_intervals.json").read_bytes() == flag
    assert orjson.loads(flag)["level"] == 0.8


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


# --------------------------------------------------------------------------- through Kafka


def batch_aggregates(inputs: Path, lines: list[bytes], out: Path) -> None:
    """``ng_reward_profile`` with aggregates on ``lines`` (a consumed prefix) in ``out``."""
    out.mkdir()
    (out / "r_materialized_inputs.jsonl").write_bytes(inputs.read_bytes())
    (out / "r.jsonl").write_bytes(b"".join(lines))
    argv = [
        f"+materialized_inputs_jsonl_fpath={out / 'r_materialized_inputs.jsonl'}",
        f"+rollouts_jsonl_fpath={out / 'r.jsonl'}",
        "++allow_partial_rollouts=True",
        "+quiet=true",
        "+aggregate_metrics=true",
        "+answer_key=extracted_answer",
    ]
    assert ng_reward_profile(argv) == 0


EXTRA = ("r_aggregate_metrics.json", "r_task_difficulty.json", "r_intervals.json")


def _sample(exposition: str, series: str) -> float:
    """The value of one series in a Prometheus text exposition."""
    (line,) = [x for x in exposition.splitlines() if x.startswith(series + " ")]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.kafka
def test_streamed_snapshot_and_final_carry_the_batch_aggregates(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Published with --aggregate-metrics --answer-key: a mid-run snapshot's aggregate and
    difficulty files equal the batch ones on the consumed prefix; the final's equal batch;
    /runs/<id> and /metrics show the live figures."""
    data = tmp_path / "data"
    data.mkdir()
    inputs, rollouts = write_collection(data, seed=11)
    lines = rollouts.read_bytes().splitlines(keepends=True)
    prefix = unique_name("agg")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 2))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    live = tmp_path / "live"
    live.mkdir()
    (live / inputs.name).write_bytes(inputs.read_bytes())
    half = len(lines) // 2
    (live / "r.jsonl").write_bytes(b"".join(lines[:half]))
    cmd = [sys.executable, "-m", "rewardstream.commands.cli", "publish", "--follow", "--quiet"]
    cmd += ["--inputs", str(live / inputs.name), "--rollouts", str(live / "r.jsonl")]
    cmd += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "agg"]
    cmd += ["--aggregate-metrics", "--answer-key", "extracted_answer"]
    # partial (some rows never get a result): the run is finished by the stop below, once
    # every line is in, never by an idle timer a loaded machine could outlast mid-test
    cmd += ["--finish-on-stop"]
    publisher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.wait(lambda runs: runs.get("agg", {}).get("rollouts") == half)
        snap = tmp_path / "snap"
        argv = ["snapshot", "--url", p.url, "--run-id", "agg", "--out", str(snap)]
        assert main(argv) == 0
        batch_aggregates(inputs, lines[:half], tmp_path / "half")
        for name in (*EXTRA, "r_reward_profiling.jsonl"):
            assert (snap / name).read_bytes() == (tmp_path / "half" / name).read_bytes(), name
        detail = orjson.loads(urllib.request.urlopen(f"{p.url}/runs/agg", timeout=10).read())
        assert detail["rollouts"] == half
        assert set(detail["agents"]) == set(AGENTS)
        for agent in AGENTS:
            tasks = detail["agents"][agent]["tasks"]
            assert tasks["tasks"] > 0 and "zero_variance_share" in tasks
            assert set(detail["agents"][agent]["pass_at_k"]) >= {"1"}
        metrics = urllib.request.urlopen(f"{p.url}/metrics", timeout=10).read().decode()
        for family in (
            "rewardstream_pass_at_k_tasks_sum",
            "rewardstream_tasks",
            "rewardstream_task_mean_reward_bucket",
        ):
            assert f"{family}{{" in metrics, family
        assert 'rewardstream_tasks{agent="alpha",kind="zero_variance",run_id="agg"}' in metrics
        # the live pass@k is the snapshot's (one processor: all the tasks)
        snapped = orjson.loads((snap / EXTRA[0]).read_bytes())
        for entry in snapped:
            agent = entry["agent_ref"]["name"]
            labels = f'{{agent="{agent}",k="1",run_id="agg"}}'
            total = _sample(metrics, f"rewardstream_pass_at_k_tasks_sum{labels}")
            tasks = _sample(metrics, f"rewardstream_pass_at_k_tasks{labels}")
            shown = 100.0 * total / tasks
            assert math.isclose(shown, entry["agent_metrics"]["pass@1/accuracy"], rel_tol=1e-12)
        # curate from the live run equals curate from the batch profile of the same prefix
        band = ["--band", "0.2", "0.8"]
        live_argv = ["curate", "--url", p.url, "--run-id", "agg", *band]
        assert main([*live_argv, "--out", str(tmp_path / "live.jsonl")]) == 0
        half_batch = str(tmp_path / "half" / "r_reward_profiling.jsonl")
        assert main(["curate", half_batch, *band, "--out", str(tmp_path / "b.jsonl")]) == 0
        assert (tmp_path / "live.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
        with (live / "r.jsonl").open("ab") as fh:
            fh.writelines(lines[half:])
        p.wait(lambda runs: runs.get("agg", {}).get("rollouts") == len(lines))
        publisher.send_signal(signal.SIGINT)
        out, err = publisher.communicate(timeout=120)
        assert out.startswith(b"published run_id=agg "), (out, err)
    finally:
        if publisher.poll() is None:
            publisher.kill()
            publisher.communicate()
    p.wait(lambda runs: runs.get("agg", {}).get("done") is True)
    final = tmp_path / "final"
    argv = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", "agg", "--out", str(final), "--timeout", "60"]) == 0
    batch_aggregates(inputs, lines, tmp_path / "whole")
    for name in (*EXTRA, "r_reward_profiling.jsonl", "r_agent_metrics.json"):
        assert (final / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    kafka_argv = ["curate", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    kafka_argv += ["--run-id", "agg", "--min-std", "0.3", "--timeout", "30"]
    assert main([*kafka_argv, "--out", str(tmp_path / "final.jsonl")]) == 0
    whole = str(tmp_path / "whole")
    assert main(["curate", whole, "--min-std", "0.3", "--out", str(tmp_path / "w.jsonl")]) == 0
    assert (tmp_path / "final.jsonl").read_bytes() == (tmp_path / "w.jsonl").read_bytes()
    mirrored = tmp_path / "out" / "agg"
    assert (mirrored / EXTRA[0]).read_bytes() == (tmp_path / "whole" / EXTRA[0]).read_bytes()


# --------------------------------------------------------------------------- curate


def curated_profile(
    folder: Path, tasks: list[list[float]] | None = None, agent: str | None = None, *flags: str
) -> Path:
    """A batch profile of each task's rewards (by default 0/1 rewards with known pass rates
    per task: 0, 1/4, 1/2, 3/4, 1), by ``agent`` when named; ``flags``: more overrides."""
    folder.mkdir(exist_ok=True)
    rows, results = [], []
    for task, rewards in enumerate(tasks or [[float(i < p) for i in range(4)] for p in range(5)]):
        for rollout, reward in enumerate(rewards):
            row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "question": f"q{task}"}
            row |= {"agent_ref": {"name": agent}} if agent else {}
            rows.append(row)
            results.append(row | {"reward": reward})
    inputs, rollouts = folder / "c_materialized_inputs.jsonl", folder / "c.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "+quiet=true", *flags]) == 0
    return folder / "c_reward_profiling.jsonl"


def test_curate_keeps_the_band_once_per_task_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = curated_profile(tmp_path)
    out = tmp_path / "kept.jsonl"
    assert main(["curate", str(profile), "--band", "0.2", "0.8", "--out", str(out)]) == 0
    kept = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert kept == [{"question": "q1"}, {"question": "q2"}, {"question": "q3"}]  # no _ng_ keys
    printed = capsys.readouterr().out
    assert ": kept 3 of 5 tasks (60.0%)" in printed and "wrote 3 tasks" in printed
    rows = {
        line.split()[2]: line.split()[3:] for line in printed.splitlines() if "reward 0" in line
    }
    # the band keeps 1/4, 1/2, 3/4; 0 and 1 are shown beside them, left out
    assert rows["0.0-0.1"] == ["0", "1", "." * 30] and rows["0.9-1.0"] == ["0", "1", "." * 30]
    assert rows["0.2-0.3"] == ["1", "1", "#" * 30] and rows["0.7-0.8"] == ["1", "1", "#" * 30]
    assert rows["0.5-0.6"] == ["1", "1", "#" * 30] and rows["0.3-0.4"] == ["0", "0"]
    assert main(["curate", str(tmp_path), "--min-std", "0.4", "--out", str(out)]) == 0
    kept = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert kept == [{"question": "q1"}, {"question": "q2"}, {"question": "q3"}]  # std 0.5-0.58
    both = ["--band", "0.4", "1", "--min-std", "0.4"]
    assert main(["curate", str(profile), *both, "--out", str(out)]) == 0
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == [
        {"question": "q2"},
        {"question": "q3"},
    ]


def _kept(out: Path) -> list[str]:
    return [orjson.loads(line)["question"] for line in out.read_bytes().splitlines()]


def test_curate_with_confidence_keeps_a_task_whose_whole_interval_is_in_the_band(
    tmp_path: Path,
) -> None:
    """16 rollouts of 0/1 rewards, 0, 4, 8, 12 and 16 passes: the means 1/4, 1/2 and 3/4 are
    in [0.1, 0.97], the 95% sequences of 8 ([0.169, 0.831]) and 12 ([0.376, 0.963]) only."""
    tasks = [[float(i < p) for i in range(16)] for p in (0, 4, 8, 12, 16)]
    profile = curated_profile(tmp_path, tasks)
    out, band = tmp_path / "kept.jsonl", ["--band", "0.1", "0.97"]
    assert main(["curate", str(profile), *band, "--out", str(out)]) == 0
    assert _kept(out) == ["q1", "q2", "q3"]
    assert main(["curate", str(profile), *band, "--confidence", "0.95", "--out", str(out)]) == 0
    assert _kept(out) == ["q2", "q3"]
    wider = ["--band", "0.05", "0.97", "--out", str(out)]
    assert main(["curate", str(profile), *wider, "--confidence", "0.95"]) == 0
    assert _kept(out) == ["q2", "q3"]  # 4 of 16: [0.037, 0.624]
    assert main(["curate", str(profile), *wider, "--confidence", "0.5"]) == 0
    assert _kept(out) == ["q1", "q2", "q3"]  # a lower level: [0.074, 0.514]


def test_curate_with_confidence_reads_other_rewards_intervals_from_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task of rewards 0, 1, 1/2, 1/2 (x 50) has a 0/1 task's mean, min and max, not its std: its
    interval is the run's ``_intervals.json``'s, and without that file it is one line."""
    tasks = [[1.0, 0.0] * 8, [0.0, 1.0, 0.5, 0.5] * 50]
    argv = ["--band", "0.1", "0.9", "--confidence", "0.95", "--out", str(tmp_path / "o.jsonl")]
    plain = curated_profile(tmp_path / "plain", tasks, "a")
    assert main(["curate", str(plain), *argv]) == 2
    err = capsys.readouterr().err
    assert "task 1 of agent 'a' has rewards other than 0 and 1" in err and err.count("\n") == 1
    assert "c_intervals.json" in err and not (tmp_path / "o.jsonl").exists()
    extras = curated_profile(tmp_path / "extras", tasks, "a", "+aggregate_metrics=true")
    assert main(["curate", str(extras), *argv]) == 0
    intervals = orjson.loads((tmp_path / "extras" / "c_intervals.json").read_bytes())
    second = intervals["agents"][0]["tasks"][1]
    assert 0.1 <= second["lower"] <= second["upper"] <= 0.9
    assert _kept(tmp_path / "o.jsonl") == ["q0", "q1"]
    at_90 = [a if a != "0.95" else "0.9" for a in argv]
    assert main(["curate", str(extras), *at_90]) == 2  # the file is at 0.95 only
    assert "needs its interval from c_intervals.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "o.jsonl"], "curate needs --band LO HI and/or --min-std S"),
        (["--band", "0.9", "0.1", "--out", "o.jsonl"], "--band needs finite LO <= HI"),
        (["--band", "nan", "1", "--out", "o.jsonl"], "--band needs finite LO <= HI"),
        (["--min-std", "inf", "--out", "o.jsonl"], "--min-std needs a finite number"),
        (["--band", "2", "3", "--out", "o.jsonl"], "no task survives of 5 in"),
        (["--min-std", "0", "--confidence", "0.9", "--out", "o"], "--confidence needs --band"),
        (["--band", "0", "1", "--confidence", "1", "--out", "o"], "--confidence needs a level"),
    ],
)
def test_curate_refuses_bad_arguments_and_empty_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    profile = curated_profile(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["curate", str(profile), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rewardstream: error: ") and message in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_curate_names_a_file_that_is_no_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "x_reward_profiling.jsonl"
    bogus.write_text('{"a": 1}\n')
    assert main(["curate", str(bogus), "--band", "0", "1", "--out", str(tmp_path / "o")]) == 2
    assert f"{bogus} line 1: not a task row with a 'sample'" in capsys.readouterr().err
    assert main(["curate", str(tmp_path / "nope"), "--band", "0", "1", "--out", "o"]) == 2
    assert "Input file not found" in capsys.readouterr().err


@pytest.mark.parametrize(("level", "given"), [(0.95, []), (0.9, ["+interval_level=0.9"])])
def test_intervals(tmp_path: Path, level: float, given: list[str]) -> None:
    """``_intervals.json``: per agent the mean reward's sequence over its rollouts in (task,
    rollout) order, whatever order the file has; per task the pass rate's for 0/1 tasks, the
    empirical-Bernstein one else; none where a reward is outside [0, 1]; at 0.95, or at
    ``+interval_level``."""
    rewards: dict[int, tuple[str, list[float]]] = {
        0: ("a", [1, 1, 1, 1]),
        1: ("a", [0, 1, 0, 1]),
        2: ("a", [0.5, 0.25, 1.0]),
        3: ("b", [1, 0, 1]),
        4: ("b", [3.0, 1.0]),
    }
    rows, results = [], []
    for task, (agent, values) in rewards.items():
        for rollout, reward in enumerate(values):
            row = {"_ng_task_index": task, "_ng_rollout_index": rollout}
            rows.append(row | {"agent_ref": {"name": agent}})
            results.append(row | {"agent_ref": {"name": agent}, "reward": reward})
    random.Random(5).shuffle(results)
    inputs, rollouts = tmp_path / "d_materialized_inputs.jsonl", tmp_path / "d.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "+quiet=true", "+aggregate_metrics=true", *given]) == 0
    got = orjson.loads((tmp_path / "d_intervals.json").read_bytes())
    assert got["level"] == level and [a["agent_ref"]["name"] for a in got["agents"]] == ["a", "b"]
    a, b = got["agents"]
    in_order = Tally()
    in_order.add_many(np.array([v for t in (0, 1, 2) for v in rewards[t][1]], dtype=float))
    assert a["rollouts"] == 11 and a["mean_reward"] == {
        "lower": in_order.interval(level).lower,  # type: ignore[union-attr]
        "upper": in_order.interval(level).upper,  # type: ignore[union-attr]
        "range": [0.0, 1.0],
        "outside": 0,
    }
    lower, upper = bernoulli_interval(np.array([4, 2]), np.array([4, 4]), 1 - level)
    task2 = Tally()
    task2.add_many(np.array(rewards[2][1]))
    assert a["tasks"] == [
        {"_ng_task_index": 0, "rollouts": 4, "lower": lower[0], "upper": upper[0]},
        {"_ng_task_index": 1, "rollouts": 4, "lower": lower[1], "upper": upper[1]},
        {
            "_ng_task_index": 2,
            "rollouts": 3,
            # vectorized over tasks: numpy's SIMD log may differ in the last bit
            "lower": pytest.approx(task2.interval(level).lower, rel=1e-14),  # type: ignore[union-attr]
            "upper": pytest.approx(task2.interval(level).upper, rel=1e-14),  # type: ignore[union-attr]
        },
    ]
    assert b["mean_reward"]["outside"] == 1 and b["mean_reward"]["lower"] is None
    assert b["tasks"][1] == {"_ng_task_index": 4, "rollouts": 2, "lower": None, "upper": None}
    assert b["tasks"][0]["lower"] is not None
