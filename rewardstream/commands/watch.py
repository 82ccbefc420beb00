"""``rewardstream watch``: a processor's runs as a live table in the terminal (for SSH).

It polls the processor's ``/runs`` and ``/runs/<id>`` (the whole run, as the page shows it)
and redraws one table per poll with rich: per run its state (a stalled run: since when it
has had no event, rate 0, no ETA), rollouts of expected, rate and ETA (from the last two
polls), failed attempts, and per agent the rollouts, the reward's mean, std, min and max, the
mean's anytime-valid interval at ``--level`` (docs/intervals.md: rebuilt here from the sums
``/runs/<id>`` carries, so any level, whatever the processor's), the share of zero-variance
tasks, pass@1 and pass@k. The tables fit the terminal
(:func:`~rewardstream.commands.live_table.fitted`: columns of less use give way first, then
names are cut; the state, rollouts, mean, std and pass@1 never are). A processor that cannot
be reached is said in the table's caption, and watching goes on; ``--once`` prints one table
and exits (2 when the processor cannot be reached).
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.parse
from typing import Any, NamedTuple

from rich.console import Console, Group
from rich.table import Table

from rewardstream.commands.live_table import Column, fitted, get_json, poll_loop, shown_tally
from rewardstream.errors import InputError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.core.confseq import DEFAULT_LEVEL

__all__ = ["watch"]


class _Seen(NamedTuple):
    at: float
    rollouts: int


def _runs(base: str, run_id: str | None, security: HttpSecurity) -> list[dict[str, Any]]:
    """Each run's ``/runs/<id>`` (one run, or every run the processor knows)."""
    ids = [run_id] if run_id else [r["run_id"] for r in get_json(base, "/runs", security)]
    return [get_json(base, f"/runs/{urllib.parse.quote(i, safe='')}", security) for i in ids]


def _num(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _eta(run: dict[str, Any], rate: float | None) -> str:
    expected, rollouts = run.get("expected_rollouts"), run["rollouts"]
    if run["done"] or not expected or not rate or rate <= 0:
        return "-"
    seconds = max(0.0, (expected - rollouts) / rate)
    return time.strftime("%H:%M:%S", time.gmtime(seconds))


def _state(run: dict[str, Any]) -> str:
    """The run's state; a stalled one says since when it has had no event."""
    seconds = run.get("last_event_seconds")
    if run["state"] == "stalled" and seconds is not None:
        return f"stalled, last event {seconds} s ago"
    return str(run["state"])


def _failed(run: dict[str, Any]) -> str:
    count, rate = run.get("failed_attempts", 0), run.get("failure_rate")
    return str(count) if rate is None else f"{count} ({100 * rate:.1f}%)"


# What a user needs at any width (rollouts, mean, std, pass@1, state) has drop 0.
_RUN_COLUMNS = (
    Column("run", 0),
    Column("state", 0),
    Column("rollouts", 0),
    Column("expected", 2),
    Column("rate/s", 1),
    Column("ETA", 1),
    Column("failed", 3),
    Column("dup. dropped", 4),
)


def _agent_columns(level: float) -> tuple[Column, ...]:
    """The agents' columns; the interval's header says its level."""
    return (
        Column("agent", 0),
        Column("rollouts", 0),
        Column("mean", 0),
        Column("std", 0),
        Column("pass@1", 0),
        Column(f"{100 * level:g}% interval", 1),
        Column("min", 2),
        Column("max", 2),
        Column("zero-var", 3),
        Column("pass@k", 1),
    )


def _interval(reward: dict[str, Any], level: float) -> str:
    """The mean's anytime-valid interval at ``level``, from the sums the processor shows."""
    tally = shown_tally(reward)
    now = None if tally is None else tally.interval(level)
    return "-" if now is None else f"{now.lower:.4f}-{now.upper:.4f}"


def _pass_at_1(passes: dict[str, Any]) -> str:
    value = passes.get("1")
    return "-" if value is None else f"{value:.1f}"


def render(
    runs: list[dict[str, Any]],
    rates: dict[str, float | None],
    caption: str,
    level: float,
    console: Console | None = None,
) -> Group:
    """The runs table and, per run, its agents' table (intervals at ``level``), with the
    columns that fit ``console``'s width (:func:`~rewardstream.commands.live_table.fitted`)."""
    console = console or Console(width=200)
    rows = []
    for run in runs:
        rate = 0.0 if run["state"] == "stalled" else rates.get(run["run_id"])
        rows.append(
            (
                run["run_id"],
                _state(run),
                str(run["rollouts"]),
                str(run.get("expected_rollouts") or "-"),
                "-" if rate is None else f"{rate:,.0f}",
                _eta(run, rate),
                _failed(run),
                str(run.get("duplicates_dropped", 0)),
            )
        )
    overview = fitted(console, _RUN_COLUMNS, rows, title="rewardstream runs", caption=caption)
    parts: list[Table] = [overview]
    for run in runs:
        agents = []
        for name, agent in run.get("agents", {}).items():
            reward = agent.get("reward") or {}
            tasks = agent.get("tasks") or {}
            passes = agent.get("pass_at_k") or {}
            agents.append(
                (
                    name,
                    str(agent["rollouts"]),
                    _num(reward.get("mean")),
                    _num(reward.get("std")),
                    _pass_at_1(passes),
                    _interval(reward, level),
                    _num(reward.get("min")),
                    _num(reward.get("max")),
                    _num(tasks.get("zero_variance_share"), 3),
                    " ".join(f"@{k}={v:.1f}" for k, v in passes.items()),
                )
            )
        title = f"{run['run_id']}: agents"
        parts.append(fitted(console, _agent_columns(level), agents, title=title))
    return Group(*parts)


def watch(
    url: str,
    run_id: str | None = None,
    interval: float = 2.0,
    once: bool = False,
    security: HttpSecurity | None = None,
    level: float = DEFAULT_LEVEL,
    console: Console | None = None,
) -> int:
    """Poll and redraw until interrupted (Ctrl-C), or once (with ``security``'s token and
    CA), the agents' intervals at ``level``."""
    security = security or HttpSecurity()
    # a pipe or a file has no width: 80 columns would cut agent names
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    seen: dict[str, _Seen] = {}
    rates: dict[str, float | None] = {}

    def poll() -> Group:
        try:
            runs = _runs(url, run_id, security)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and run_id:
                raise InputError(f"{url} knows no run {run_id!r}") from None
            raise
        now = time.monotonic()
        for run in runs:
            before = seen.get(run["run_id"])
            if before is not None and now > before.at:
                rates[run["run_id"]] = (run["rollouts"] - before.rollouts) / (now - before.at)
            seen[run["run_id"]] = _Seen(now, run["rollouts"])
        stamp = time.strftime("%H:%M:%S")
        caption = f"{url}, {stamp}, every {interval:g} s (Ctrl-C to stop)"
        return render(runs, rates, caption, level, console)

    return poll_loop(console, poll, url, interval, once)
