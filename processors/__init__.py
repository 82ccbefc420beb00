"""Per-task and per-agent statistics, kept incrementally, in three layers (imports run down
only; ``lint-imports`` checks it, see pyproject.toml):

- the pure core, no I/O: ``state`` (mergeable store), ``records``, ``kernels``, ``welford``,
  ``profile`` (the three outputs); the batch command, the in-process pipeline and the Kafka
  processor all share it;
- the engine, which decides and does no I/O of its own: ``runs`` (runs, parts, dedupe),
  ``pipeline`` (events to parts, when a run is ready, what a replay skips), ``partwire`` (parts
  as versioned bytes);
- adapters, which act: ``stream`` (Kafka), ``http``, ``snapshot`` (forked builders),
  ``inprocess`` (the embedded transport).

Names load on first use, so a light submodule (``records``) imports without numpy:
command-line start-up counts in a snapshot's latency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewardstream.processors.profile import (
        CompletionSummary,
        Profile,
        TaskRow,
        TaskRows,
        build_profile,
    )
    from rewardstream.processors.records import ResultRecord, extract_result
    from rewardstream.processors.state import ProfileState
    from rewardstream.processors.welford import Moments, RunningStats

__all__ = [
    "CompletionSummary",
    "Moments",
    "Profile",
    "ProfileState",
    "ResultRecord",
    "RunningStats",
    "TaskRow",
    "TaskRows",
    "build_profile",
    "extract_result",
]

_HOME = {
    "CompletionSummary": "profile",
    "Profile": "profile",
    "TaskRow": "profile",
    "TaskRows": "profile",
    "build_profile": "profile",
    "ResultRecord": "records",
    "extract_result": "records",
    "ProfileState": "state",
    "Moments": "welford",
    "RunningStats": "welford",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
