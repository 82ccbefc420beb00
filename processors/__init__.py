"""The pure profile core: state, numeric kernels and profile building (no I/O, no framework).

The batch command, the in-process pipeline and the Kafka processor all share it.
"""

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
