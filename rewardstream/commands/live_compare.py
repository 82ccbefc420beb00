"""``rewardstream compare``: a candidate run against a baseline run, live, with a verdict that
stays valid however often it is looked at.

It polls the processor's ``/runs/<id>`` of both runs and, per agent present in both (or the one
``--agent`` names), rebuilds each run's confidence sequence from the sums the interval carries
(``reward.interval.sums``, ``range``, ``outside``) and shows the candidate-minus-baseline
difference of mean reward with its anytime-valid interval and verdict
(:mod:`~rewardstream.processors.core.difference`; docs/intervals.md §Comparing two runs). One
table per poll, fitting the terminal (80 columns: every figure whole, names cut); ``--json``
prints the comparison as one JSON line per poll. ``--once`` prints once: exit 2 with one line
saying which when the processor cannot be reached or a run id is unknown to it.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.text import Text

from rewardstream.commands.live_table import Column, fitted, get_json, poll_loop
from rewardstream.errors import InputError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.difference import (
    NO_DIFFERENCE,
    difference,
    run_level,
    verdict,
)

__all__ = ["NO_INTERVAL", "compare_runs", "live_compare", "render"]

NO_INTERVAL = "no interval"
_SHORT = {NO_DIFFERENCE: "no difference"}  # the table's word; its caption says the rest
_COLUMNS = (
    Column("agent", 0),
    Column("A n", 0),
    Column("A mean", 0),
    Column("B n", 0),
    Column("B mean", 0),
    Column("B - A", 0),
    Column("interval", 0),
    Column("verdict", 0),
)


def _run(url: str, run_id: str, role: str, security: HttpSecurity) -> dict[str, Any]:
    """The run's ``/runs/<id>``; an id the processor does not know is an :class:`InputError`
    naming the run's role."""
    try:
        found: dict[str, Any] = get_json(
            url, f"/runs/{urllib.parse.quote(run_id, safe='')}", security
        )
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise InputError(f"{url} knows no run {run_id!r} (the {role})") from None
        raise
    return found


def _side(run: dict[str, Any], agent: str, role: str) -> tuple[dict[str, Any], Tally | None, str]:
    """An agent's rollouts and mean in one run, its tally, and why there is none."""
    shown = run.get("agents", {}).get(agent) or {}
    reward = shown.get("reward") or {}
    figures = {"rollouts": shown.get("rollouts", 0), "mean": reward.get("mean")}
    interval = reward.get("interval")
    if not interval or not reward.get("count"):
        return figures, None, f"no rollouts in the {role} yet"
    if "sums" not in interval:
        return figures, None, f"the {role}'s processor shows no sums (an older version)"
    lo, hi = interval["range"]
    n, total, spread = interval["sums"]
    tally = Tally(lo, hi, n, total, spread, interval["outside"])
    if tally.outside:
        return figures, None, f"{tally.outside} reward(s) outside [{lo:g}, {hi:g}] in the {role}"
    return figures, tally, ""


def compare_runs(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    level: float,
    noise_floor: float,
    agent: str | None = None,
) -> dict[str, Any]:
    """The comparison of two runs' ``/runs/<id>`` JSON (what ``--json`` prints)."""
    ours, theirs = set(baseline.get("agents", {})), set(candidate.get("agents", {}))
    agents = [agent] if agent is not None else sorted(ours & theirs)
    rows = []
    for name in agents:
        a, a_tally, a_why = _side(baseline, name, "baseline")
        b, b_tally, b_why = _side(candidate, name, "candidate")
        now = None if a_tally is None or b_tally is None else difference(a_tally, b_tally, level)
        point = None if a["mean"] is None or b["mean"] is None else b["mean"] - a["mean"]
        rows.append(
            {
                "agent": name,
                "baseline": a,
                "candidate": b,
                "difference": point,
                "lower": None if now is None else now.lower,
                "upper": None if now is None else now.upper,
                "verdict": NO_INTERVAL if now is None else verdict(now, noise_floor),
                "reason": "; ".join(w for w in (a_why, b_why) if w) or None,
            }
        )
    return {
        "level": level,
        "run_level": run_level(level),
        "noise_floor": noise_floor,
        "baseline": {k: baseline.get(k) for k in ("run_id", "state", "rollouts")},
        "candidate": {k: candidate.get(k) for k in ("run_id", "state", "rollouts")},
        "agents": rows,
        "only_in_baseline": sorted(ours - theirs) if agent is None else [],
        "only_in_candidate": sorted(theirs - ours) if agent is None else [],
    }


def _num(value: float | None, sign: bool = False) -> str:
    """A mean with 4 decimals (as ``watch``), a difference signed with 3."""
    return "-" if value is None else f"{value:+.3f}" if sign else f"{value:.4f}"


def render(comparison: dict[str, Any], caption: str, console: Console) -> RenderableType:
    """The comparison's table, fitting ``console``, and what its words mean below it."""
    c = comparison
    rows = [
        (
            r["agent"],
            str(r["baseline"]["rollouts"]),
            _num(r["baseline"]["mean"]),
            str(r["candidate"]["rollouts"]),
            _num(r["candidate"]["mean"]),
            _num(r["difference"], sign=True),
            "-" if r["lower"] is None else f"{r['lower']:+.3f} {r['upper']:+.3f}",
            _SHORT.get(r["verdict"], r["verdict"]),
        )
        for r in c["agents"]
    ]
    table = fitted(
        console,
        _COLUMNS,
        rows,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
        pad_edge=False,
    )
    floor = c["noise_floor"]
    runs = [
        f"{letter}: {role} {c[role]['run_id']} ({c[role]['state']}, {c[role]['rollouts']} rollouts)"
        for letter, role in (("A", "baseline"), ("B", "candidate"))
    ]
    notes = [
        f"interval: B - A's mean reward, anytime-valid at {100 * c['level']:g}%; "
        f"no difference: none beyond +-{floor:g} (the noise floor)"
    ]
    notes += [f"{r['agent']}: {r['reason']}" for r in c["agents"] if r["reason"]]
    for role in ("baseline", "candidate"):
        if c[f"only_in_{role}"]:
            notes.append(f"only in the {role}: {', '.join(c[f'only_in_{role}'])}")
    notes.append(caption)
    return Group(
        *(Text(r, overflow="fold") for r in runs), table, *(Text(n, overflow="fold") for n in notes)
    )


def live_compare(
    url: str,
    baseline: str,
    candidate: str,
    *,
    level: float = 0.95,
    noise_floor: float = 0.01,
    agent: str | None = None,
    interval: float = 2.0,
    once: bool = False,
    as_json: bool = False,
    security: HttpSecurity | None = None,
    console: Console | None = None,
) -> int:
    """Poll both runs and print the comparison, once or until interrupted (Ctrl-C)."""
    security = security or HttpSecurity()
    # a pipe or a file has no width: 80 columns would cut agent names
    console = console or Console(width=None if sys.stdout.isatty() else 160)

    def poll() -> RenderableType:
        comparison = compare_runs(
            _run(url, baseline, "baseline", security),
            _run(url, candidate, "candidate", security),
            level,
            noise_floor,
            agent,
        )
        if as_json:
            return Text(json.dumps(comparison), no_wrap=True, overflow="ignore")
        stamp = time.strftime("%H:%M:%S")
        again = "" if once else f", every {interval:g} s (Ctrl-C to stop)"
        return render(comparison, f"{url}, {stamp}{again}", console)

    return poll_loop(console, poll, url, interval, once, redraw=not as_json)
