"""``rewardstream compare`` against a real processor's HTTP face on loopback (``make_app`` over a
``Pipeline`` fed the runs' events in process, no broker): its numbers are the ones computed
again here from the rollouts files alone, its verdicts on runs built to be clearly better,
clearly worse, equal or too close to tell are those, a reward outside the range is said, an
unknown run and an unreachable processor are one line and exit 2, and the table fits 80
columns. Its task flips are those of ``gym eval compare`` on the same rollouts aggregated by
``ng_aggregate_rollouts``, taken again only when due; once both runs are final, its
``--output-dir`` report is the batch command's on the final files, byte for byte but for the
time it was made."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from rewardstream.commands import gym_cli
from rewardstream.commands.cli import main
from rewardstream.commands.live_compare import TaskFlips, live_compare
from rewardstream.contract.events import RunFinished, RunStarted, encode
from rewardstream.processors.core.confseq import mixture_boundary
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app
from rewardstream.processors.inprocess import finish
from rewardstream.producers.events import input_events, rollout_events
from rewardstream.producers.gym import aggregate_rollouts
from tests.processes import serving

LONG = "arithmetic_simple_agent_with_a_long_name"
REPORTS = ("compare_report.md", "compare_report.json")
TASKS, REPEATS = 100, 6
Reward = Callable[[str, int, int], float]


def _rate(rate: float) -> Reward:
    """0/1 rewards, a share ``rate`` (in twentieths) of the rollouts right, spread over tasks."""
    return lambda _agent, task, rollout: float((task * REPEATS + rollout) % 20 < rate * 20)


RUNS: dict[str, Reward] = {
    "base": _rate(0.3),
    "better": _rate(0.8),
    "worse": _rate(0.0),
    "same": _rate(0.3),
    "close": _rate(0.35),
    "outside": lambda _a, task, rollout: 1.5 if task == rollout == 0 else 0.5,
    # random-looking rewards, two agents, for the numbers
    "mixed-a": lambda a, task, rollout: ((task * 7919 + rollout * 104729 + len(a)) % 1000) / 999,
    "mixed-b": lambda a, task, rollout: float((task * 31 + rollout * 17 + len(a)) % 5 < 3),
}
FINAL = {"final-a": _rate(0.3), "final-b": _rate(0.45)}  # final, with aggregate metrics
_STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


def _collection(folder: Path, reward: Reward, agents: list[str]) -> tuple[Path, Path]:
    """``TASKS`` tasks of ``REPEATS`` rollouts, dealt to ``agents`` in turn, rewarded by
    ``reward``."""
    folder.mkdir(parents=True)
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    usage = {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}
    keyed = [(agents[t % len(agents)], t, r) for t in range(TASKS) for r in range(REPEATS)]
    rows = [
        {
            "responses_create_params": {"input": f"question {t}"},
            "agent_ref": {"name": a},
            "_ng_task_index": t,
            "_ng_rollout_index": r,
        }
        for a, t, r in keyed
    ]
    inputs.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    results = (
        row | {"response": {"usage": usage}, "reward": reward(*key)}
        for row, key in zip(rows, keyed, strict=True)
    )
    rollouts.write_bytes(b"".join(orjson.dumps(result) + b"\n" for result in results))
    return inputs, rollouts


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The processor's URL serving every run of :data:`RUNS`, and the folder of their files."""
    data = tmp_path_factory.mktemp("runs")
    pipeline = Pipeline(data / "state")
    for run_id, reward in (RUNS | FINAL).items():
        agents = [LONG, "judge"] if run_id.startswith("mixed") else [LONG]
        inputs, rollouts = _collection(data / run_id, reward, agents)
        for event in [*input_events(inputs, run_id), *rollout_events(rollouts, run_id)]:
            pipeline.handle(event.kind, event.value)
        started = RunStarted(
            run_id=run_id,
            expected_rollouts=TASKS * REPEATS,
            output_stem="r",
            aggregate_metrics=run_id in FINAL,
        )
        pipeline.handle("control", encode(started))
        if run_id in FINAL:
            run = pipeline.handle("control", encode(RunFinished(run_id=run_id)))
            assert run is not None and finish(pipeline, run) is not None
    try:
        with serving(make_app(pipeline, None)) as url:
            yield url, data
    finally:
        pipeline.close()


