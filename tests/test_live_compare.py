"""``rewardstream compare`` against a real processor's HTTP face on loopback (``make_app`` over a
``Pipeline`` fed the runs' events in process, no broker): its numbers are the ones computed
again here from the rollouts files alone, its verdicts on runs built to be clearly better,
clearly worse, equal or too close to tell are those, a reward outside the range is said, an
unknown run and an unreachable processor are one line and exit 2, and the table fits 80
columns."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from rewardstream.commands.cli import main
from rewardstream.commands.live_compare import live_compare
from rewardstream.contract.events import RunStarted, encode
from rewardstream.processors.core.confseq import mixture_boundary
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app, serve
from rewardstream.producers.events import input_events, rollout_events

LONG = "arithmetic_simple_agent_with_a_long_name"
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
    for run_id, reward in RUNS.items():
        agents = [LONG, "judge"] if run_id.startswith("mixed") else [LONG]
        inputs, rollouts = _collection(data / run_id, reward, agents)
        for event in [*input_events(inputs, run_id), *rollout_events(rollouts, run_id)]:
            pipeline.handle(event.kind, event.value)
        started = RunStarted(run_id=run_id, expected_rollouts=TASKS * REPEATS, output_stem="r")
        pipeline.handle("control", encode(started))
    loop = asyncio.new_event_loop()
    runner, port = loop.run_until_complete(serve(make_app(pipeline, None), "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", data
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
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
    assert live_compare(url, "mixed-a", "mixed-b", once=True, console=console) == 0
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    rows = [line for line in lines if line.startswith(("arithmetic", "judge"))]
    assert len(rows) == 2, "\n".join(lines)
    for row in rows:
        cells = row.split()
        assert cells[1:3] == ["300", cells[2]] and len(cells[2]) == 6  # rollouts, mean
        assert cells[-1] in ("better", "worse", "undecided") and "…" not in " ".join(cells[1:])
    assert "…" in rows[0]  # the long agent name gave way, the figures did not
