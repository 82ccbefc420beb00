"""JSONL reading with NeMo Gym's rules (spec §0.2) and one-line errors naming file and line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InputError

__all__ = ["JsonLine", "check_input_file", "iter_jsonl", "parse_line"]

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


def parse_line(raw: bytes, path: str | os.PathLike[str], lineno: int) -> Any:
    """Parse one line; a blank line is an error (NeMo Gym rejects it too)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if not raw:
        raise InputError(f"Malformed JSON in '{path}' at line {lineno}: {_EMPTY_MESSAGE}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"Malformed JSON in '{path}' at line {lineno}: {exc}") from None


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[JsonLine]:
    """Yield every line of a JSONL file with its byte offset; the file is streamed, never held."""
    offset = 0
    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                yield JsonLine(lineno, offset, parse_line(raw, path, lineno))
                offset += len(raw)
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None