def _compare(
    capsys: pytest.CaptureFixture[str], url: str, base: str, candidate: str, *more: str
) -> tuple[int, str, str]:
    code = main(["compare", "--url", url, "--baseline-run", base, "--candidate-run", candidate,
                 "--once", *more])  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def _verdicts(capsys: pytest.CaptureFixture[str], url: str, candidate: str, *more: str) -> Any:
    code, out, err = _compare(capsys, url, "base", candidate, "--json", *more)
    assert code == 0 and err == "", err
    return {row["agent"]: row for row in json.loads(out)["agents"]}


def _interval(rewards: list[float], level: float) -> tuple[float, float]:
    """The empirical-Bernstein sequence over ``rewards`` in order, from its definition
    (docs/intervals.md §Method): mean -+ u(V) / n, V = sum (x_i - running mean before i)^2
    with the running mean started at 1/2, each side at (1 - level) / 2, clipped to [0, 1]."""
    total, spread = 0.0, 0.0
    for i, x in enumerate(rewards):
        spread += (x - (0.5 + total) / (i + 1)) ** 2
        total += x
    radius = float(mixture_boundary(spread, (1 - level) / 2)) / len(rewards)
    mean = total / len(rewards)
    return max(mean - radius, 0.0), min(mean + radius, 1.0)


