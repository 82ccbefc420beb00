"""The wire form of a part: how processors hand each other their parts over HTTP.

A part is one JSON header line (format, version, byte order, the sender's identity fields, the
part's counts and its state's header, :meth:`ProfileState.export_columns`) then raw sections:
the state's typed columns and ``rollout_infos`` entries and, for an input part, its ``sample``
rows as spilled (a row's locator is its offset there). Not pickle: decoding runs no code the
sender chose, and a peer on another rewardstream version is refused in one line rather than
unpickled into classes that have changed. Columns are in the sender's byte order, which the
header names (every processor of a deployment shares it; a mismatch is refused, not swapped).
"""

from __future__ import annotations

import mmap
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from rewardstream.errors import RewardstreamError
from rewardstream.processors.core.profile import sampled_rows
from rewardstream.processors.core.state import InfoBytes, ProfileState, Section
from rewardstream.processors.engine.runs import Part

__all__ = [
    "FORMAT",
    "PART_LIST_TYPE",
    "VERSION",
    "PartFormatError",
    "ReceivedPart",
    "decode_answer",
    "decode_part",
    "decode_parts",
    "encode_answer",
    "encode_part",
    "encode_parts",
]

FORMAT = "rewardstream.part"
VERSION = 4  # 2: answer identities (res_answer); 3: exact ints beyond 2**53 (big_*); 4: content
PART_LIST_TYPE = "application/vnd.rewardstream.parts.v1"
"""A processor's answer to a part request (``GET /parts/<run_id>``): one JSON line,
``{"units": {unit: position}}`` for every unit it owns (a unit with no part of the run still
says how far it is consumed), then the parts as :func:`encode_parts` writes them, each with its
``unit`` in its identity (:func:`encode_answer`, :func:`decode_answer`)."""

_LENGTH = struct.Struct(">Q")  # before each part of a several-part body
_COUNTS = ("inputs", "rollouts", "duplicates", "conflicts", "content")
_STATE_KEYS = ("names", "schemas", "counts", "sections")  # the state's header
_RESERVED = frozenset(("format", "v", "byteorder", *_COUNTS, *_STATE_KEYS))


class PartFormatError(RewardstreamError):
    """Received bytes are not a part this processor can merge; the message says why, in one
    line (an HTTP error body, or a log line of the processor that asked)."""


def _chunks(
    part: Part, identity: Mapping[str, str | int], sampled: npt.NDArray[np.bool_] | None = None
) -> tuple[int, list[Section]]:
    """The part's wire form as buffers to join (the live ones: join before the part grows),
    and its length. ``sampled``: the rows whose ``sample`` is sent (default: all); the
    others' locators point past the samples, where reading one fails instead of reading
    another row."""
    clash = _RESERVED.intersection(identity)
    if clash:
        raise ValueError(f"identity fields {sorted(clash)} are names the part header uses")
    state, spill = part.state, part.spill
    header, sections = state.export_columns(part.taken_infos())
    samples: Section = spill.view(spill.size) if spill is not None and state.num_inputs else b""
    if sampled is not None and not sampled.all():
        at = [name for name, _, _ in header["sections"]].index("in_locator")
        sections[at], samples = _only_sampled(state.column(state.in_locator), samples, sampled)
    header["sections"].append(["samples", "B", len(samples)])
    counts = {name: getattr(part, name) for name in _COUNTS}
    first = {"format": FORMAT, "v": VERSION, "byteorder": sys.byteorder, **identity, **counts}
    line = orjson.dumps(first | header, option=orjson.OPT_APPEND_NEWLINE)
    size = len(line) + sum(nbytes for _, _, nbytes in header["sections"])
    return size, [line, *sections, samples]


def _only_sampled(
    locators: npt.NDArray[np.int64], samples: Section, sampled: npt.NDArray[np.bool_]
) -> tuple[array[int], bytes]:
    """The sampled rows' lines, back to back, and every row's locator into them (the
    others': the end, where reading fails)."""
    data = samples if isinstance(samples, bytes | mmap.mmap) else bytes(samples)
    rows = np.flatnonzero(sampled)
    lines = [data[at : data.find(b"\n", at) + 1] for at in locators[rows].tolist()]
    lengths = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))
    moved = np.full(len(locators), int(lengths.sum()), dtype=np.int64)
    moved[rows] = np.cumsum(lengths) - lengths
    return array("q", moved.tobytes()), b"".join(lines)


