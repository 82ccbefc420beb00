"""Reading a byte range of an inputs or rollouts file into a profile state: the one choice
between the lean reader and the reference.

The reference parses every line with ``orjson.loads`` (:func:`jsonl.iter_jsonl`) and applies
the rules (``state.row_key``/``row_names``, ``records.extract_result``): it owns every error
message. The lean reader (:mod:`rewardstream.processors.core.lean`) decodes only what the
profile reads and hands each line it cannot take, in file order, to the reference, so both
give the same state and the same first error. ``REWARDSTREAM_READER=reference`` forces the
reference (as aiokafka's ``AIOKAFKA_NO_EXTENSIONS`` does its Python records).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from rewardstream.errors import InputError, InvalidRow, LineError
from rewardstream.infra.jsonl import iter_jsonl, parse_line
from rewardstream.processors.core import lean
from rewardstream.processors.core.lean_records import lean_results
from rewardstream.processors.core.records import ResultRecord, extract_result
from rewardstream.processors.core.state import ProfileState, row_key

__all__ = ["READER", "line_chunks", "load_inputs", "load_results"]

_BATCH = 4096  # results stored at once by the reference (one call per result costs ~3 us more)
_CHUNK = 1 << 20  # bytes the lean reader reads at once: whole lines, re-read from the last one
_TRIAL = 2000  # lines after which a part that mostly falls back is read by the reference


def _add_input(state: ProfileState, row: Any, offset: int, path: Path, lineno: int) -> None:
    """One materialized row by the rules, its error raised with the line's number."""
    try:
        state.add_input(row, offset, offset)
    except InvalidRow as exc:
        raise LineError(str(path), lineno, str(exc)) from None


def _record(
    value: Any, path: Path, lineno: int, answer_key: str | None
) -> tuple[int, int, ResultRecord]:
    """One result by the rules (key and record), its error raised with the line's number."""
    try:
        task, rollout = row_key(value)
        return task, rollout, extract_result(value, task, rollout, answer_key)
    except InvalidRow as exc:
        raise LineError(str(path), lineno, str(exc)) from None


def load_inputs_reference(state: ProfileState, path: Path, start: int, end: int) -> None:
    """The materialized rows starting in ``[start, end)``, by ``orjson.loads`` and the rules."""
    for line in iter_jsonl(path, start, end):
        _add_input(state, line.value, line.offset, path, line.lineno)


def load_results_reference(
    state: ProfileState, path: Path, start: int, end: int, answer_key: str | None
) -> None:
    """The results starting in ``[start, end)``, by ``orjson.loads`` and the rules."""
    tasks: list[int] = []
    rollouts: list[int] = []
    records: list[ResultRecord] = []
    for line in iter_jsonl(path, start, end):
        task, rollout, record = _record(line.value, path, line.lineno, answer_key)
        tasks.append(task)
        rollouts.append(rollout)
        records.append(record)
        if len(records) == _BATCH:
            state.add_records(tasks, rollouts, records, [None] * len(records))
            tasks, rollouts, records = [], [], []
    state.add_records(tasks, rollouts, records, [None] * len(records))


class _Chunk(NamedTuple):
    """Whole lines of a file: ``data[starts[i]:ends[i]]`` (no ``\\n``) is line ``lineno + i``,
    at file offset ``offset + starts[i]``."""

    data: bytes
    array: npt.NDArray[np.uint8]
    starts: npt.NDArray[np.intp]
    ends: npt.NDArray[np.intp]
    lineno: int
    offset: int

    def lines(self) -> list[memoryview]:
        """Each line's bytes, views into ``data`` (what the lean decoder reads)."""
        view = memoryview(self.data)
        return [view[s:e] for s, e in zip(self.starts.tolist(), self.ends.tolist(), strict=True)]


