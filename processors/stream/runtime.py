"""What the processor changes in its own process while it runs: the young collections' threshold
and the level of aiokafka's start-up noise. Both are undone when it stops."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator

__all__ = ["QuietStart", "young_collections"]


@contextlib.contextmanager
def young_collections(threshold: int) -> Iterator[None]:
    """Collect the youngest generation every ``threshold`` allocations instead of 700.

    A fetched batch keeps ~10 objects per record alive while it is applied (aiokafka's
    records, decoded events); with CPython's default they survive young collections and drive
    full ones, which scan the whole heap (docs/history/benchmarks.md: raising the threshold
    was one of the changes that took a rollout's processor CPU from 9.6-15 us to 5.2-6.6 us).
    Cycles are still collected, just later.
    """
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class QuietStart(logging.Filter):
    """aiokafka logs ERROR for what every healthy start goes through: topics the broker
    creates on first use (``Topic ... not found in cluster metadata``), a topic just created
    whose leader is still being elected (``NotLeaderForPartitionError`` when fetching its
    offsets) and a new group's coordinator still loading (``GroupCoordinatorNotAvailableError``).
    Until the first assignment (``started``) those lines are INFO; after it they are errors
    again. A context manager that filters aiokafka's loggers while it is entered."""

    _LOGGERS = (
        "aiokafka.cluster",
        "aiokafka.consumer.group_coordinator",
        "aiokafka.consumer.fetcher",
    )
    _EXPECTED = (
        "not found in cluster metadata",
        "CoordinatorNotAvailable",
        "NotLeaderForPartition",
    )

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.started and record.levelno == logging.ERROR:
            text = record.getMessage()
            if any(expected in text for expected in self._EXPECTED):
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = f"{text} (as expected while starting)", ()
        return True

    def __enter__(self) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).addFilter(self)

    def __exit__(self, *_: object) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).removeFilter(self)
