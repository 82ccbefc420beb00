"""Turn a collection's two files into wire events (shared by the publisher and the embedded path).

Every rollouts line is checked with the profiler's own rules before its event exists, so a bad
line fails here with its file and line number, exactly as ``ng_reward_profile`` would report it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from processors.pipeline import EventKind
from processors.records import agent_of, extract_result, slim_result
from processors.state import row_key
from rewardstream.contract import InputEvent, RolloutEvent, encode, task_key
from rewardstream.errors import InvalidRow, LineError
from rewardstream.jsonl import iter_jsonl

__all__ = ["WireEvent", "input_events", "rollout_events"]


class WireEvent(NamedTuple):
    """One encoded event with its kind and message key."""

    kind: EventKind
    key: bytes
    value: bytes


def input_events(path: Path, run_id: str) -> Iterator[WireEvent]:
    """One event per materialized row, keyed by task."""
    for line in iter_jsonl(path):
        try:
            task, _ = row_key(line.value)
        except InvalidRow as exc:
            raise LineError(str(path), line.lineno, str(exc)) from None
        event = InputEvent(run_id=run_id, line=line.lineno - 1, row=line.value)
        yield WireEvent("input", task_key(task), encode(event))


def rollout_events(path: Path, run_id: str) -> Iterator[WireEvent]:
    """One event per result line, keyed by task."""
    for line in iter_jsonl(path):
        result = line.value
        try:
            task, rollout = row_key(result)
            extract_result(result, task, rollout)  # validate as the profiler will
        except InvalidRow as exc:
            raise LineError(str(path), line.lineno, str(exc)) from None
        event = RolloutEvent(
            run_id=run_id,
            task=task,
            rollout=rollout,
            agent=agent_of(result),
            result=slim_result(result),
            published_at=time.time(),
        )
        yield WireEvent("rollout", task_key(task), encode(event))