def line_chunks(path: Path, start: int, end: int) -> Iterator[_Chunk]:
    """The lines starting in ``[start, end)`` (as :func:`jsonl.iter_jsonl` numbers them), a
    chunk of bytes at a time. Read, not mapped: the chunks are plain bytes that decoded values
    (msgspec's ``Raw``) may refer to while an error is raised, where a mapping must be closed."""
    try:
        with open(path, "rb") as fh:
            fd = fh.fileno()
            size = os.fstat(fd).st_size
            stop = min(end, size)
            pos, lineno, want = start, 1, _CHUNK
            while pos < stop:
                data = os.pread(fd, min(want, size - pos), pos)
                if not data:
                    return
                whole = pos + len(data) == size
                cut = data.rfind(b"\n") + 1
                if whole and cut < len(data):
                    cut = len(data)  # the last line, with no newline
                elif not cut:
                    want *= 2  # a line longer than the chunk
                    continue
                array = np.frombuffer(data, np.uint8, cut)
                newlines = np.flatnonzero(array == 10)
                starts = np.r_[0, newlines + 1]
                ends = np.r_[newlines, cut]
                if starts[-1] == cut:  # the chunk ends with a newline: no line after it
                    starts, ends = starts[:-1], ends[:-1]
                keep = int(np.searchsorted(starts, stop - pos))
                yield _Chunk(data, array, starts[:keep], ends[:keep], lineno, pos)
                lineno += keep
                pos += cut
                want = _CHUNK
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None


def load_inputs_lean(state: ProfileState, path: Path, start: int, end: int) -> None:
    """:func:`load_inputs_reference`'s state, each line msgspec-decoded to its key and names."""
    for chunk in line_chunks(path, start, end):
        flagged = lean.suspects(chunk.array, chunk.starts, chunk.ends)
        view = memoryview(chunk.data)
        for i, (s, e) in enumerate(zip(chunk.starts.tolist(), chunk.ends.tolist(), strict=True)):
            found = None if i in flagged else lean.decode_input(view[s:e])
            offset = chunk.offset + s
            if found is None:
                lineno = chunk.lineno + i
                _add_input(state, parse_line(view[s:e], path, lineno), offset, path, lineno)
            else:
                task, rollout, agent, server = found
                state.add_input({}, offset, offset, (task, rollout), (agent, server))


def load_results_lean(
    state: ProfileState, path: Path, start: int, end: int, answer_key: str | None
) -> None:
    """:func:`load_results_reference`'s state, the lines the lean decoder takes as columns,
    the others by the reference, in file order. A part whose first :data:`_TRIAL` lines
    mostly fall back is read on by the reference (speed only: both give the same state)."""
    seen = fallen = 0
    for chunk in line_chunks(path, start, end):
        if seen >= _TRIAL and 2 * fallen > seen:
            _reference_lines(state, path, chunk, range(len(chunk.starts)), answer_key)
            continue
        lines = chunk.lines()
        flagged = lean.suspects(chunk.array, chunk.starts, chunk.ends)
        for taken in lean_results(lines, flagged, answer_key):
            if isinstance(taken, int):
                fallen += 1
                _reference_lines(state, path, chunk, (taken,), answer_key)
            else:  # agents are for live stats, not a batch profile's state
                state.add_columns(*taken[:-1])
        seen += len(lines)


def _reference_lines(
    state: ProfileState,
    path: Path,
    chunk: _Chunk,
    lines: range | tuple[int, ...],
    answer_key: str | None,
) -> None:
    """Lines of a chunk read by the reference (its error raised with the line's number)."""
    tasks, rollouts, records = [], [], []
    for i in lines:
        lineno = chunk.lineno + i
        value = parse_line(memoryview(chunk.data)[chunk.starts[i] : chunk.ends[i]], path, lineno)
        task, rollout, record = _record(value, path, lineno, answer_key)
        tasks.append(task)
        rollouts.append(rollout)
        records.append(record)
    state.add_records(tasks, rollouts, records, [None] * len(records))


# The one choice (tests swap these two names to run the whole profile with either reader).
READER = "reference" if os.environ.get("REWARDSTREAM_READER") == "reference" else "lean"
if READER == "lean":
    load_inputs, load_results = load_inputs_lean, load_results_lean
else:
    load_inputs, load_results = load_inputs_reference, load_results_reference
