"""``gym eval compare``: a baseline run against a candidate, as NeMo Gym 0.7.0 compares them.

Everything between the parsed ``*_aggregate_metrics.json`` files and the report's data: the
files' entries checked, the agents to compare chosen, and per agent the metric rows (each
candidate's delta and the Welch interval of candidate minus baseline over the repeat-level
values) and the per-task flips. The rules, their messages and the report's shape are in
docs/nemo-gym-compat.md §Compare; no I/O here (the command reads the files, the sink writes
the report).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any, Literal

from rewardstream.errors import InputError
from rewardstream.processors.core.kernels import welch_interval
from rewardstream.processors.core.metric_names import across_repeats, is_primary_metric

__all__ = [
    "MAX_FLIPS_SHOWN",
    "AgentComparison",
    "CandidateValue",
    "FlipSummary",
    "MetricRow",
    "MetricValue",
    "Report",
    "Run",
    "RunFile",
    "TaskFlip",
    "agent_entries",
    "compare_agents",
    "comparison_value",
    "task_flips",
    "with_repeat_metrics",
]

Entry = dict[str, Any]
Warn = Callable[[str], None]

MAX_FLIPS_SHOWN = 10
"""Flips listed per direction in the markdown; beyond it the JSON drops their rewards too."""

_PASS = 0.5  # a task passes when the mean of its repeats' rewards is above this
_TASK = "_ng_task_index"
_FIELD = "reward"
_TASK_MEAN, _TASK_MIN, _TASK_MAX = f"mean/{_FIELD}", f"min/{_FIELD}", f"max/{_FIELD}"


@dataclass(frozen=True)
class MetricValue:
    """One side's reading of a metric and the uncertainty its run recorded."""

    value: float
    ci_low: float | None
    ci_high: float | None
    se_across_repeats: float | None
    mean_across_repeats: float | None
    std_err_across_runs: float | None


@dataclass(frozen=True)
class CandidateValue(MetricValue):
    """A candidate's reading and its move from the baseline."""

    delta: float | None = None
    delta_pct: float | None = None
    delta_ci_low: float | None = None
    delta_ci_high: float | None = None


@dataclass(frozen=True)
class MetricRow:
    metric: str
    is_key_metric: bool
    present_in: list[str]  # "baseline" and/or "candidate[<i>]"
    baseline: MetricValue | None
    candidates: list[CandidateValue | None]


@dataclass(frozen=True)
class TaskFlip:
    task_index: int
    baseline_score: float
    candidate_score: float
    delta: float
    direction: Literal["pass_to_fail", "fail_to_pass", "changed"]
    baseline_rewards: list[float] | None  # per repeat, for the reader only
    candidate_rewards: list[float] | None


@dataclass(frozen=True)
class FlipSummary:
    candidate_index: int
    mode: Literal["binary", "continuous", "unavailable"]
    reason: str | None
    field: str
    common_task_count: int
    baseline_only_task_count: int
    candidate_only_task_count: int
    pass_to_fail_count: int | None = None  # the counts of binary mode
    fail_to_pass_count: int | None = None
    tied_count: int | None = None
    unchanged_count: int | None = None
    net: int | None = None
    flips: list[TaskFlip] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class AgentComparison:
    baseline_agent: str
    candidate_agents: list[str]
    baseline_task_count: int
    candidate_task_counts: list[int]
    baseline_repeat_count: int | None
    candidate_repeat_counts: list[int | None]
    metrics: list[MetricRow]
    flips: list[FlipSummary]
    notes: list[str]


@dataclass(frozen=True)
class RunFile:
    """One run as the report names it."""

    role: Literal["baseline", "candidate"]
    index: int
    rollouts_jsonl_fpath: str
    aggregate_metrics_fpath: str
    label: str  # the folder of its rollouts
    agent_names: list[str]


@dataclass(frozen=True)
class Run:
    """One run's entries by agent name, and how the report names it."""

    file: RunFile
    entries: dict[str, Entry]

    @classmethod
    def of(
        cls,
        role: Literal["baseline", "candidate"],
        index: int,
        rollouts: PurePath,
        metrics: PurePath,
        entries: dict[str, Entry],
    ) -> Run:
        label = rollouts.parent.name or rollouts.stem
        file = RunFile(role, index, str(rollouts), str(metrics), label, sorted(entries))
        return cls(file, entries)

    @property
    def name(self) -> str:
        """``baseline`` or ``candidate[i]``, as warnings and skipped agents name a run."""
        return f"candidate[{self.file.index}]" if self.file.role == "candidate" else "baseline"


