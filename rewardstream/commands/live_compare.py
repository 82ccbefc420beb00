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

Task flips need per-task figures, which ``/runs/<id>`` never carries (it is a summary, the same
size for any run): they come from a profile of each run, a snapshot while it runs (seconds of
the processor's work on a large run), its final files once it is final, taken again only every
``flips_every`` seconds and counted by ``gym eval compare``'s rules
(:func:`~rewardstream.processors.core.compare.task_flips`). Once both runs are final, the
report of ``gym eval compare`` on their final files is written into ``output_dir``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from rich import box
from rich.console import Console, Group, RenderableType
from rich.text import Text

from rewardstream.commands.live_table import Column, fitted, get_json, poll_loop, shown_tally
from rewardstream.errors import InputError, RewardstreamError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.core.compare import task_flips
from rewardstream.processors.core.difference import NO_DIFFERENCE, Rule, Side, compare_agents
from rewardstream.processors.core.records import agent_of

__all__ = [
    "Fetch",
    "TaskFlips",
    "compare_runs",
    "live_compare",
    "render",
    "task_rows",
]

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
    Column("flips", 0),
)
_KEPT = ("_ng_task_index", "mean/reward", "min/reward", "max/reward")  # what flips read of a task

Fetch = Callable[[str, Path], None]
"""Writes a run's profile files into a folder: a snapshot (its final files once final)."""
Rows = dict[str, list[dict[str, Any]]]


def task_rows(folder: Path) -> Rows:
    """Per agent, the task rows of the profile in ``folder``, only the fields flips read (a
    large run's rows are mostly samples and per-rollout details)."""
    rows: Rows = {}
    for path in folder.glob("*_reward_profiling.jsonl"):
        with path.open("rb") as fh:
            for line in fh:
                row = orjson.loads(line)
                agent = agent_of(row.get("sample") or {}) or ""
                rows.setdefault(agent, []).append({k: row[k] for k in _KEPT if k in row})
    return rows


@dataclasses.dataclass
class TaskFlips:
    """Both runs' task rows, taken again when ``every`` seconds old, and for the last time once
    both runs are final: then from ``fetch_final`` (default ``fetch``), into ``output_dir``
    when given, and the report of ``gym eval compare`` on those files written there."""

    fetch: Fetch
    every: float
    fetch_final: Fetch | None = None
    output_dir: Path | None = None
    rows: tuple[Rows, Rows] | None = None
    at: float = 0.0  # time.time() of the rows, or of the failed attempt
    final: bool = False  # the rows are both runs' final files'
    error: str | None = None
    report: list[str] = dataclasses.field(default_factory=list)  # the files written
    report_error: str | None = None

    def refresh(self, baseline: str, candidate: str, both_final: bool) -> None:
        """New rows when due: none yet, ``every`` seconds old, or both runs newly final. A
        failed fetch keeps the rows there are and says why in :attr:`error`."""
        due = self.rows is None or time.time() - self.at >= self.every
        if self.final or not (due or both_final):
            return
        fetch = (self.fetch_final or self.fetch) if both_final else self.fetch
        keep = self.output_dir if both_final else None
        try:
            with tempfile.TemporaryDirectory(prefix="rewardstream-flips-") as scratch:
                folders = [
                    (keep or Path(scratch) / role) / run_id
                    for role, run_id in (("baseline", baseline), ("candidate", candidate))
                ]
                for run_id, folder in zip((baseline, candidate), folders, strict=True):
                    fetch(run_id, folder)
                rows = (task_rows(folders[0]), task_rows(folders[1]))
        except RewardstreamError as exc:
            self.error, self.at = str(exc), time.time()
            return
        self.rows, self.at, self.final, self.error = rows, time.time(), both_final, None
        if keep is not None:
            try:
                self.report = [str(p) for p in _write_report(folders, keep)]
            except RewardstreamError as exc:
                self.report_error = str(exc)

    def unwritten(self) -> str | None:
        """Why the report is not written though both runs are final (None: it is, or no
        ``output_dir``)."""
        if self.output_dir is None or self.report:
            return None
        return self.report_error or self.error

    def of(self, agent: str) -> dict[str, Any] | None:
        """The agent's flips as the JSON shows them (None before any rows)."""
        if self.rows is None:
            return None
        summary = task_flips(self.rows[0].get(agent, []), self.rows[1].get(agent, []))
        shown = dataclasses.asdict(summary)
        for key in ("candidate_index", "field", "flips"):
            del shown[key]
        return shown | {"moved": len(summary.flips)}

    def view(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "as_of": self.at if self.rows is not None else None,
            "final": self.final,
            "error": self.error,
            "report": self.report,
            "report_error": self.report_error,
        }


