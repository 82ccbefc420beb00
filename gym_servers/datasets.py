"""Datasets a config declares, as NeMo Gym 0.7.0 prepares and routes them.

An agent or resources server lists its ``datasets`` (``name``, ``type``: example, train,
validation or benchmark, ``jsonl_fpath``, optionally ``agent``, the agent to run it). Preparing
a split (0.7.0's ``train_data_utils``, ``mode=train_preparation``) writes every declared
dataset of that type, in config order, into one ``<split>.jsonl``: each row as ``json.dumps``
writes it, its ``agent_ref`` dropped and ``task_source`` naming the declaring instance. The
collector then gives such a row the agent that task source resolves to
(:func:`resolve_task_sources`, 0.7.0's ``resolve_dataset_agent``). The messages are 0.7.0's.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rewardstream.errors import InputError
from rewardstream.gym_servers.base import server_specs
from rewardstream.gym_servers.environments import AGENTS
from rewardstream.processors.core.records import agent_of
from rewardstream.sinks.files import write_files

__all__ = ["SPLITS", "Declared", "check_split", "declared", "prepare", "resolve_task_sources"]

SPLITS = ("train", "validation", "benchmark")
RESOURCES = "resources_servers"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""Where a relative ``jsonl_fpath`` is looked up when the working folder has no such file (the
bundled config's data, as 0.7.0 looks under its install root)."""


class Declared(NamedTuple):
    """One dataset declaration: the instance declaring it and the declaration."""

    instance: str
    dataset: Mapping[str, Any]


def declared(config: Mapping[str, Any]) -> list[Declared]:
    """Every dataset the agents and resources servers of ``config`` declare, in config order."""
    return [
        Declared(spec.name, dataset)
        for spec in server_specs(config)
        if spec.server_type in (AGENTS, RESOURCES)
        for dataset in spec.config.get("datasets") or []
        if isinstance(dataset, Mapping)
    ]


def check_split(split: str, config: Mapping[str, Any]) -> list[Declared]:
    """The datasets of type ``split``; none is 0.7.0's error, which lists what is declared."""
    found = declared(config)
    mine = [d for d in found if d.dataset.get("type") == split]
    if mine:
        return mine
    listed = "\n".join(
        f"- {d.instance}: {d.dataset.get('name')} (type: {d.dataset.get('type')})" for d in found
    )
    message = (
        f"No dataset of type `{split}` is declared in this config, so `--split {split}` has "
        f"nothing to run.\nDeclared datasets:\n{listed or '- (none)'}"
    )
    examples = [
        str(d.dataset.get("jsonl_fpath")) for d in found if d.dataset.get("type") == "example"
    ]
    if examples:
        message += (
            "\nExample datasets are committed smoke-test samples and are not runnable via "
            "--split. To run one, start the servers (gym env start ...) and collect against the "
            "file directly:\n"
            + "\n".join(
                f"  gym eval run --no-serve --input {path} --output <out>.jsonl"
                for path in examples
            )
        )
    raise InputError(message)


def _source(dataset: Mapping[str, Any]) -> Path:
    raw = dataset.get("jsonl_fpath")
    if not isinstance(raw, str) or not raw:
        raise InputError(f"dataset {dataset.get('name')!r} has no jsonl_fpath")
    path = Path(raw)
    if path.exists() or path.is_absolute():
        return path
    return PACKAGE_ROOT / path if (PACKAGE_ROOT / path).exists() else path


def _rows(item: Declared) -> Iterator[bytes]:
    """The dataset's rows as 0.7.0 collates them (``json.dumps``: its spacing and escapes)."""
    for field in ("taskset", "prompt_config"):
        if item.dataset.get(field) is not None:
            raise InputError(
                f"dataset {item.dataset.get('name')!r} of {item.instance!r}: its {field} is not "
                "supported by rewardstream's data preparation"
            )
    path = _source(item.dataset)
    try:
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    row = json.loads(raw)
                except ValueError as exc:
                    raise InputError(
                        f"Malformed JSON in '{path}' at line {lineno}: {exc}"
                    ) from None
                if not isinstance(row, dict):
                    raise InputError(f"{path} line {lineno}: not a JSON object")
                row.pop("agent_ref", None)  # routing comes from the declaration
                row["task_source"] = item.instance
                yield json.dumps(row).encode() + b"\n"
    except FileNotFoundError:
        raise InputError(
            f"Missing local dataset {item.dataset.get('name')!r} of {item.instance!r}: "
            f"{path} (rewardstream does not download datasets; fetch it to that path)"
        ) from None
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None


