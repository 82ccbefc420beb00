"""What a run id, an output stem and a topic prefix may be: they name folders, files, topics.

Part of the wire contract (:mod:`rewardstream.contract.events` re-exports it), kept apart so the
snapshot client checks the names it writes without importing the event models.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "MAX_NAME_BYTES",
    "RUN_ID",
    "STEM",
    "Aggregates",
    "ProfilePaths",
    "check_topic_prefix",
    "default_group",
    "fits_a_name",
    "run_id_from",
    "valid_output_stem",
]

RUN_ID = r"^\w[\w.-]*$"  # a path component of the output folder: no separators, no leading dot
STEM = r"^[\w.-]+$"  # the rollouts file's stem: a file name once a suffix is appended
MAX_NAME_BYTES = 200  # run ids and stems name folders and files: far below NAME_MAX (255 bytes)
DEFAULT_TOPIC_PREFIX = "rewardstream"  # topics rewardstream.inputs, ... unless told otherwise


_TOPIC_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,200}")


def check_topic_prefix(prefix: str) -> str:
    """Kafka topic names are ASCII letters, digits, ``.``, ``_`` and ``-``, at most 249: a
    prefix outside that makes every client retry an invalid topic name forever (thousands of
    log lines a second), so it is refused first. ValueError says why."""
    if not _TOPIC_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"invalid topic prefix {prefix!r}: Kafka topic names take letters, digits, '.', "
            "'_' and '-' (at most 200 here, to leave room for the suffixes)"
        )
    return prefix


def fits_a_name(value: str) -> str:
    """Characters are not bytes: 200 non-ASCII characters would exceed the file system's
    255-byte name limit and fail every write for the run (the processor would crash-loop)."""
    if len(value.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"must be at most {MAX_NAME_BYTES} bytes in UTF-8 (it names a file)")
    return value


def default_group(prefix: str) -> str:
    """The processors' consumer group when none is named: ``<prefix>-profiler``."""
    return f"{prefix}-profiler"


def run_id_from(text: str) -> str:
    """``text`` made into a valid run id (invalid characters become ``_``), cut to 180 bytes so
    that a ``-<8 hex>`` suffix still fits :data:`MAX_NAME_BYTES`."""
    cut = re.sub(r"[^\w.-]", "_", text).encode()[:180].decode(errors="ignore")
    return cut.lstrip(".-") or "run"


def valid_output_stem(stem: object) -> bool:
    """What ``RunStarted.output_stem`` accepts (a snapshot client checks the names it writes)."""
    return (
        isinstance(stem, str)
        and re.fullmatch(STEM, stem) is not None
        and 0 < len(stem.encode()) <= MAX_NAME_BYTES
    )


class Aggregates(NamedTuple):
    """What a run asked for beyond NeMo Gym's three files: ``_aggregate_metrics.json``,
    ``_task_difficulty.json`` and ``_intervals.json``, with majority@k when its results carry
    answers, and the intervals at ``level`` (the batch command's ``+interval_level``, the
    processor's ``--level``)."""

    answers: bool
    level: float


class ProfilePaths(NamedTuple):
    """The three files ``ng_reward_profile`` writes next to the rollouts file."""

    reward_profiling: Path
    agent_metrics: Path
    repeat_level_metrics: Path

    @property
    def aggregate_metrics(self) -> Path:
        """``<stem>_aggregate_metrics.json``: pass@k and friends, when asked for."""
        return self._beside("_aggregate_metrics.json")

    @property
    def task_difficulty(self) -> Path:
        """``<stem>_task_difficulty.json``: rewardstream's own, beside NeMo Gym's files."""
        return self._beside("_task_difficulty.json")

    @property
    def intervals(self) -> Path:
        """``<stem>_intervals.json``: rewardstream's own anytime-valid intervals."""
        return self._beside("_intervals.json")

    def extras(self) -> list[Path]:
        """The files :class:`Aggregates` add, in the order they are written."""
        return [self.aggregate_metrics, self.task_difficulty, self.intervals]

    def _beside(self, suffix: str) -> Path:
        name = self.reward_profiling.name.removesuffix("_reward_profiling.jsonl")
        return self.reward_profiling.with_name(name + suffix)

    @classmethod
    def next_to(cls, rollouts: str | os.PathLike[str]) -> ProfilePaths:
        r = Path(rollouts)
        return cls(
            r.with_name(f"{r.stem}_reward_profiling.jsonl"),
            r.with_name(f"{r.stem}_agent_metrics.json"),
            r.with_name(f"{r.stem}_repeat_level_metrics.json"),
        )