def encode_parts(parts: Sequence[tuple[Part, Mapping[str, str | int]]]) -> bytes:
    """Several parts in one body (a processor answers for all the units it owns at once),
    each after its length as 8 bytes big-endian, as one bytes object: a copy, so the owner's
    arrays may grow right after (a view of them would make their next ``extend`` raise
    ``BufferError``). Each part's ``identity`` (run, unit, group...) goes into its header,
    where the receiver checks the fields it expects (:func:`decode_parts`). An input part
    sends only the ``sample`` rows that a profile can still read given the results of these
    parts (:func:`rewardstream.processors.core.profile.sampled_rows`)."""
    return b"".join(_body(parts))


def encode_part(part: Part, identity: Mapping[str, str | int]) -> tuple[int, list[Section]]:
    """One whole part as :func:`encode_parts` frames it, every ``sample`` row kept (a
    checkpoint's: rows out of reach now may be a profile's sample once more results come):
    its length and its buffers, the live ones (send them before the part takes an event)."""
    size, chunks = _chunks(part, identity)
    return _LENGTH.size + size, [_LENGTH.pack(size), *chunks]


def _body(parts: Sequence[tuple[Part, Mapping[str, str | int]]]) -> list[Section]:
    """:func:`encode_parts`'s buffers, to join with anything before them in one copy."""
    results = [part.state for part, _ in parts if part.state.num_results]
    body: list[Section] = []
    for part, identity in parts:
        sampled = sampled_rows(part.state, results) if part.state.num_inputs else None
        size, chunks = _chunks(part, identity, sampled)
        body += [_LENGTH.pack(size), *chunks]
    return body


class ReceivedPart:
    """A part decoded from a peer's answer: a
    :class:`rewardstream.processors.engine.runs.PartView`, so
    :func:`rewardstream.processors.engine.runs.merge_parts` takes it with local parts.

    Its ``sample`` rows and ``rollout_infos`` entries stay where they arrived (read in place:
    the buffer is immutable bytes, so holding slices of it blocks nothing). ``header`` is the
    sender's header without the state's own fields: identity fields and counts.
    """

    def __init__(
        self, header: dict[str, Any], state: ProfileState, data: bytes, samples: tuple[int, int]
    ) -> None:
        self.header, self.state = header, state
        self._data, self._samples = data, samples

    @property
    def inputs(self) -> int:
        return int(self.header["inputs"])

    @property
    def rollouts(self) -> int:
        return int(self.header["rollouts"])

    @property
    def duplicates(self) -> int:
        return int(self.header["duplicates"])

    @property
    def conflicts(self) -> int:
        return int(self.header["conflicts"])

    @property
    def content(self) -> int:
        return int(self.header["content"])

    def taken_infos(self) -> InfoBytes:
        return b""  # the state holds every entry (ProfileState.from_columns)

    def samples(self) -> memoryview:
        """The ``sample`` rows as sent, back to back: a row's locator is its offset here."""
        lo, hi = self._samples
        return memoryview(self._data)[lo:hi]

    def sample_reader(self) -> Callable[[int], bytes] | None:
        """The reader of the part's ``sample`` rows by locator, as :meth:`Part.sample_reader`."""
        if not self.state.num_inputs:
            return None
        data, (lo, hi) = self._data, self._samples

        def line(locator: int) -> bytes:
            begin = lo + locator
            if begin >= hi:  # a row the sender judged no profile reads: a bug, not a sample
                raise PartFormatError(f"the part sent no sample row for locator {locator}")
            end = data.find(b"\n", begin, hi)
            return data[begin : end if end >= 0 else hi]

        return line


def decode_parts(data: bytes, expect: Mapping[str, str | int], at: int = 0) -> list[ReceivedPart]:
    """The parts :func:`encode_parts` gave ``data`` (from offset ``at``: no copy of a large
    answer's tail) of. Raises :class:`PartFormatError` unless each is this format and
    version, in this byte order, consistent, and its header has every field of ``expect`` as
    given (a part for another run, unit or group is refused)."""
    parts: list[ReceivedPart] = []
    while at < len(data):
        part, at = decode_part(data, expect, at, len(parts))
        parts.append(part)
    return parts


def decode_part(
    data: bytes, expect: Mapping[str, str | int], at: int, number: int = 0
) -> tuple[ReceivedPart, int]:
    """The part at offset ``at`` of ``data`` (part ``number`` of a body, for the message) as
    :func:`decode_parts` decodes each, and the offset after it."""
    start = at + _LENGTH.size
    size = _LENGTH.unpack_from(data, at)[0] if start <= len(data) else None
    if size is None or start + size > len(data):
        raise PartFormatError(f"the parts are truncated: part {number} has {len(data) - at} bytes")
    return _decode(data, start, start + size, expect), start + size