@dataclass(frozen=True, kw_only=True)
class Report:
    """What ``compare_report.json`` holds, in its order."""

    schema_version: str = "1"
    generated_at: str
    nemo_gym_version: str
    command: str
    baseline: RunFile
    candidates: list[RunFile]
    comparisons: list[AgentComparison]
    skipped_agents: dict[str, list[str]]
    warnings: list[str]


def agent_entries(payload: Any, where: str) -> dict[str, Entry]:
    """A parsed aggregate-metrics file's entries by agent name; 0.7.0's refusals otherwise."""
    shape = "(expected a JSON list of per-agent entries)"
    if not isinstance(payload, list):
        raise InputError(f"'{where}' is not a valid aggregate-metrics file {shape}.")
    if not payload:
        raise InputError(f"'{where}' contains no agent entries.")
    entries: dict[str, Entry] = {}
    for position, entry in enumerate(payload):
        if not isinstance(entry, dict):
            raise InputError(f"'{where}' entry {position} is not an object {shape}.")
        name = (entry.get("agent_ref") or {}).get("name")
        if not name:
            raise InputError(f"'{where}' entry {position} has no `agent_ref.name`.")
        if name in entries:
            raise InputError(f"'{where}' contains two entries for agent '{name}'.")
        entries[name] = entry
    return entries


def with_repeat_metrics(
    entry: Entry, aggregate: Callable[[list[Entry]], Mapping[str, Any]]
) -> Entry:
    """An entry written before repeat-level metrics, completed from its tasks' ``rollout_infos``
    by ``aggregate`` (NeMo Gym's aggregate metrics); the entry's own agent metrics win."""
    groups = entry.get("group_level_metrics", [])
    computed = aggregate([info for g in groups for info in g.get("rollout_infos", [])])
    repeats = computed["repeat_level_metrics"]
    agent_metrics = computed["agent_metrics"] | (entry.get("agent_metrics") or {})
    agent_metrics |= {"num_repeats": _num_repeats(groups, repeats)}
    return entry | {"agent_metrics": agent_metrics, "repeat_level_metrics": repeats}


def _num_repeats(groups: list[Entry], repeats: list[Entry]) -> int | None:
    """The most rollouts any task expects (a recovered run leaves some short), else one per
    repeat-level entry (absent from one-repeat runs), else unknown."""
    expected: list[int] = [
        g["expected_num_rollouts"]
        for g in groups
        if isinstance(g.get("expected_num_rollouts"), int)
    ]
    if expected:
        return max(expected)
    return len(repeats) if repeats else None


@dataclass(frozen=True)
class _Side:
    """One run narrowed to one agent."""

    agent: str
    agent_metrics: Entry
    key_metrics: Entry
    groups: list[Entry]
    repeats: list[Entry]

    @classmethod
    def of(cls, run: Run, agent: str) -> _Side:
        entry = run.entries[agent]
        metrics, keys = entry.get("agent_metrics") or {}, entry.get("key_metrics") or {}
        groups, repeats = (
            entry.get("group_level_metrics") or [],
            entry.get("repeat_level_metrics") or [],
        )
        return cls(agent, metrics, keys, groups, repeats)

    @property
    def num_repeats(self) -> int | None:
        return _num_repeats(self.groups, self.repeats)

    @property
    def has_repeat_cis(self) -> bool:
        return any(key.startswith(across_repeats("ci_low_95", "")) for key in self.agent_metrics)

    def repeat_values(self, name: str) -> list[float]:
        """The metric's finite values, one per repeat."""
        values = [_number(e.get(name)) for e in self.repeats if isinstance(e, dict)]
        return [v for v in values if v is not None and math.isfinite(v)]


def compare_agents(
    baseline: Run,
    candidates: Sequence[Run],
    *,
    agent: str | None = None,
    baseline_agent: str | None = None,
    candidate_agents: Sequence[str] | None = None,
    warn: Warn,
) -> tuple[list[AgentComparison], dict[str, list[str]], list[str]]:
    """Each chosen agent's comparison, the agents left out by run, and the run's warnings.

    A per-side name beats ``agent``, which beats every agent all runs share; ``warn`` hears the
    per-agent warnings as 0.7.0 emits them (UserWarnings), before a refusal that follows.
    """
    pairs, skipped, warnings = _choose(
        baseline, candidates, agent, baseline_agent, candidate_agents
    )
    comparisons = [
        _compare(
            _Side.of(baseline, base),
            [_Side.of(r, a) for r, a in zip(candidates, cands, strict=True)],
            warn,
        )
        for base, cands in pairs
    ]
    return comparisons, skipped, warnings


