"""Lean decoding: a line's bytes into only what the profile reads of it, or a refusal.

The reference reads a line with ``orjson.loads`` (the whole value) and its rules
(:mod:`rewardstream.processors.core.records`, ``state.row_key``/``row_names``). Most of a line
is text the profile never reads (the prompt, the response's output), so decoding it is most of
the reference's time. Here msgspec decodes a rollouts line into an ordered dict of its
top-level values whose objects keep only ``usage``, and an inputs line into its key and
names, skipping the rest. msgspec validates what it skips less than orjson does (invalid UTF-8
and numbers beyond a double pass, ``_core.c``'s ``json_skip_string`` and
``json_maybe_skip_number``): :func:`suspects` finds every line that may hold one, and those,
like every line msgspec refuses, are the reference's to read. A refusal is never an error:
the reference owns every message.

Why not a typed Struct per row shape (faster): it loses key order, unknown keys, int versus
float and some key names, all of which the profile's bytes depend on (issue 28's plan, 2.1).
"""

from __future__ import annotations

import codecs
from typing import Annotated, Any, TypeAlias

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta, Raw, Struct

__all__ = ["InputKey", "Obj", "Skipped", "decode_input", "decode_result", "suspects"]

_Exact = Annotated[int, Meta(ge=-(2**53), le=2**53)]
"""Ints exact as floats. Beyond: orjson gives a float past 2**64 where msgspec gives an int,
and a column int past 2**53 needs the reference's exact ``big``: both refused here."""

_Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class Skipped(Struct, gc=False):
    """An object inside ``usage`` (``input_tokens_details``): never read, only skipped."""


_UsageValue: TypeAlias = _Exact | float | bool | str | Skipped | list[Raw] | None


class Obj(Struct, gc=False):
    """A top-level object: only its ``usage`` (the response's) and ``name`` (the agent's, in
    ``agent_ref``) are kept; None when absent."""

    usage: dict[str, _UsageValue] | _Exact | float | bool | str | list[Raw] | None = None
    name: _UsageValue = None


_TopValue: TypeAlias = _Exact | float | bool | str | Obj | list[Raw] | None

_RESULT = msgspec.json.Decoder(dict[str, _TopValue])


class _Agent(Struct, gc=False):
    name: str | None = None


class _InputRow(Struct, gc=False):
    """What the state reads of a materialized row: key order and other fields are not read,
    and a Struct's repeated field takes its last value, as orjson's dict does."""

    task: _Int64 = msgspec.field(name="_ng_task_index")
    rollout: _Int64 = msgspec.field(name="_ng_rollout_index")
    agent_ref: _Agent | None = None
    server: str | None = msgspec.field(default=None, name="_ng_environment_server")


_INPUT = msgspec.json.Decoder(_InputRow)

InputKey: TypeAlias = tuple[int, int, str | None, str | None]
"""An inputs line's (task, rollout, agent, environment server)."""


def decode_result(line: bytes | memoryview) -> dict[str, Any] | None:
    """A rollouts line as its ordered top-level values (objects as :class:`Obj`, lists as
    ``Raw`` items), or None when msgspec refuses it. Only for lines :func:`suspects` passed."""
    try:
        return _RESULT.decode(line)
    except (ValueError, RecursionError):  # DecodeError is a ValueError
        return None


def decode_input(line: bytes | memoryview) -> InputKey | None:
    """An inputs line's key and names, or None when msgspec refuses it (the reference then
    gives the error, or reads a row this decoder cannot)."""
    try:
        row = _INPUT.decode(line)
    except (ValueError, RecursionError):
        return None
    agent = row.agent_ref.name if row.agent_ref is not None else None
    return row.task, row.rollout, agent, row.server


_DIGITS = 129
"""A number overflows a double only with a 3+ digit exponent or 210+ integer digits (an
exponent of at most 99 needs 10**308 from the digits: 309 - 99 = 210); runs from 129 digits
are flagged, a margin that costs nothing (such runs are rare in any text)."""
_DEPTH = 1000
"""Lines with this many ``[`` and ``{`` may nest as deeply as orjson refuses (1024), and
msgspec's guard is the recursion limit, which a caller may raise (hypothesis does)."""


def _utf8(span: npt.NDArray[np.uint8]) -> bool:
    """Whether the bytes are UTF-8 as orjson reads it (Python's strict decoder agrees on
    every sequence tried: overlong forms, surrogates, beyond U+10FFFF, truncated ones)."""
    try:
        codecs.utf_8_decode(span.tobytes(), "strict", True)
    except UnicodeDecodeError:
        return False
    return True


def suspects(
    buffer: npt.NDArray[np.uint8], starts: npt.NDArray[np.intp], ends: npt.NDArray[np.intp]
) -> set[int]:
    """Indices of the lines (``buffer[starts[i]:ends[i]]``) that may hold what msgspec skips
    and orjson refuses: invalid UTF-8 (checked exactly by Python's strict decoder), a number
    beyond a double (a superset: every ``e``/``E``, maybe then ``+``, then 3+ digits, and every
    run of :data:`_DIGITS` digits), or nesting too deep (a superset: :data:`_DEPTH` brackets,
    in strings too). A few passes over the bytes, then work on the few positions found."""
    if not len(starts):
        return set()
    found: set[int] = set()
    wide = np.flatnonzero(np.maximum.reduceat(buffer, starts) >= 0x80).tolist()
    if wide and not _utf8(buffer[starts[wide[0]] : ends[wide[-1]]]):
        # one of the lines is not UTF-8 (no sequence spans a newline): which ones
        found.update(i for i in wide if not _utf8(buffer[starts[i] : ends[i]]))
    places: list[npt.NDArray[np.intp]] = []
    openers = np.flatnonzero((buffer | 32) == 123)  # [ and {
    if len(openers) >= _DEPTH:
        lines = np.searchsorted(starts, openers, side="right") - 1
        places.append(starts[np.bincount(lines, minlength=len(starts)) >= _DEPTH])
    digits = np.flatnonzero((buffer - 48) < 10)  # uint8: below '0' wraps around
    if len(digits) >= 3:
        first = digits[:-2][(digits[2:] - digits[:-2]) == 2]  # where 3 digits in a row start
        before = buffer[first - 1] | 32
        plus = (buffer[first - 1] == 43) & ((buffer[np.maximum(first - 2, 0)] | 32) == 101)
        places.append(first[((before == 101) | plus) & (first > 0)])
    if len(digits) >= _DIGITS:
        head = digits[: 1 - _DIGITS]
        places.append(head[(digits[_DIGITS - 1 :] - head) == _DIGITS - 1])
    at = np.concatenate(places) if places else np.empty(0, np.intp)
    if len(at):
        found.update((np.searchsorted(starts, at, side="right") - 1).tolist())
    return found
