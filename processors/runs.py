"""One collection's streaming state: deduplicated events into a :class:`ProfileState`.

Framework-free: the Kafka processor and the in-process pipeline both feed decoded events to a
:class:`RunTracker` and ask it whether the run is complete. Redelivered or republished events
are recognised by their key and counted once; ``sample`` rows are appended to a spill file on
disk (the state keeps only their offsets), so memory stays with the numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson

from processors.profile import Profile, build_profile
from processors.records import extract_result
from processors.state import ProfileState, row_key
from rewardstream.contract import InputEvent, RolloutEvent, RunStarted

__all__ = ["RunTracker", "SampleSpill"]


class SampleSpill:
    """Append-only file of ``sample`` rows (one JSON line each), addressed by byte offset.

    Writes are unbuffered and reads use ``pread``, so a snapshot thread can read samples while
    the consumer keeps appending.
    """

    def __init__(self, path: Path, size: int = 0) -> None:
        """Open a new spill, or reopen one at ``size`` bytes (dropping what came after it)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        os.ftruncate(self._fd, size)
        self._size = size

    def __reduce__(self) -> tuple[type[SampleSpill], tuple[Path, int]]:
        return (SampleSpill, (self.path, self._size))  # a checkpoint keeps the length, not the fd

    def append(self, row: dict[str, object]) -> int:
        sample = {k: v for k, v in row.items() if k not in ("_ng_task_index", "_ng_rollout_index")}
        data = orjson.dumps(sample, option=orjson.OPT_APPEND_NEWLINE)
        offset = self._size
        os.write(self._fd, data)
        self._size += len(data)
        return offset

    def sample(self, offset: int) -> bytes:
        chunks = []
        while True:
            chunk = os.pread(self._fd, 1 << 16, offset)
            end = chunk.find(b"\n")
            if end >= 0 or not chunk:
                chunks.append(chunk[:end] if end >= 0 else chunk)
                return b"".join(chunks)
            chunks.append(chunk)
            offset += len(chunk)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RunTracker:
    """Rows, results and control state of one run (``run_id``)."""

    def __init__(self, run_id: str, spill_dir: Path) -> None:
        self.run_id = run_id
        self.state = ProfileState()
        self.started: RunStarted | None = None
        self.finished = False
        self.done = False  # the final profile was written, or failed (see ``error``)
        self.error: str | None = None
        self.duplicates = 0
        self._inputs: set[tuple[int, int]] = set()
        self._results: set[tuple[int, int]] = set()
        self.spill = SampleSpill(spill_dir / f"{run_id}.samples.jsonl")

    @property
    def rollouts(self) -> int:
        return len(self._results)

    @property
    def complete(self) -> bool:
        """Every expected rollout (and every input row) has arrived."""
        expected = self.started.expected_rollouts if self.started else None
        return expected is not None and self.rollouts == expected == len(self._inputs)

    def add_input(self, event: InputEvent) -> bool:
        """Record one materialized row; False when it was seen before."""
        key = row_key(event.row)
        if key in self._inputs:
            self.duplicates += 1
            return False
        self._inputs.add(key)
        self.state.add_input(event.row, self.spill.append(event.row))
        return True

    def add_rollout(self, event: RolloutEvent) -> bool:
        """Record one rollout; False when it was seen before."""
        key = (event.task, event.rollout)
        if key in self._results:
            self.duplicates += 1
            return False
        record = extract_result(event.result, event.task, event.rollout)
        self._results.add(key)
        self.state.add_record(event.task, event.rollout, record, event.agent)
        return True

    def tasks_complete(self) -> int:
        """Tasks whose every materialized row has its result (masked ones included)."""
        tasks, rows = np.unique(ProfileState.column(self.state.in_task), return_counts=True)
        done = dict(
            zip(
                *np.unique(ProfileState.column(self.state.res_task), return_counts=True),
                strict=True,
            )
        )
        return sum(
            1 for t, n in zip(tasks.tolist(), rows.tolist(), strict=True) if done.get(t) == n
        )

    def profile(self, allow_partial: bool) -> Profile:
        return build_profile(self.state, allow_partial)
