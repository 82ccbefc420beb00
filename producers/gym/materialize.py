"""Expand an input JSONL into NeMo Gym's materialized rows, byte for byte.

The rules: docs/nemo-gym-compat.md §Materialization.

Supported: ``limit``, agent routing (``agent_ref``, ``agent_name``, ``agent_map`` with
``_default``), ``responses_create_params`` overrides (a shallow merge, new keys last in the
order given), task indices keyed by the raw line text, ``num_repeats`` (int or per-agent dict),
``num_repeats_add_seed``, ``interleave_repeats`` and ``prompt_config`` (a YAML ``{user,
system?}`` template that builds every row's ``responses_create_params.input`` from its fields,
as 0.7.0's ``nemo_gym/prompt.py``; rows that already have an ``input`` are refused, all named).
A row that names only a ``task_source`` (a prepared split's) is kept without an agent: the
collector resolves it from the head server's config before anything is written
(:func:`rewardstream.gym_servers.datasets.resolve_task_sources`). Not supported (rejected by
the config): ``fan_out`` and ``skills``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rewardstream.errors import InputError, LineError
from rewardstream.infra.jsonl import check_input_file, parse_line
from rewardstream.sinks.files import write_files

__all__ = ["MaterializeOptions", "materialize", "write_rows"]

log = logging.getLogger(__name__)

RCP = "responses_create_params"


class MaterializeOptions(BaseModel):
    """The config keys that shape the materialized rows."""

    model_config = ConfigDict(extra="ignore")

    agent_name: str | None = None
    agent_map: dict[str, str] | None = None
    limit: int | None = Field(default=None, ge=0)  # NeMo Gym reads nothing for a negative one
    num_repeats: int | dict[str, int] | None = 1
    num_repeats_add_seed: bool = False
    interleave_repeats: bool = False
    responses_create_params: dict[str, Any] = {}
    prompt_config: Path | None = None

    @field_validator("num_repeats")
    @classmethod
    def _repeats(cls, value: int | dict[str, int] | None) -> int | dict[str, int]:
        if value is None:
            return 1
        if isinstance(value, int) and value < 1:
            raise ValueError(f"num_repeats must be >= 1, got {value}")
        if isinstance(value, dict) and any(v < 1 for v in value.values()):
            raise ValueError(f"num_repeats dict values must be >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _agents(self) -> MaterializeOptions:
        default = (self.agent_map or {}).get("_default")
        if self.agent_name and default and default != self.agent_name:
            raise ValueError(
                f"agent_name={self.agent_name!r} conflicts with agent_map._default={default!r}. "
                "Set only one of them."
            )
        return self

    def routes(self) -> dict[str, str]:
        """``agent_map`` with ``agent_name`` as its ``_default``."""
        routes = dict(self.agent_map or {})
        if self.agent_name:
            routes["_default"] = self.agent_name
        return routes


def _raw_lines(path: Path, limit: int | None) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if limit and lineno > limit:
                return
            yield lineno, raw


def _route(row: dict[str, Any], routes: dict[str, str], overridden: set[str]) -> str | None:
    """The row's agent after ``agent_map``; replaces its ``agent_ref`` when a route applies."""
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    source = row.get("task_source")
    mapped = routes.get(name or "") or routes.get(source or "") or routes.get("_default")
    if mapped is None:
        return name if isinstance(name, str) else None
    if name is not None and name != mapped:
        overridden.add(f"{name!r} -> {mapped!r}")
    row["agent_ref"] = {"name": mapped}
    return mapped


def _seeded(rcp: dict[str, Any], seed: int) -> dict[str, Any]:
    """``rcp`` with ``metadata.extra_body`` a Python-style JSON string holding ``seed``."""
    metadata = dict(rcp.get("metadata") or {})
    extra = json.loads(metadata.get("extra_body") or "{}")
    extra["seed"] = seed
    metadata["extra_body"] = json.dumps(extra)
    return rcp | {"metadata": metadata}


class _Prompt(BaseModel):
    """A prompt YAML file: ``user`` required, ``system`` optional, ``{field}`` placeholders."""

    model_config = ConfigDict(extra="ignore")

    user: str
    system: str | None = None


