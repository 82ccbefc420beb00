"""``gym eval compare``: NeMo Gym 0.7.0's comparison of a baseline run and a candidate run.

    gym eval compare --baseline A/r.jsonl --candidates B/r.jsonl [-o DIR] [--agent NAME] [...]

Reads each run's ``<stem>_aggregate_metrics.json`` (the rollouts file is only the run's name),
writes ``compare_report.md`` and ``compare_report.json`` and prints the key metrics and a
recap, all as 0.7.0 does (docs/nemo-gym-compat.md §Compare). Its refusals too: a setting
missing or of the wrong type is argparse's usage error (exit 2, from ``gym``); a file or an
agent it cannot use is ``Error: ...`` on stdout and exit 1, where rewardstream's own commands
say one line on stderr and exit 2.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, Field, ValidationError, model_validator

from rewardstream.errors import InputError, RewardstreamError, UsageError
from rewardstream.infra.command import run_guarded
from rewardstream.infra.overrides import parse_overrides
from rewardstream.processors.core.compare import (
    Report,
    Run,
    agent_entries,
    compare_agents,
    with_repeat_metrics,
)

__all__ = ["NEMO_GYM_VERSION", "CompareConfig", "main", "write_report"]

PROG = "gym eval compare"
NEMO_GYM_VERSION = "0.7.0"
"""The NeMo Gym whose comparison this is, as the report names it (``nemo_gym_version``)."""

_MAX_CANDIDATES = 1  # 0.7.0 compares one candidate; the report's lists are ready for more
_OVERRIDE = re.compile(r"^(\+{1,2})([^=]+)=(.*)$")


class CompareConfig(BaseModel):
    """0.7.0's ``ComparisonConfig``: the same keys, defaults and refusals (pydantic's words)."""

    baseline_rollouts_jsonl_fpath: str
    candidate_rollouts_jsonl_fpaths: list[str] = Field(min_length=1)
    baseline_aggregate_metrics_fpath: str | None = None
    candidate_aggregate_metrics_fpaths: list[str] | None = None
    agent_name: str | None = None
    baseline_agent_name: str | None = None
    candidate_agent_names: list[str] | None = None
    output_dirpath: str | None = None
    report_format: Literal["md", "json", "both"] = "both"

    @model_validator(mode="after")
    def _one_per_candidate(self) -> CompareConfig:
        n = len(self.candidate_rollouts_jsonl_fpaths)
        if n > _MAX_CANDIDATES:
            raise ValueError(
                f"{n} candidates were given, but comparing more than {_MAX_CANDIDATES} candidate "
                "is not supported yet. Give a single candidate run."
            )
        for name in ("candidate_agent_names", "candidate_aggregate_metrics_fpaths"):
            given = getattr(self, name)
            if given is not None and len(given) != n:
                raise ValueError(
                    f"{name} has {len(given)} entries but {n} candidate run(s) were given. "
                    "Give one entry per candidate, in the same order."
                )
        return self


def _refusal(exc: ValidationError) -> str:
    """0.7.0's line for a refused configuration: the missing keys, then the others' reasons."""
    missing, invalid = [], []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "<config>"
        if error["type"] == "missing":
            missing.append(where)
        else:
            invalid.append(f"{where} ({error['msg']})")
    parts = []
    if missing:
        parts.append(
            f"missing required configuration: {', '.join(missing)}. Provide each via its flag "
            f"(see --help) or as a +{missing[0]}=<value> override."
        )
    if invalid:
        parts.append(f"invalid configuration: {'; '.join(invalid)}.")
    return " ".join(parts)


def _shown(tokens: list[str]) -> list[str]:
    """The overrides as the report's ``command`` shows them: a value whose key names a token,
    a key or a header is ``****``."""
    shown = []
    for token in tokens:
        match = _OVERRIDE.match(token)
        if match and any(w in match[2].rsplit(".", 1)[-1] for w in ("token", "key", "header")):
            token = f"{match[1]}{match[2]}=****"
        shown.append(token)
    return shown


def _roots() -> list[Path]:
    """Where a relative path is looked for: ``NEMO_GYM_EXTRA_ROOTS``, then the working folder
    (NeMo Gym's install root, which holds its own built-in files, comes last there)."""
    extra = [Path(d) for d in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if d]
    roots: dict[Path, Path] = {}
    for root in (*extra, Path.cwd()):
        roots.setdefault(root.resolve(), root)
    return list(roots.values())


def _found(path: str) -> Path:
    """``path`` under the first root that has it, else under the first root."""
    given = Path(path)
    if given.is_absolute():
        return given
    roots = _roots()
    return next((root / given for root in roots if (root / given).exists()), roots[0] / given)


def _load(
    role: Literal["baseline", "candidate"], index: int, rollouts: str, metrics: str | None
) -> Run:
    """One run's entries: the metrics file named, else the rollouts file's sibling; an old
    file's repeat-level metrics are computed from its rollout summaries."""
    from rewardstream.gym_servers.aggregate import aggregate_metrics

    named = _found(rollouts)
    path = (
        _found(metrics)
        if metrics
        else named.with_stem(f"{named.stem}_aggregate_metrics").with_suffix(".json")
    )
    if not path.exists():
        raise InputError(
            f"Aggregate metrics not found: '{path}', derived from '{rollouts}'. The run may have "
            "been collected with --disable-aggregation: run `gym eval aggregate` first, or point "
            "at the metrics file directly with 'baseline_aggregate_metrics_fpath' or "
            "'candidate_aggregate_metrics_fpaths'."
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"Cannot read aggregate metrics at '{path}': {exc}") from None
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"'{path}' is not valid JSON: {exc}") from None
    entries = agent_entries(payload, str(path))
    if any("repeat_level_metrics" not in entry for entry in entries.values()):
        warnings.warn(
            f"Repeat-level metrics are missing in '{path}'; calculating them from stored rollout "
            "summaries.",
            stacklevel=2,
        )
        entries = {
            name: entry
            if "repeat_level_metrics" in entry
            else with_repeat_metrics(entry, aggregate_metrics)
            for name, entry in entries.items()
        }
    return Run.of(role, index, named, path, entries)