def test_the_numbers_are_the_rollouts_files(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Per agent: rollouts and means of each run, the difference and its interval at level
    0.9 (each run's at 0.95), as computed again from the files in their order."""
    url, data = served
    code, out, err = _compare(capsys, url, "mixed-a", "mixed-b", "--json", "--level", "0.9")
    assert code == 0 and err == "", err
    comparison = json.loads(out)
    assert comparison["level"] == 0.9 and comparison["run_level"] == pytest.approx(0.95)
    by_agent: dict[str, dict[str, list[float]]] = {}
    for role, run in (("baseline", "mixed-a"), ("candidate", "mixed-b")):
        for line in (data / run / "r.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            by_agent.setdefault(row["agent_ref"]["name"], {}).setdefault(role, [])
            by_agent[row["agent_ref"]["name"]][role].append(row["reward"])
    rows = {row["agent"]: row for row in comparison["agents"]}
    assert rows.keys() == by_agent.keys() == {LONG, "judge"}
    for agent, rewards in by_agent.items():
        row = rows[agent]
        a, b = rewards["baseline"], rewards["candidate"]
        assert (row["baseline"]["rollouts"], row["candidate"]["rollouts"]) == (len(a), len(b))
        assert math.isclose(row["baseline"]["mean"], statistics.fmean(a), rel_tol=1e-12)
        assert math.isclose(row["candidate"]["mean"], statistics.fmean(b), rel_tol=1e-12)
        assert math.isclose(row["difference"], statistics.fmean(b) - statistics.fmean(a),
                            rel_tol=1e-9, abs_tol=1e-12)  # fmt: skip
        (a_lo, a_hi), (b_lo, b_hi) = _interval(a, 0.95), _interval(b, 0.95)
        assert row["lower"] == pytest.approx(b_lo - a_hi, abs=1e-9)
        assert row["upper"] == pytest.approx(b_hi - a_lo, abs=1e-9)
        assert row["reason"] is None


@pytest.mark.parametrize(
    ("candidate", "floor", "expected"),
    [
        ("better", "0.01", "better"),
        ("worse", "0.01", "worse"),
        ("same", "0.4", "no difference larger than the noise floor"),
        ("same", "0.01", "undecided"),
        ("close", "0.01", "undecided"),
        ("better", "0.6", "undecided"),  # better by 0.5: maybe not beyond 0.6
    ],
)
def test_the_verdicts_of_constructed_runs(
    served: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
    candidate: str,
    floor: str,
    expected: str,
) -> None:
    row = _verdicts(capsys, served[0], candidate, "--noise-floor", floor)[LONG]
    assert row["verdict"] == expected, row
    if expected == "no difference larger than the noise floor":
        assert -0.4 <= row["lower"] <= row["upper"] <= 0.4


def test_a_reward_outside_the_range_gives_no_interval_and_says_why(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    row = _verdicts(capsys, served[0], "outside")[LONG]
    assert row["verdict"] == "no interval" and row["lower"] is None
    assert row["reason"] == "1 reward(s) outside [0, 1] in the candidate"
    code, out, _ = _compare(capsys, served[0], "base", "outside")
    assert code == 0 and "no interval" in out and "1 reward(s) outside [0, 1]" in out


@pytest.mark.parametrize("role", ["baseline", "candidate"])
def test_an_unknown_run_is_one_line_naming_it(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str], role: str
) -> None:
    runs = ("nope", "base") if role == "baseline" else ("base", "nope")
    code, out, err = _compare(capsys, served[0], *runs)
    assert code == 2 and out == ""
    assert err == f"rewardstream: error: {served[0]} knows no run 'nope' (the {role})\n"


def test_an_unreachable_processor_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _compare(capsys, "127.0.0.1:1", "base", "better")
    assert code == 2 and out == ""
    assert err.startswith("rewardstream: error: cannot reach http://127.0.0.1:1")
    assert err.count("\n") == 1


def test_the_table_fits_80_columns_with_every_figure_whole(served: tuple[str, Path]) -> None:
    url, _ = served
    console = Console(width=80, record=True, force_terminal=False)

    def fetch(run_id: str, out: Path) -> None:
        assert main(["snapshot", "--url", url, "--run-id", run_id, "--out", str(out)]) == 0

    flips = TaskFlips(fetch, every=60.0)
    assert live_compare(url, "mixed-a", "mixed-b", once=True, console=console, flips=flips) == 0
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    rows = [line for line in lines if line.startswith(("arithmeti", "judge"))]
    assert len(rows) == 2, "\n".join(lines)
    for row in rows:
        cells = row.split()
        assert cells[1:3] == ["300", cells[2]] and len(cells[2]) == 6  # rollouts, mean
        assert cells[-3] in ("better", "worse", "undecided") and "…" not in " ".join(cells[1:])
        assert re.fullmatch(r"\+\d+ -\d+|\d+ moved", " ".join(cells[-2:])), row  # the flips
    assert "…" in rows[0]  # the long agent name gave way, the figures did not


def _batch_flips(data: Path, tmp: Path, base: str, candidate: str) -> dict[str, Any]:
    """Per agent, ``gym eval compare``'s flips of the two runs' rollouts files, aggregated by
    ``ng_aggregate_rollouts`` (0.7.0's aggregate metrics, with per-task metrics)."""
    rollouts = []
    for run in (base, candidate):
        (tmp / run).mkdir()
        shutil.copy(data / run / "r.jsonl", tmp / run / "shard.jsonl")
        glob = f"+input_glob={tmp / run}/shard.jsonl"
        assert aggregate_rollouts.main([glob, f"+output_jsonl_fpath={tmp / run}/r.jsonl"]) == 0
        rollouts.append(str(tmp / run / "r.jsonl"))
    argv = ["eval", "compare", "--baseline", rollouts[0], "--candidates", rollouts[1]]
    assert gym_cli.main([*argv, "-o", str(tmp / "report"), "--report-format", "json"]) == 0
    report = orjson.loads((tmp / "report" / "compare_report.json").read_bytes())
    return {c["baseline_agent"]: c["flips"][0] for c in report["comparisons"]}


@pytest.mark.parametrize(("base", "candidate"), [("base", "better"), ("mixed-a", "mixed-b")])
def test_the_flips_are_gym_eval_compares(
    served: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    base: str,
    candidate: str,
) -> None:
    """Binary rewards (fail->pass and pass->fail) and continuous ones (tasks moved), counted
    from snapshots of the live runs as the batch command counts them from their files."""
    url, data = served
    code, out, err = _compare(capsys, url, base, candidate, "--json")
    assert code == 0 and err == "", err
    comparison = json.loads(out)
    expected = _batch_flips(data, tmp_path, base, candidate)
    assert comparison["flips"]["final"] is False and comparison["flips"]["error"] is None
    for row in comparison["agents"]:
        want = expected[row["agent"]]
        assert row["flips"]["mode"] == want["mode"]
        assert row["flips"]["moved"] == len(want["flips"]) > 0
        for key in ("common_task_count", "pass_to_fail_count", "fail_to_pass_count", "net"):
            assert row["flips"][key] == want[key], key
    code, out, err = _compare(capsys, url, base, candidate)
    first = comparison["agents"][0]["flips"]
    shown = (
        f"+{first['fail_to_pass_count']} -{first['pass_to_fail_count']}"
        if first["mode"] == "binary"
        else f"{first['moved']} moved"
    )
    assert code == 0 and shown in out and "from snapshots, every 60 s, as of" in out, out


def test_the_flips_are_taken_again_only_when_due(served: tuple[str, Path]) -> None:
    """Each refresh within ``every`` seconds reuses the rows; past it, or when both runs turn
    final, each run is snapshotted again."""
    url, _ = served
    taken: list[str] = []

    def fetch(run_id: str, out: Path) -> None:
        taken.append(run_id)
        assert main(["snapshot", "--url", url, "--run-id", run_id, "--out", str(out)]) == 0

    flips = TaskFlips(fetch, every=60.0)
    flips.refresh("base", "better", both_final=False)
    flips.refresh("base", "better", both_final=False)
    assert taken == ["base", "better"] and flips.of(LONG) is not None
    flips.at -= 60
    flips.refresh("base", "better", both_final=False)
    assert taken == ["base", "better"] * 2
    flips.refresh("base", "better", both_final=True)
    flips.refresh("base", "better", both_final=True)
    flips.at -= 3600
    flips.refresh("base", "better", both_final=True)
    assert taken == ["base", "better"] * 3 and flips.final


def test_the_report_of_final_runs_is_the_batch_commands(
    served: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both runs final: their final files in DIR/<run id>/ and compare_report.json and .md
    in DIR, what ``gym eval compare`` writes from those files but for ``generated_at``."""
    url, _ = served
    monkeypatch.chdir(tmp_path)
    code, out, err = _compare(capsys, url, "final-a", "final-b", "--output-dir", "out")
    assert code == 0 and err == "", err
    assert f"wrote {tmp_path}/out/compare_report.md" in out.replace("\n", ""), out
    assert "from both runs' final files" in out
    ours = {name: (tmp_path / "out" / name).read_bytes() for name in REPORTS}
    for name in REPORTS:
        (tmp_path / "out" / name).unlink()
    argv = ["eval", "compare", "--baseline", "out/final-a/r.jsonl"]
    assert gym_cli.main([*argv, "--candidates", "out/final-b/r.jsonl", "-o", "out"]) == 0
    for name in REPORTS:
        batch = (tmp_path / "out" / name).read_bytes()
        assert _STAMP.sub(b"T", ours[name]) == _STAMP.sub(b"T", batch), name
        assert len(_STAMP.findall(batch)) == 1
    report = orjson.loads(ours["compare_report.json"])
    assert report["baseline"]["label"] == "final-a" and report["comparisons"]


def test_a_report_that_cannot_be_written_is_one_line(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    code, out, err = _compare(capsys, served[0], "final-a", "final-b", "--output-dir",
                              str(tmp_path / "file"))  # fmt: skip
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("rewardstream: error: compare_report not written: ")


def test_no_report_before_both_runs_are_final(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = _compare(capsys, served[0], "final-a", "base", "--output-dir", str(tmp_path))
    assert code == 0 and "wrote" not in out and not (tmp_path / "compare_report.json").exists()