def _choose(
    baseline: Run,
    candidates: Sequence[Run],
    agent: str | None,
    baseline_agent: str | None,
    candidate_agents: Sequence[str] | None,
) -> tuple[list[tuple[str, list[str]]], dict[str, list[str]], list[str]]:
    runs = (baseline, *candidates)
    if baseline_agent is not None or candidate_agents is not None:
        base = baseline_agent or agent or _sole_agent(baseline)
        _require(baseline, base)
        chosen = []
        for i, run in enumerate(candidates):
            name = (candidate_agents[i] if candidate_agents else None) or agent or _sole_agent(run)
            _require(run, name)
            chosen.append(name)
        return [(base, chosen)], {}, []
    if agent:
        for run in runs:
            _require(run, agent)
        return [(agent, [agent] * len(candidates))], {}, []
    shared = set(baseline.entries).intersection(*(run.entries for run in candidates))
    if not shared:
        listing = "\n".join(
            f"  {r.file.role} ({r.file.aggregate_metrics_fpath}): {', '.join(r.file.agent_names)}"
            for r in runs
        )
        raise InputError(
            f"No agent name is present in every run, so there is nothing to compare.\n{listing}\n"
            "Set 'agent_name' to force one agent on both sides, or 'baseline_agent_name' / "
            "'candidate_agent_names' to pick a different agent per side."
        )
    skipped, warnings = {}, []
    for run in runs:
        extras = sorted(set(run.entries) - shared)
        if extras:
            skipped[run.name] = extras
            warnings.append(
                f"Agent(s) {', '.join(extras)} are present only in {run.name} and were not "
                "compared."
            )
    return [(name, [name] * len(candidates)) for name in sorted(shared)], skipped, warnings


def _sole_agent(run: Run) -> str:
    if len(run.entries) == 1:
        return next(iter(run.entries))
    raise InputError(
        f"The {run.file.role} run's metrics at '{run.file.aggregate_metrics_fpath}' contain "
        f"{len(run.entries)} agents: {', '.join(run.file.agent_names)}. Set 'agent_name' to "
        "compare one of them on both sides, or 'baseline_agent_name' / 'candidate_agent_names' "
        "to choose a different agent per side."
    )