def _decode(data: bytes, start: int, end: int, expect: Mapping[str, str | int]) -> ReceivedPart:
    header = _header(data, start, end, expect)
    table = header.get("sections")
    if not (
        isinstance(table, list)
        and all(
            isinstance(s, list)
            and len(s) == 3
            and isinstance(s[0], str)
            and isinstance(s[1], str)
            and type(s[2]) is int
            and s[2] >= 0
            for s in table
        )
    ):
        raise PartFormatError("the part's section table is not a list of [name, typecode, bytes]")
    at = data.index(b"\n", start, end) + 1
    need = sum(nbytes for _, _, nbytes in table)
    if need != end - at:
        what = "truncated" if need > end - at else "oversized"
        raise PartFormatError(
            f"the part is {what}: its sections hold {need} bytes, {end - at} came"
        )
    spans, views, whole = {}, {}, memoryview(data)
    for name, typecode, nbytes in table:
        spans[name] = (at, at + nbytes)
        try:
            views[name] = whole[at : at + nbytes].cast(typecode)
        except (TypeError, ValueError):
            raise PartFormatError(
                f"the part's {name!r} section is not whole {typecode!r} values"
            ) from None
        at += nbytes
    if len(spans) != len(table) or "samples" not in spans:
        raise PartFormatError("the part's sections repeat, or it has no samples section")
    try:
        state = ProfileState.from_columns(header, views)
    except ValueError as exc:
        raise PartFormatError(f"the part's state is unusable: {exc}") from None
    lo, hi = spans["samples"]
    locators = state.column(state.in_locator)
    if len(locators) and not 0 <= locators.min() <= locators.max() <= hi - lo:
        raise PartFormatError("the part's state is unusable: a row's locator is past its samples")
    kept = {k: v for k, v in header.items() if k not in _STATE_KEYS}
    return ReceivedPart(kept, state, data, (lo, hi))


def _header(data: bytes, start: int, end: int, expect: Mapping[str, str | int]) -> dict[str, Any]:
    """The first line, checked for format, version, byte order, counts and identity."""
    newline = data.find(b"\n", start, end)
    try:
        header = orjson.loads(memoryview(data)[start:newline]) if newline >= 0 else None
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        shown = bytes(data[start : min(end, start + 40)])
        raise PartFormatError(f"not a {FORMAT} body: it starts {shown!r}")
    if header.get("v") != VERSION:
        raise PartFormatError(
            f"part format v{header.get('v')} is not one this processor reads (v{VERSION}); "
            "run the same rewardstream version on every processor"
        )
    if header.get("byteorder") != sys.byteorder:
        raise PartFormatError(
            f"the part's columns are {header.get('byteorder')}-endian, this processor's are "
            f"{sys.byteorder}-endian"
        )
    for key, want in expect.items():
        if key not in header:
            raise PartFormatError(f"the part names no {key}, this processor's {key} is {want!r}")
        if header[key] != want:
            raise PartFormatError(
                f"the part is for {key} {header[key]!r}, this processor's {key} is {want!r}"
            )
    for key in _COUNTS:
        if type(header.get(key)) is not int or header[key] < 0:
            raise PartFormatError(f"the part's header has no {key} count")
    return header


def encode_answer(
    positions: Mapping[str, int], parts: Iterable[tuple[str, Part, Mapping[str, str | int]]]
) -> bytes:
    """A processor's answer (:data:`PART_LIST_TYPE`): the positions of its units, then its
    parts, each identified by its unit; one copy of everything (the parts can be ~100 MB)."""
    head = orjson.dumps({"units": dict(positions)}, option=orjson.OPT_APPEND_NEWLINE)
    body = _body([(part, {**identity, "unit": unit}) for unit, part, identity in parts])
    return b"".join([head, *body])


def decode_answer(
    data: bytes, expect: Mapping[str, str | int]
) -> tuple[dict[str, int], dict[str, ReceivedPart]]:
    """The positions and the parts (by unit) of an :func:`encode_answer` body."""
    end = data.find(b"\n")
    try:
        head = orjson.loads(data[:end]) if end >= 0 else None
    except orjson.JSONDecodeError:
        head = None
    units = head.get("units") if isinstance(head, dict) else None
    if not isinstance(units, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in units.items()
    ):
        raise PartFormatError(f"not a {FORMAT} answer: it starts {data[:40]!r}")
    parts = decode_parts(data, expect, end + 1)
    return units, {str(p.header["unit"]): p for p in parts}
