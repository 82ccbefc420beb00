"""JSONL reading with NeMo Gym's rules and one-line errors naming file and line.

The rules: docs/nemo-gym-compat.md §Reading JSONL.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InputError, LineError

__all__ = [
    "JsonLine",
    "check_input_file",
    "count_lines",
    "iter_jsonl",
    "parse_line",
    "split_ranges",
]

_EMPTY_MESSAGE = "input data is empty: line 1 column 1 (char 0)"


class JsonLine(NamedTuple):
    """One parsed line: 1-based line number, byte offset of the line start, parsed value."""

    lineno: int
    offset: int
    value: Any


def check_input_file(path: str | os.PathLike[str], flag: str) -> Path:
    """Fail early, with NeMo Gym's wording, when ``path`` is not a readable regular file."""
    p = Path(path)
    if not p.exists():
        raise InputError(
            f"Input file not found: '{path}' ({flag}). Check the path is spelled correctly."
        )
    if not p.is_file():
        raise InputError(f"Input path is not a regular file: '{path}' ({flag}).")
    if not os.access(p, os.R_OK):
        raise InputError(f"Input file is not readable: '{path}' ({flag}).")
    return p


def parse_line(raw: bytes | memoryview, path: str | os.PathLike[str], lineno: int) -> Any:
    """Parse one line (``\n`` or ``\r\n`` ended); a blank line is an error, as in NeMo Gym."""
    n = len(raw)
    if n and raw[n - 1] == 10:  # b"\n"
        n -= 1
    if n and raw[n - 1] == 13:  # b"\r"
        n -= 1
    if n:
        try:
            return orjson.loads(raw[:n] if n < len(raw) else raw)
        except orjson.JSONDecodeError as exc:
            reason = str(exc)
    else:
        reason = _EMPTY_MESSAGE
    del raw  # drop the (memory-mapped) line before raising: a traceback would pin the mapping
    raise LineError(str(path), lineno, reason, malformed=True)


def iter_jsonl(
    path: str | os.PathLike[str], start: int = 0, end: int | None = None
) -> Iterator[JsonLine]:
    """Yield the lines starting in ``[start, end)`` with their byte offsets, streaming.

    The file is memory-mapped and lines are parsed in place (no per-line copy), which is a
    large share of the time on multi-GB rollouts files. ``start`` must be a line start (see
    :func:`split_ranges`); line numbers count from it.
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed in finally, after the mapping
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None
    try:
        size = os.fstat(fh.fileno()).st_size
        stop = size if end is None else min(end, size)
        if start >= stop:
            return
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(mapping)
        try:
            find, pos, lineno = mapping.find, start, 0
            while pos < stop:
                lineno += 1
                nl = find(b"\n", pos)
                nxt = size if nl < 0 else nl + 1
                yield JsonLine(lineno, pos, parse_line(view[pos:nxt], path, lineno))
                pos = nxt
        finally:
            view.release()
            mapping.close()
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None
    finally:
        fh.close()


def split_ranges(path: str | os.PathLike[str], parts: int) -> list[tuple[int, int]]:
    """Cut a file into about ``parts`` byte ranges that each begin at a line start."""
    size = os.path.getsize(path)
    cuts = [0]
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(max(size * i // parts - 1, cuts[-1]))
            fh.readline()
            pos = fh.tell()
            if cuts[-1] < pos < size:
                cuts.append(pos)
    return list(zip(cuts, [*cuts[1:], size], strict=True))


def count_lines(path: str | os.PathLike[str], end: int) -> int:
    """Number of lines before byte ``end`` (to renumber errors found by a ranged reader)."""
    count, left = 0, end
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(left, 1 << 24))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count