def _require(run: Run, name: str) -> None:
    if name not in run.entries:
        close = difflib.get_close_matches(name, run.file.agent_names, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise InputError(
            f"Agent '{name}' is not in '{run.file.aggregate_metrics_fpath}'. "
            f"Available: {', '.join(run.file.agent_names)}.{hint}"
        )


def _compare(baseline: _Side, candidates: list[_Side], warn: Warn) -> AgentComparison:
    rows = _metric_rows(baseline, candidates, warn)
    if not any(row.baseline is not None and any(row.candidates) for row in rows):
        base_only = sorted(row.metric for row in rows if row.baseline is not None)[:5]
        cand_only = sorted(row.metric for row in rows if row.baseline is None)[:5]
        raise InputError(
            "Baseline and candidate share no metric keys, so there is nothing to compare.\n"
            f"  baseline-only (first 5): {', '.join(base_only) or 'none'}\n"
            f"  candidate-only (first 5): {', '.join(cand_only) or 'none'}\n"
            "Runs collected with different --num-repeats produce different pass@k metric names."
        )
    repeats = [side.num_repeats for side in candidates]
    notes = []
    if baseline.num_repeats is not None and any(
        n is not None and n != baseline.num_repeats for n in repeats
    ):
        notes.append(
            f"Repeat counts differ (baseline {baseline.num_repeats}, candidate "
            f"{', '.join(str(n) for n in repeats)}). Metric names that embed k "
            "(e.g. pass@1[avg-of-k]) will not line up across the runs."
        )
    if not any(side.has_repeat_cis for side in (baseline, *candidates)):
        notes.append(
            "Neither run recorded per-run cross-repeat confidence intervals, so every "
            "baseline/candidate CI cell is empty. They are written for repeat-aggregated metrics "
            "when a run has 2 or more repeats."
        )
    one_sided = [row for row in rows if len(row.present_in) < 1 + len(candidates)]
    if one_sided:
        notes.append(f"{len(one_sided)} metric(s) were reported by only one of the runs.")
    return AgentComparison(
        baseline_agent=baseline.agent,
        candidate_agents=[side.agent for side in candidates],
        baseline_task_count=len(baseline.groups),
        candidate_task_counts=[len(side.groups) for side in candidates],
        baseline_repeat_count=baseline.num_repeats,
        candidate_repeat_counts=repeats,
        metrics=rows,
        flips=[_flips(baseline, side, i) for i, side in enumerate(candidates)],
        notes=notes,
    )


def _number(value: Any) -> float | None:
    """A JSON number as a float; booleans and anything else are no number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def comparison_value(metric: MetricValue) -> float:
    """What is shown and subtracted: the mean across repeats when recorded, else the value."""
    return metric.mean_across_repeats if metric.mean_across_repeats is not None else metric.value


def _reading(metrics: Entry, name: str) -> MetricValue | None:
    value = _number(metrics.get(name))
    if value is None:
        return None
    return MetricValue(
        value=value,
        ci_low=_number(metrics.get(across_repeats("ci_low_95", name))),
        ci_high=_number(metrics.get(across_repeats("ci_high_95", name))),
        se_across_repeats=_number(metrics.get(across_repeats("se", name))),
        mean_across_repeats=_number(metrics.get(across_repeats("mean", name))),
        std_err_across_runs=_number(metrics.get(f"{name}/std_err_across_runs")),
    )


def _warn_on_uneven_repeats(side: _Side, label: str, warn: Warn) -> None:
    counts = {e.get("sample_count") for e in side.repeats}
    if any(e.get("missing_count", 0) > 0 for e in side.repeats) or len(counts) > 1:
        warn(
            f"{label} agent {side.agent!r} has incomplete or unequal task coverage across "
            "repeats; delta confidence intervals may mix task-difficulty differences with "
            "repeat variance."
        )


def _delta_interval(baseline: _Side, candidate: _Side, name: str) -> tuple[float, float] | None:
    """The Welch interval, when both runs recorded the metric's mean across repeats and have
    two or more finite repeat-level values of it."""
    mean = across_repeats("mean", name)
    if _number(baseline.agent_metrics.get(mean)) is None:
        return None
    if _number(candidate.agent_metrics.get(mean)) is None:
        return None
    base, cand = baseline.repeat_values(name), candidate.repeat_values(name)
    return welch_interval(cand, base) if len(base) >= 2 and len(cand) >= 2 else None


def _candidate_reading(
    metrics: Entry, name: str, base: float | None, interval: tuple[float, float] | None
) -> CandidateValue | None:
    reading = _reading(metrics, name)
    if reading is None:
        return None
    delta = None if base is None else comparison_value(reading) - base
    pct = None if delta is None or not base else delta / abs(base) * 100.0
    low, high = interval or (None, None)
    return CandidateValue(
        **vars(reading), delta=delta, delta_pct=pct, delta_ci_low=low, delta_ci_high=high
    )


def _metric_rows(baseline: _Side, candidates: list[_Side], warn: Warn) -> list[MetricRow]:
    """A row per point-estimate metric any side reported: the baseline's order, then the
    candidates' own; ``key_metrics`` may name metrics ``agent_metrics`` lacks."""
    _warn_on_uneven_repeats(baseline, "Baseline", warn)
    for i, side in enumerate(candidates):
        _warn_on_uneven_repeats(side, f"Candidate[{i}]", warn)
    base_metrics = baseline.key_metrics | baseline.agent_metrics
    cand_metrics = [side.key_metrics | side.agent_metrics for side in candidates]
    keys = set(baseline.key_metrics).union(*(side.key_metrics for side in candidates))
    names = dict.fromkeys(
        name
        for metrics in (base_metrics, *cand_metrics)
        for name, v in metrics.items()
        if _number(v) is not None
    )
    rows = []
    for name in names:
        if not is_primary_metric(name):
            continue
        base = _reading(base_metrics, name)
        point = comparison_value(base) if base else None
        readings = [
            _candidate_reading(
                metrics, name, point, _delta_interval(baseline, side, name) if base else None
            )
            for side, metrics in zip(candidates, cand_metrics, strict=True)
        ]
        present = ["baseline"] if base else []
        present += [f"candidate[{i}]" for i, r in enumerate(readings) if r is not None]
        rows.append(MetricRow(name, name in keys, present, base, readings))
    return rows


def _rewards(group: Entry) -> list[float] | None:
    """The task's reward per repeat, in rollout order, when every rollout has a number."""
    infos = group.get("rollout_infos")
    if not isinstance(infos, list) or not infos:
        return None
    ordered = sorted(infos, key=lambda info: info.get("_ng_rollout_index", 0))
    rewards = [_number(info.get(_FIELD)) for info in ordered]
    return None if any(r is None for r in rewards) else rewards  # type: ignore[return-value]


def _binary(tasks: list[int], sides: tuple[dict[Any, Entry], dict[Any, Entry]]) -> bool:
    """Whether every reward seen on either side is 0 or 1: a task's min and max where recorded
    (its mean is 0.5 when its repeats disagree), else its mean."""
    for task in tasks:
        for groups in sides:
            group = groups[task]
            seen = [v for v in (group.get(_TASK_MIN), group.get(_TASK_MAX)) if v is not None]
            for value in seen or [group.get(_TASK_MEAN)]:
                number = _number(value)
                if number is None or number not in (0.0, 1.0):
                    return False
    return True


def _cap_rewards(flips: list[TaskFlip]) -> list[TaskFlip]:
    """No per-repeat rewards past the first :data:`MAX_FLIPS_SHOWN` flips of a direction, so the
    JSON does not grow as tasks x repeats when every task moves."""
    seen: dict[str, int] = {}
    capped = []
    for flip in flips:
        seen[flip.direction] = seen.get(flip.direction, 0) + 1
        if seen[flip.direction] > MAX_FLIPS_SHOWN:
            flip = replace(flip, baseline_rewards=None, candidate_rewards=None)
        capped.append(flip)
    return capped


def task_flips(baseline: list[Entry], candidate: list[Entry]) -> FlipSummary:
    """The flips of one agent between two runs' per-task rows (``group_level_metrics``, or a
    profile's task rows, which have the same fields): what ``rewardstream compare`` shows of
    runs still being collected, by the rules of the report's."""
    return _flips(_Side("", {}, {}, baseline, []), _Side("", {}, {}, candidate, []), 0)


def _flips(baseline: _Side, candidate: _Side, index: int) -> FlipSummary:
    """Per-task moves, tasks joined on their index alone (the files carry no task identity,
    so both runs are taken to be of the same dataset, split, limit and order)."""
    base, cand = (
        {g[_TASK]: g for g in side.groups if _TASK in g} for side in (baseline, candidate)
    )
    common = sorted(base.keys() & cand.keys())

    def summary(mode: Any, reason: str | None = None, **figures: Any) -> FlipSummary:
        only = len(base.keys() - cand.keys()), len(cand.keys() - base.keys())
        return FlipSummary(index, mode, reason, _FIELD, len(common), *only, **figures)

    if not base or not cand:
        return summary("unavailable", "one or both runs recorded no per-task metrics.")
    if not common:
        return summary(
            "unavailable",
            f"no overlapping task indices (baseline has {len(base)}, candidate has {len(cand)}).",
        )
    scored = []
    for task in common:
        b, c = _number(base[task].get(_TASK_MEAN)), _number(cand[task].get(_TASK_MEAN))
        if b is not None and c is not None:
            scored.append((task, b, c))
    if not scored:
        return summary("unavailable", f"no `{_TASK_MEAN}` recorded for the overlapping tasks.")

    def flip(task: int, b: float, c: float, direction: Any) -> TaskFlip:
        return TaskFlip(task, b, c, c - b, direction, _rewards(base[task]), _rewards(cand[task]))

    if not _binary([task for task, _, _ in scored], (base, cand)):
        moved = [flip(t, b, c, "changed") for t, b, c in scored if c != b]
        moved.sort(key=lambda f: (-abs(f.delta), f.task_index))
        return summary(
            "continuous", unchanged_count=len(scored) - len(moved), flips=_cap_rewards(moved)
        )
    flips, tied, unchanged = [], 0, 0
    for task, b, c in scored:
        if _PASS in (b, c):
            tied += 1
        elif (b > _PASS) != (c > _PASS):
            flips.append(flip(task, b, c, "pass_to_fail" if b > _PASS else "fail_to_pass"))
        else:
            unchanged += 1
    flips.sort(key=lambda f: (f.direction != "pass_to_fail", -abs(f.delta), f.task_index))
    worse = sum(1 for f in flips if f.direction == "pass_to_fail")
    better = len(flips) - worse
    return summary(
        "binary",
        pass_to_fail_count=worse,
        fail_to_pass_count=better,
        tied_count=tied,
        unchanged_count=unchanged,
        net=better - worse,
        flips=_cap_rewards(flips),
    )
