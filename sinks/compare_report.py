"""The ``gym eval compare`` report: ``compare_report.md`` and ``compare_report.json`` as NeMo Gym
0.7.0 writes them, byte for byte, and the key-metrics tables and lines it prints after them
(docs/nemo-gym-compat.md §Compare)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from rewardstream.errors import InputError
from rewardstream.processors.core.compare import (
    MAX_FLIPS_SHOWN,
    AgentComparison,
    CandidateValue,
    FlipSummary,
    MetricRow,
    MetricValue,
    Report,
    TaskFlip,
    comparison_value,
)

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["JSON_NAME", "MARKDOWN_NAME", "print_recap", "render_json", "render_markdown", "write"]

MARKDOWN_NAME = "compare_report.md"
JSON_NAME = "compare_report.json"

_NONE = "—"
_DELTA = "Δ (cand \N{MINUS SIGN} base)"
_DELTA_CI = f"95% CI for {_DELTA}"
_CI_NOTE = (
    "Displayed baseline/candidate values and each delta use `mean_across_repeats/<metric>` when "
    "recorded, otherwise the metric value. Delta CI = two-sided independent-sample 95% Welch "
    "t-interval for candidate minus baseline, computed from the named metric's values in each "
    f"run's `repeat_level_metrics`. `{_NONE}` means the required interval data was unavailable: "
    "delta intervals require at least 2 finite repeat-level values on each side. "
    "Baseline/candidate CI = 95% t-interval of the per-repeat mean across repeats, read verbatim "
    "from `ci_{low,high}_95_across_repeats/<metric>` in `*_aggregate_metrics.json`."
)
_JOIN_NOTE = (
    "Tasks are joined on `_ng_task_index`. `*_aggregate_metrics.json` carries no task identity, "
    "so flips are reported by index only — this assumes both runs used the same dataset, split, "
    "`--limit` and ordering."
)


def _num(value: float | None, sign: str = "") -> str:
    if value is None:
        return _NONE
    return f"{value:{sign}.4f}" if abs(value) < 10 else f"{value:{sign}.2f}"


def _point(value: MetricValue | None) -> str:
    return _NONE if value is None else _num(comparison_value(value))


def _interval(low: float | None, high: float | None, sign: str = "") -> str:
    return _NONE if low is None or high is None else f"[{_num(low, sign)}, {_num(high, sign)}]"


def _ci(value: MetricValue | None) -> str:
    return _NONE if value is None else _interval(value.ci_low, value.ci_high)


def _delta(value: CandidateValue | None) -> str:
    if value is None or value.delta is None:
        return _NONE
    pct = "n/a" if value.delta_pct is None else f"{value.delta_pct:+.1f}%"
    return f"{_num(value.delta, '+')} ({pct})"


def _delta_ci(value: CandidateValue | None) -> str:
    return _NONE if value is None else _interval(value.delta_ci_low, value.delta_ci_high, "+")


def _table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _labels(report: Report) -> list[str]:
    n = len(report.candidates)
    return ["Candidate"] if n == 1 else [f"Candidate {i + 1}" for i in range(n)]


def _runs_table(report: Report, comparison: AgentComparison) -> list[str]:
    runs = [report.baseline, *report.candidates]
    repeats = [comparison.baseline_repeat_count, *comparison.candidate_repeat_counts]
    rows = [
        ["Run", *(f"`{run.label}`" for run in runs)],
        ["Rollouts", *(f"`{run.rollouts_jsonl_fpath}`" for run in runs)],
        ["Aggregate metrics", *(f"`{run.aggregate_metrics_fpath}`" for run in runs)],
        ["Agent", *(f"`{a}`" for a in [comparison.baseline_agent, *comparison.candidate_agents])],
        ["Tasks", *map(str, [comparison.baseline_task_count, *comparison.candidate_task_counts])],
        ["Repeats", *("unknown" if n is None else str(n) for n in repeats)],
    ]
    header = ["", "Baseline", *_labels(report)]
    return _table(header, ["---"] * len(header), rows)


def _metrics_table(rows: Sequence[MetricRow], labels: Sequence[str]) -> list[str]:
    header = ["Metric", _DELTA, _DELTA_CI, "Baseline", "Baseline 95% CI"]
    align = ["---", "---:", "---", "---:", "---"]
    for label in labels:
        header += [label, f"{label} 95% CI"]
        align += ["---:", "---"]
    cells = []
    for row in rows:
        line = [f"`{row.metric}`", " / ".join(map(_delta, row.candidates))]
        line += [
            " / ".join(map(_delta_ci, row.candidates)),
            _point(row.baseline),
            _ci(row.baseline),
        ]
        for value in row.candidates:
            line += [_point(value), _ci(value)]
        cells.append(line)
    return _table(header, align, cells)


def _shown(flips: Sequence[TaskFlip]) -> list[TaskFlip]:
    """The first :data:`MAX_FLIPS_SHOWN` of each direction, in the summary's order."""
    seen: dict[str, int] = {}
    shown = []
    for flip in flips:
        seen[flip.direction] = seen.get(flip.direction, 0) + 1
        if seen[flip.direction] <= MAX_FLIPS_SHOWN:
            shown.append(flip)
    return shown