def _write_report(folders: list[Path], output_dir: Path) -> list[Path]:
    """``gym eval compare --baseline A --candidates B -o output_dir`` on the final files in
    ``folders``, each run's rollouts named after its profile (the rollouts file is never
    read); its warnings are the processor's business, not the table's."""
    from rewardstream.commands.compare import write_report
    from rewardstream.commands.gym_cli import compare_overrides

    named = []
    for folder in folders:
        profiles = sorted(folder.glob("*_reward_profiling.jsonl"))
        if not profiles:
            raise InputError(f"no final profile in {folder}")
        named.append(str(folder / profiles[0].name.replace("_reward_profiling.jsonl", ".jsonl")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return write_report(compare_overrides(named[0], named[1], str(output_dir)))


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


def _side(run: dict[str, Any], agent: str) -> Side:
    """An agent of one run's ``/runs/<id>`` JSON, its tally rebuilt from the interval's sums."""
    shown = run.get("agents", {}).get(agent) or {}
    reward = shown.get("reward") or {}
    return Side(shown.get("rollouts", 0), reward.get("mean"), shown_tally(reward))


def compare_runs(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    level: float,
    noise_floor: float,
    agent: str | None = None,
    flips: TaskFlips | None = None,
) -> dict[str, Any]:
    """The comparison of two runs' ``/runs/<id>`` JSON (what ``--json`` prints), with the task
    flips of ``flips``' rows."""
    a, b = (
        {name: _side(run, name) for name in run.get("agents", {})} for run in (baseline, candidate)
    )
    comparison = compare_agents(a, b, Rule(level, noise_floor), agent)
    for row in comparison["agents"]:
        row["flips"] = None if flips is None else flips.of(row["agent"])
    return comparison | {
        "baseline": {k: baseline.get(k) for k in ("run_id", "state", "rollouts")},
        "candidate": {k: candidate.get(k) for k in ("run_id", "state", "rollouts")},
        "flips": None if flips is None else flips.view(),
    }


def _num(value: float | None, sign: bool = False) -> str:
    """A mean with 4 decimals (as ``watch``), a difference signed with 3."""
    return "-" if value is None else f"{value:+.3f}" if sign else f"{value:.4f}"


def _flips(row: dict[str, Any]) -> str:
    """fail→pass and pass→fail as ``+F -P``; continuous rewards: the tasks that moved."""
    f = row["flips"]
    if f is None or f["mode"] == "unavailable":
        return "-"
    if f["mode"] == "binary":
        return f"+{f['fail_to_pass_count']} -{f['pass_to_fail_count']}"
    return f"{f['moved']} moved"


def _flips_note(c: dict[str, Any]) -> list[str]:
    """What the flips column counts, from when, and what became of the report."""
    f = c["flips"]
    if f is None:
        return []
    if f["as_of"] is None:
        notes = ["flips: none yet"]
    else:
        source = "both runs' final files" if f["final"] else f"snapshots, every {f['every']:g} s"
        notes = [
            f"flips: tasks fail->pass (+) and pass->fail (-), a task passing with a mean "
            f"reward above 0.5 (gym eval compare's rule); from {source}, as of "
            f"{time.strftime('%H:%M:%S', time.localtime(f['as_of']))}"
        ]
    notes += [f"{r['agent']} flips: {r['flips']['reason']}" for r in c["agents"]
              if r["flips"] and r["flips"]["reason"]]  # fmt: skip
    if f["error"]:
        notes.append(f"flips not taken: {f['error']}")
    notes += [f"wrote {path}" for path in f["report"]]
    if f["report_error"]:
        notes.append(f"compare_report not written: {f['report_error']}")
    return notes


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
            _flips(r),
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
    notes += _flips_note(c)
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
    flips: TaskFlips | None = None,
) -> int:
    """Poll both runs and print the comparison, once or until interrupted (Ctrl-C); with
    ``flips``, their task flips (and its report once both are final). ``--once``: a report
    that cannot be written is an :class:`InputError`."""
    security = security or HttpSecurity()
    # a pipe or a file has no width: 80 columns would cut agent names
    console = console or Console(width=None if sys.stdout.isatty() else 160)

    def poll() -> RenderableType:
        runs = (
            _run(url, baseline, "baseline", security),
            _run(url, candidate, "candidate", security),
        )
        both_final = all(r.get("state") == "final" for r in runs)
        if flips is not None:
            flips.refresh(baseline, candidate, both_final)
            unwritten = flips.unwritten() if both_final else None
            if once and unwritten:
                raise InputError(f"compare_report not written: {unwritten}")
        comparison = compare_runs(*runs, level, noise_floor, agent, flips)
        if as_json:
            return Text(json.dumps(comparison), no_wrap=True, overflow="ignore")
        stamp = time.strftime("%H:%M:%S")
        again = "" if once else f", every {interval:g} s (Ctrl-C to stop)"
        return render(comparison, f"{url}, {stamp}{again}", console)

    return poll_loop(console, poll, url, interval, once, redraw=not as_json)