def _prompt(path: Path) -> _Prompt:
    checked = check_input_file(path, "prompt_config")
    try:
        return _Prompt.model_validate(yaml.safe_load(checked.read_text()))
    except (yaml.YAMLError, ValidationError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise InputError(f"prompt_config '{path}': not a {{user, system}} YAML: {detail}") from None


def _prompted(
    parsed: list[tuple[int, bytes, Any]], prompt: _Prompt, path: Path
) -> list[tuple[int, bytes, Any]]:
    """0.7.0's ``validate_prompt_compatibility`` then ``apply_prompt_to_row`` on every row."""
    taken = [
        i
        for i, (_, _, row) in enumerate(parsed)
        if isinstance(row, dict) and isinstance(row.get(RCP), dict) and row[RCP].get("input")
    ]
    if taken:
        raise InputError(
            "Some rows have responses_create_params.input but prompt_config is also specified. "
            f"These are mutually exclusive. Use one or the other. Violating rows: {taken}"
        )
    out = []
    for lineno, raw, row in parsed:
        if not isinstance(row, dict):
            raise LineError(str(path), lineno, "not a JSON object")
        try:
            messages = (
                []
                if prompt.system is None
                else [{"role": "system", "content": prompt.system.format_map(row)}]
            )
            messages.append({"role": "user", "content": prompt.user.format_map(row)})
        except KeyError as exc:
            raise LineError(
                str(path),
                lineno,
                f"Prompt template references field {exc} but the data row only has fields: "
                f"{list(row)}",
            ) from None
        rcp = dict(row[RCP]) if isinstance(row.get(RCP), dict) else {}
        out.append((lineno, raw, row | {RCP: rcp | {"input": messages}}))
    return out


def materialize(path: Path, options: MaterializeOptions) -> list[dict[str, Any]]:
    """The materialized rows of ``path`` in NeMo Gym's order and key order."""
    path = check_input_file(path, "--input")
    prompt = None if options.prompt_config is None else _prompt(options.prompt_config)
    routes, overrides = options.routes(), options.responses_create_params
    task_of_line: dict[bytes, int] = {}
    next_rollout: dict[int, int] = {}
    unrouted: list[int] = []
    overridden: set[str] = set()
    rows: list[dict[str, Any]] = []
    parsed = [(n, raw, parse_line(raw, path, n)) for n, raw in _raw_lines(path, options.limit)]
    if prompt is not None:
        print(f"Using prompt config: {options.prompt_config}")
        parsed = _prompted(parsed, prompt, path)
    for lineno, raw, row in parsed:
        if not isinstance(row, dict):
            raise LineError(str(path), lineno, "not a JSON object")
        agent = _route(row, routes, overridden)
        if agent is None and isinstance(row.get("task_source"), str):
            agent = ""  # its agent comes from the running config, before anything is written
        if agent is None:
            unrouted.append(lineno - 1)
            continue
        if not isinstance(row.get(RCP), dict):
            raise LineError(str(path), lineno, f"missing field {RCP!r} (an object)")
        if overrides:
            row[RCP] = row[RCP] | overrides
        task = row.get("_ng_task_index")
        if task is None:
            task = row["_ng_task_index"] = task_of_line.setdefault(raw, len(task_of_line))
        elif not isinstance(task, int) or isinstance(task, bool):
            raise LineError(str(path), lineno, "'_ng_task_index' must be an integer")
        repeats = options.num_repeats
        if isinstance(repeats, dict):
            count = repeats.get(agent, repeats.get("_default"))
            if count is None:
                raise LineError(
                    str(path),
                    lineno,
                    f"num_repeats dict has no entry for {agent!r} and no '_default' fallback",
                )
        else:
            count = repeats or 1
        for _ in range(count):
            rollout = next_rollout.get(task, 0)
            next_rollout[task] = rollout + 1
            copy = dict(row)
            if options.num_repeats_add_seed:
                copy[RCP] = _seeded(copy[RCP], rollout)
            copy["_ng_rollout_index"] = rollout
            rows.append(copy)
    if unrouted:
        raise InputError(
            f"{path}: No agent specified for rows {unrouted}. Provide +agent_name (or "
            "+agent_map with a _default entry), or include agent_ref in the data."
        )
    if overridden:
        log.warning(
            "agent_map overrode agent_ref values already present in the data: %s",
            ", ".join(sorted(overridden)),
        )
    if options.interleave_repeats:
        rows.sort(key=lambda r: int(r["_ng_rollout_index"]))
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows as orjson lines, atomically (the sinks' writer: all or nothing)."""
    write_files([(path, (orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))])
