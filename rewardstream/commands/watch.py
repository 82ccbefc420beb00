"""``rewardstream watch``: a processor's runs as a live table in the terminal (for SSH).

It polls the processor's ``/runs`` and ``/runs/<id>`` (the whole run, as the page shows it)
and redraws one table per poll with rich: per run its state (a stalled run: since when it
has had no event, rate 0, no ETA), rollouts of expected, rate and ETA (from the last two
polls), failed attempts, and per agent the rollouts, the reward's mean, std, min and max, the
share of zero-variance tasks and pass@k. A processor that cannot
be reached is said in the table's caption, and watching goes on; ``--once`` prints one table
and exits (2 when the processor cannot be reached).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
from typing import Any, NamedTuple

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from rewardstream.errors import InputError
from rewardstream.infra.http_security import HttpSecurity, open_url

__all__ = ["watch"]


class _Seen(NamedTuple):
    at: float
    rollouts: int


def _get(base: str, path: str, security: HttpSecurity) -> Any:
    with open_url(security, f"{base.rstrip('/')}{path}") as r:
        return json.loads(r.read())


def _runs(base: str, run_id: str | None, security: HttpSecurity) -> list[dict[str, Any]]:
    """Each run's ``/runs/<id>`` (one run, or every run the processor knows)."""
    ids = [run_id] if run_id else [r["run_id"] for r in _get(base, "/runs", security)]
    return [_get(base, f"/runs/{urllib.parse.quote(i, safe='')}", security) for i in ids]


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


def render(runs: list[dict[str, Any]], rates: dict[str, float | None], caption: str) -> Group:
    """The runs table and, per run, its agents' table."""
    overview = Table(title="rewardstream runs", caption=caption, expand=False)
    columns = ("run", "state", "rollouts", "expected", "rate/s", "ETA", "failed", "dup. dropped")
    for column in columns:
        overview.add_column(column, justify="left" if column in ("run", "state") else "right")
    parts: list[Table] = [overview]
    for run in runs:
        rate = 0.0 if run["state"] == "stalled" else rates.get(run["run_id"])
        overview.add_row(
            run["run_id"],
            _state(run),
            str(run["rollouts"]),
            str(run.get("expected_rollouts") or "-"),
            "-" if rate is None else f"{rate:,.0f}",
            _eta(run, rate),
            _failed(run),
            str(run.get("duplicates_dropped", 0)),
        )
        agents = Table(title=f"{run['run_id']}: agents", expand=False)
        for column in ("agent", "rollouts", "mean", "std", "min", "max", "zero-var", "pass@k"):
            agents.add_column(
                column, justify="left" if column == "agent" else "right", no_wrap=True
            )
        for name, agent in run.get("agents", {}).items():
            reward = agent.get("reward") or {}
            tasks = agent.get("tasks") or {}
            passes = agent.get("pass_at_k") or {}
            agents.add_row(
                name,
                str(agent["rollouts"]),
                _num(reward.get("mean")),
                _num(reward.get("std")),
                _num(reward.get("min")),
                _num(reward.get("max")),
                _num(tasks.get("zero_variance_share"), 3),
                " ".join(f"@{k}={v:.1f}" for k, v in passes.items()),
            )
        parts.append(agents)
    return Group(*parts)


def watch(
    url: str,
    run_id: str | None = None,
    interval: float = 2.0,
    once: bool = False,
    security: HttpSecurity | None = None,
    console: Console | None = None,
) -> int:
    """Poll and redraw until interrupted (Ctrl-C), or once (with ``security``'s token and
    CA)."""
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
        return render(runs, rates, f"{url}, {stamp}, every {interval:g} s (Ctrl-C to stop)")

    if once:
        try:
            console.print(poll())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise InputError(f"cannot reach {url}: {reason}") from None
        return 0
    with Live(console=console, auto_refresh=False) as live:
        while True:
            try:
                live.update(poll(), refresh=True)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                live.update(f"cannot reach {url}: {reason} (retrying)", refresh=True)
            time.sleep(interval)