def _rewards(rewards: list[float] | None) -> str:
    return ", ".join(f"{r:g}" for r in rewards) if rewards else _NONE


def _flips_section(summary: FlipSummary, label: str) -> list[str]:
    lines = [f"### Sample flips{label}", ""]
    if summary.mode == "unavailable":
        return [*lines, f"Not available: {summary.reason}", ""]
    common = f"**{summary.common_task_count} common tasks · "
    if summary.mode == "binary":
        lines += [
            f"Field: `{summary.field}` (task mean over its repeats). A task passes when its mean "
            "is above 0.5.",
            "",
            f"{common}{summary.pass_to_fail_count} pass→fail · {summary.fail_to_pass_count} "
            f"fail→pass · net {summary.net:+d} · {summary.unchanged_count} unchanged · "
            f"{summary.tied_count} tied**",
            "",
        ]
    else:
        lines += [
            "Rewards are not binary, so this lists the largest per-task changes in "
            f"`{summary.field}` rather than pass/fail flips.",
            "",
            f"{common}{len(summary.flips)} changed · {summary.unchanged_count} unchanged**",
            "",
        ]
    shown = _shown(summary.flips)
    if shown:
        header = ["Task", "Direction", "Baseline", "Candidate", "Δ"]
        header += ["Baseline per-repeat", "Candidate per-repeat"]
        rows = [
            [
                str(f.task_index),
                f.direction.replace("_to_", "→"),
                _num(f.baseline_score),
                _num(f.candidate_score),
                _num(f.delta, "+"),
                _rewards(f.baseline_rewards),
                _rewards(f.candidate_rewards),
            ]
            for f in shown
        ]
        lines += _table(header, ["---:", "---", "---:", "---:", "---:", "---", "---"], rows)
        if len(summary.flips) > len(shown):
            more = len(summary.flips) - len(shown)
            lines += ["", f"… and {more} more (full list in `{JSON_NAME}`)."]
        lines.append("")
    return [*lines, _JOIN_NOTE, ""]


def _agent_section(report: Report, comparison: AgentComparison) -> list[str]:
    labels = _labels(report)
    lines = []
    if len(report.comparisons) > 1:
        lines += [f"## Agent: `{comparison.baseline_agent}`", ""]
    lines += _runs_table(report, comparison)
    lines += ["", f"Generated {report.generated_at} by nemo-gym {report.nemo_gym_version}.", ""]
    lines += [f"Command: `{report.command}`", "", "### Key metrics", ""]
    keys = [row for row in comparison.metrics if row.is_key_metric]
    others = [row for row in comparison.metrics if not row.is_key_metric]
    lines += (
        _metrics_table(keys, labels) if keys else ["No key metrics were recorded for this agent."]
    )
    lines += ["", _CI_NOTE, ""]
    if others:
        lines += ["<details>", f"<summary>All other metrics ({len(others)} rows)</summary>", ""]
        lines += [*_metrics_table(others, labels), "", "</details>", ""]
    for i, summary in enumerate(comparison.flips):
        lines += _flips_section(summary, f" — {labels[i]}" if len(comparison.flips) > 1 else "")
    one_sided = [r for r in comparison.metrics if len(r.present_in) < 1 + len(report.candidates)]
    if one_sided:
        lines += [
            "### Metrics present in only one run",
            "",
            "Metric names embed the repeat count (`pass@1[avg-of-3]` vs `pass@1[avg-of-5]`), so "
            "runs collected with different `--num-repeats` will not line these up.",
            "",
        ]
        for row in one_sided:
            where = ", ".join(row.present_in) or "no numeric value on either side"
            lines.append(f"- `{row.metric}` — {where}")
        lines.append("")
    if comparison.notes:
        lines += ["### Notes", "", *(f"- {note}" for note in comparison.notes), ""]
    return lines


