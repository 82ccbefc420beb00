"""Turn a collection's lines into wire events (shared by the publisher and the embedded path).

Every line is checked with the profiler's own rules before its event exists, so a bad
line fails here with its file and line number, exactly as ``ng_reward_profile`` reports it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from rewardstream.contract.events import EventKind, encode_input, encode_rollout, task_key
from rewardstream.errors import InvalidRow, LineError
from rewardstream.infra.jsonl import iter_jsonl
from rewardstream.processors.core.records import agent_of, extract_result
from rewardstream.processors.core.state import row_key, row_names

__all__ = ["WireEvent", "input_event", "input_events", "rollout_event", "rollout_events"]


class WireEvent(NamedTuple):
    """One encoded event with its kind and message key (its task)."""

    kind: EventKind
    key: bytes
    value: bytes


def input_event(row: Any, run_id: str, path: Path, lineno: int) -> WireEvent:
    """The event of materialized row ``lineno`` (1-based) of ``path``, checked as the batch
    profiler checks it (a row it would reject fails here, not in the processor)."""
    try:
        task, _ = row_key(row)
        row_names(row)
        return WireEvent("input", task_key(task), encode_input(run_id, lineno - 1, row))
    except (InvalidRow, orjson.JSONEncodeError) as exc:
        raise LineError(str(path), lineno, str(exc)) from None


def rollout_event(
    row: Any, run_id: str, path: Path, lineno: int, answer_key: str | None = None
) -> WireEvent:
    """The event of result line ``lineno`` of ``path``: its record, extracted as the profiler
    extracts it, so a line the profiler would reject fails here with the same message (with
    the answer under ``answer_key``, when the run has one)."""
    try:
        task, rollout = row_key(row)
        record = extract_result(row, task, rollout, answer_key)
    except InvalidRow as exc:
        raise LineError(str(path), lineno, str(exc)) from None
    value = encode_rollout(run_id, task, rollout, agent_of(row), record, time.time())
    return WireEvent("rollout", task_key(task), value)


def input_events(path: Path, run_id: str) -> Iterator[WireEvent]:
    for line in iter_jsonl(path):
        yield input_event(line.value, run_id, path, line.lineno)


def rollout_events(path: Path, run_id: str, answer_key: str | None = None) -> Iterator[WireEvent]:
    for line in iter_jsonl(path):
        yield rollout_event(line.value, run_id, path, line.lineno, answer_key)