def prepare(config: Mapping[str, Any], split: str, folder: Path) -> Path:
    """``folder/<split>.jsonl``: the split's datasets collated (written whole or not at all)."""
    datasets = check_split(split, config)
    target = folder / f"{split}.jsonl"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot create '{folder}': {exc.strerror or exc}") from None
    write_files([(target, (line for item in datasets for line in _rows(item)))])
    print(f"View your final data!\n- {split}: {target}")
    return target


def _agents_of_resources(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per resources server, the agents whose ``resources_server`` names it."""
    out: dict[str, list[str]] = {}
    for spec in server_specs(config):
        ref = spec.config.get("resources_server") if spec.server_type == AGENTS else None
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            out.setdefault(ref["name"], []).append(spec.name)
    return out


def _pins(config: Mapping[str, Any], instance: str) -> list[str]:
    """The distinct ``agent`` pins of the datasets ``instance`` declares, in order."""
    pins = [d.dataset.get("agent") for d in declared(config) if d.instance == instance]
    return list(dict.fromkeys(p for p in pins if isinstance(p, str)))


def _resolved(config: Mapping[str, Any], source: str) -> str:
    """The agent that runs the datasets ``source`` declares (0.7.0's ``resolve_dataset_agent``)."""
    kinds = {spec.name: spec.server_type for spec in server_specs(config)}
    if source not in config:
        close = difflib.get_close_matches(source, [str(k) for k in config], n=1)
        raise ValueError(
            f"{source!r}: not in the running config"
            + (f" (did you mean {close[0]!r}?)" if close else "")
        )
    if kinds.get(source) not in (AGENTS, RESOURCES):
        if source not in kinds:
            raise ValueError(f"{source!r}: not a server instance")
        raise ValueError(
            f"{source!r}: instance is not an agent or resources server (datasets cannot route here)"
        )
    pins = _pins(config, source)
    if len(pins) > 1:
        raise ValueError(
            f"{source!r}: its datasets pin conflicting agents ({sorted(pins)}), which task_source "
            f"alone cannot tell apart; pass +agent_map={{{source}: <agent>}} to pick one"
        )
    pin = pins[0] if pins else None
    if kinds[source] == AGENTS:
        if pin is not None and pin != source:
            raise ValueError(
                f"{source!r}: dataset declared by agent {source!r} pins agent {pin!r}, but rows "
                "are dispatched to the declaring agent, so the pin would silently not apply. "
                "Drop the `agent:` key, or declare the dataset on the resources server and pin "
                "there."
            )
        return source
    candidates = _agents_of_resources(config).get(source, [])
    if pin is not None:
        if pin not in candidates:
            raise ValueError(
                f"{source!r}: the dataset pins agent {pin!r}, but no agent of that name "
                f"references resources server {source!r} (rows are dispatched along the agent -> "
                f"resources server edge). Agents referencing it: "
                f"{sorted(candidates) if candidates else 'none'}."
            )
        return pin
    if not candidates:
        raise ValueError(
            f"{source!r}: no agent in the running config references resources server "
            f"{source!r}. Point an agent's `resources_server` at it, or declare the dataset on "
            "the agent."
        )
    if len(candidates) > 1:
        raise ValueError(
            f"{source!r}: {len(candidates)} agents reference this resources server "
            f"({sorted(candidates)}). Pin the harness with an `agent:` key on the dataset "
            f"declaration, or pass +agent_map={{{source}: <agent>}} to pick one at run time."
        )
    return candidates[0]


def resolve_task_sources(rows: list[dict[str, Any]], config: Mapping[str, Any]) -> None:
    """Give every row that names only a ``task_source`` the agent it resolves to (an
    ``agent_ref`` appended, as 0.7.0 stamps it before the materialized inputs are written);
    one error lists every source that does not resolve."""
    pending = {
        source
        for row in rows
        if not agent_of(row) and isinstance(source := row.get("task_source"), str)
    }
    resolution, errors = {}, []
    for source in sorted(pending):
        try:
            resolution[source] = _resolved(config, source)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise InputError("Cannot resolve task_source to an agent: " + "; ".join(errors))
    for row in rows:
        if not agent_of(row) and isinstance(source := row.get("task_source"), str):
            row["agent_ref"] = {"name": resolution[source]}
