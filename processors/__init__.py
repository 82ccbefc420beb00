"""The pure profile core: state, numeric kernels and profile building (no I/O, no framework).

The batch command, the in-process pipeline and the Kafka processor all share it. Names load on
first use, so a light submodule (``processors.records``) imports without numpy: command-line
start-up counts in a snapshot's latency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from processors.profile import CompletionSummary, Profile, TaskRow, TaskRows, build_profile
    from processors.records import ResultRecord, extract_result
    from processors.state import ProfileState
    from processors.welford import Moments, RunningStats

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
        raise AttributeError(f"module 'processors' has no attribute {name!r}")
    return getattr(importlib.import_module(f"processors.{_HOME[name]}"), name)