def _report(config: CompareConfig, command: str) -> Report:
    baseline = _load(
        "baseline", 0, config.baseline_rollouts_jsonl_fpath, config.baseline_aggregate_metrics_fpath
    )
    metrics = config.candidate_aggregate_metrics_fpaths
    candidates = [
        _load("candidate", i, rollouts, metrics[i] if metrics else None)
        for i, rollouts in enumerate(config.candidate_rollouts_jsonl_fpaths)
    ]
    comparisons, skipped, run_warnings = compare_agents(
        baseline,
        candidates,
        agent=config.agent_name,
        baseline_agent=config.baseline_agent_name,
        candidate_agents=config.candidate_agent_names,
        warn=lambda message: warnings.warn(message, stacklevel=2),
    )
    return Report(
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        nemo_gym_version=NEMO_GYM_VERSION,
        command=command,
        baseline=baseline.file,
        candidates=[run.file for run in candidates],
        comparisons=comparisons,
        skipped_agents=skipped,
        warnings=run_warnings,
    )


def _output_dir(config: CompareConfig) -> Path:
    """``--output-dir`` under the working folder, else the folder of the candidate's rollouts."""
    if config.output_dirpath:
        given = Path(config.output_dirpath)
        return given if given.is_absolute() else Path.cwd() / given
    return _found(config.candidate_rollouts_jsonl_fpaths[-1]).parent


def _written(config: CompareConfig, command: str) -> tuple[Report, list[Path]]:
    from rewardstream.sinks.compare_report import write

    report = _report(config, command)
    return report, write(report, _output_dir(config), config.report_format)


def _compare(config: CompareConfig, command: str) -> int:
    from rich import print as rich_print
    from rich.markup import escape

    from rewardstream.sinks.compare_report import print_recap

    try:
        report, written = _written(config, command)
    except RewardstreamError as exc:
        rich_print(f"[red]Error:[/red] {escape(str(exc))}")  # 0.7.0's: wrapped at the width
        return 1
    print_recap(report, written)
    return 0


def _config(argv: list[str]) -> CompareConfig:
    try:
        return CompareConfig.model_validate(parse_overrides(argv))
    except ValidationError as exc:
        raise UsageError(_refusal(exc)) from None
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _command(argv: list[str]) -> str:
    return shlex.join(["gym", "eval", "compare", *_shown(argv)])


def write_report(argv: list[str]) -> list[Path]:
    """The report ``argv`` (the overrides ``gym eval compare``'s flags become) asks for, written
    as that command writes it, without its recap: ``rewardstream compare --output-dir``'s.
    Errors are :class:`RewardstreamError` (the message 0.7.0 prints after ``Error:``)."""
    return _written(_config(argv), _command(argv))[1]


def main(argv: list[str]) -> int:
    """Compare as ``argv`` (``+key=value`` overrides, as ``gym`` turns its flags into) says;
    raises :class:`UsageError` for a configuration 0.7.0 refuses with its usage."""
    config = _config(argv)
    return run_guarded(PROG, lambda: _compare(config, _command(argv)))