def render_markdown(report: Report) -> str:
    lines = ["# gym eval compare", ""]
    for comparison in report.comparisons:
        lines += _agent_section(report, comparison)
    if report.warnings:
        lines += ["## Warnings", "", *(f"- {warning}" for warning in report.warnings), ""]
    lines += [
        "---",
        f"Generated by `gym eval compare` (nemo-gym {report.nemo_gym_version}). Machine-readable "
        f"output: `{JSON_NAME}` (schema_version {report.schema_version}).",
        "",
    ]
    return "\n".join(lines)


def render_json(report: Report) -> bytes:
    return orjson.dumps(dataclasses.asdict(report), option=orjson.OPT_INDENT_2)


def write(report: Report, folder: Path, report_format: str) -> list[Path]:
    """Write the artifacts ``report_format`` asks for into ``folder`` (created); the paths."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--output-dir '{folder}' exists and is not a directory.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot write to --output-dir '{folder}': {exc}") from None
    written = []
    try:
        if report_format in ("md", "both"):
            written.append(folder / MARKDOWN_NAME)
            written[-1].write_text(render_markdown(report), encoding="utf-8")
        if report_format in ("json", "both"):
            written.append(folder / JSON_NAME)
            written[-1].write_bytes(render_json(report))
    except OSError as exc:
        raise InputError(f"Cannot write the report into '{folder}': {exc}") from None
    return written


def _key_metrics_table(comparison: AgentComparison) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"Key metrics — {comparison.baseline_agent}")
    for name, justify in (("Metric", "left"), (_DELTA, "right"), (_DELTA_CI, "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for side in ("Baseline", "Candidate"):
        table.add_column(side, justify="right")
        table.add_column(f"{side} 95% CI")
    for row in comparison.metrics:
        if row.is_key_metric:
            value = row.candidates[0] if row.candidates else None
            table.add_row(
                escape(row.metric),  # `[avg-of-k]` is no markup
                _delta(value),
                _delta_ci(value),
                _point(row.baseline),
                _ci(row.baseline),
                _point(value),
                _ci(value),
            )
    return table


def print_recap(report: Report, written: Sequence[Path]) -> None:
    """Each agent's key metrics as a table (as wide as it needs when stdout is no terminal, so
    no cell is cut), then where the runs were read, the flips, and what was written."""
    from rich.console import Console

    for comparison in report.comparisons:
        table, console = _key_metrics_table(comparison), Console()
        if not console.file.isatty():
            height = console.height  # an explicit height: TERM=dumb would reset the width
            width = Console(width=10**6, height=height).measure(table).maximum
            console = Console(width=width, height=height)
        console.print(table)
    lines = [f"Baseline:  {report.baseline.aggregate_metrics_fpath}"]
    lines += [f"Candidate: {run.aggregate_metrics_fpath}" for run in report.candidates]
    agents = sorted({c.baseline_agent for c in report.comparisons})
    lines.append(f"Agents compared: {', '.join(agents)}")
    for summary in (s for c in report.comparisons for s in c.flips):
        if summary.mode == "binary":
            lines.append(
                f"Sample flips: {summary.fail_to_pass_count} fail→pass, "
                f"{summary.pass_to_fail_count} pass→fail over {summary.common_task_count} "
                "common tasks"
            )
        elif summary.mode == "continuous":
            lines.append(
                f"Per-task changes: {len(summary.flips)} of {summary.common_task_count} common "
                "tasks moved"
            )
        else:
            lines.append(f"Sample flips unavailable: {summary.reason}")
    print("\n".join([*lines, *(f"Wrote: {path}" for path in written)]))
