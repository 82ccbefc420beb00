"""``rewardstream watch``'s tables fit the terminal: at 80 columns (an SSH terminal) every
figure a user needs (state, rollouts, mean, std, pass@1) is whole, columns of less use give
way first, and only names are cut; at 200 columns every column is there. Rendered by rich
into a console of that width, as the live view draws it."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from rewardstream.commands.watch import render

AGENTS = ["arithmetic_simple_agent", "math_with_judge_agent", "blackjack", "code_gen_agent", "x"]


def _run(agents: int, state: str = "open") -> dict[str, Any]:
    agent = {
        "rollouts": 1349,
        "reward": {
            "mean": 0.69612,
            "std": 0.41234,
            "min": -1.0,
            "max": 1.0,
            "count": 1349,
            "interval": {"range": [0.0, 1.0], "outside": 0, "sums": [1349, 939.06, 230.4]},
        },
        "tasks": {"zero_variance_share": 0.4},
        "pass_at_k": {"1": 69.6, "2": 90.2, "4": 98.8, "8": 99.9},
    }
    return {
        "run_id": "rollouts-2026-11-27T12-09",
        "state": state,
        "last_event_seconds": 1234,
        "rollouts": 1349 * agents,
        "expected_rollouts": 12000,
        "done": False,
        "failed_attempts": 2,
        "failure_rate": 0.0057,
        "duplicates_dropped": 0,
        "agents": {name: agent for name in AGENTS[:agents]},
    }


def _screen(run: dict[str, Any], width: int, level: float = 0.95) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False)
    caption = "http://127.0.0.1:9400, 12:00:00"
    console.print(render([run], {run["run_id"]: 31.0}, caption, level, console))
    return console.export_text().splitlines()


@pytest.mark.parametrize("agents", [1, 5])
@pytest.mark.parametrize("state", ["open", "stalled"])
def test_at_80_columns_every_needed_figure_is_whole(agents: int, state: str) -> None:
    lines = _screen(_run(agents, state), 80)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    shown = "stalled, last event 1234 s ago" if state == "stalled" else "open"
    for figure in (shown, str(1349 * agents), "1349", "0.6961", "0.4123", "69.6"):
        assert figure in text, (figure, text)
    assert "pass@1" in text and "std" in text
    rows = [line for line in lines if "0.6961" in line]
    cells = [cell for row in rows for cell in row.split("│")[2:]]
    assert len(rows) == agents and not any("…" in cell for cell in cells), text


def test_at_200_columns_every_column_is_there() -> None:
    text = "\n".join(_screen(_run(5), 200))
    for column in ("expected", "rate/s", "ETA", "failed", "dup. dropped", "min", "max"):
        assert column in text, column
    assert "95% interval" in text and "0.6589-0.7334" in text
    assert "@1=69.6 @2=90.2 @4=98.8 @8=99.9" in text and "arithmetic_simple_agent" in text
    assert "…" not in text


@pytest.mark.parametrize(("level", "shown"), [(0.9, "0.6623-0.7299"), (0.99, "0.6519-0.7403")])
def test_the_interval_is_rebuilt_at_the_watchers_level(level: float, shown: str) -> None:
    """Whatever level the processor shows, the sums give the interval at ``--level``, and the
    header says which."""
    text = "\n".join(_screen(_run(1), 200, level))
    assert f"{100 * level:g}% interval" in text and shown in text, text


def test_names_are_cut_last_and_figures_never() -> None:
    """At 60 columns even the name column gives way (with an ellipsis), the figures do not."""
    lines = _screen(_run(5), 60)
    agent_rows = [line for line in lines if "0.6961" in line]
    assert any("…" in row.split("│")[1] for row in agent_rows)
    assert all(
        tuple(c.strip() for c in row.split("│")[3:6]) == ("0.6961", "0.4123", "69.6")
        for row in agent_rows
    ), "\n".join(lines)
