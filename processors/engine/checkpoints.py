"""A unit's checkpoint: its open parts at a position, as bytes a new owner restores in bulk
instead of replaying the unit's events (the transport keeps them in Kafka:
:mod:`rewardstream.processors.stream.changelog`).

A checkpoint is one JSON header line (format, version, unit, position, and per part what its
wire form does not carry: the run, its first offset, the held rollouts, the results left out,
when the run was last heard of) then, per part, its wire form with every ``sample`` row
(:func:`~rewardstream.processors.engine.partwire.encode_part`) and its content digests. Not
pickle: decoding runs no code, and every piece is checked before a part is held again.

The fold is deterministic, so the parts at a position are what a replay from the unit's
replay start would rebuild there, whoever wrote them: a new owner holds them again
(:meth:`~rewardstream.processors.engine.pipeline.Pipeline.restore`) and replays only what
follows the position.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from rewardstream.contract.events import content_sum
from rewardstream.errors import RewardstreamError
from rewardstream.processors.core.state import Section
from rewardstream.processors.engine.partwire import PartFormatError, decode_part, encode_part
from rewardstream.processors.engine.runs import HeldPart, Part, Unit

__all__ = [
    "FORMAT",
    "VERSION",
    "Checkpoint",
    "CheckpointError",
    "decode_unit",
    "encode_unit",
    "pieces",
]

FORMAT = "rewardstream.checkpoint"
VERSION = 1
_LENGTH = struct.Struct(">Q")


class CheckpointError(RewardstreamError):
    """A checkpoint this processor cannot hold again; the message says why, in one line (the
    unit is then replayed from its committed offset instead)."""


class Checkpoint(NamedTuple):
    """A decoded checkpoint: the unit's position and, per open run, when it was last heard
    of (ms since the epoch; None: never) and its part."""

    position: int
    parts: dict[str, tuple[int | None, HeldPart]]

    def built(self, unit: Unit) -> dict[str, Part]:
        """Its parts built for ``unit``, apart from it (:meth:`Unit.held`), to be attached by
        :meth:`Pipeline.restore`."""
        return unit.held({run_id: held for run_id, (_, held) in self.parts.items()})


def encode_unit(unit: Unit, seen: Mapping[str, int | None]) -> list[Section] | None:
    """The unit's open parts at its position (``seen``: per run, when it was last heard of, ms
    since the epoch) as buffers to send back to back: the part's own, not copies, so the unit
    must take no event until they are sent. None when a held rollout has no offset (in
    process: nothing to point at)."""
    heads: list[dict[str, Any]] = []
    bodies: list[Section] = []
    for run_id, part in unit.parts.items():
        if part.final is not None:
            continue
        if any(not isinstance(at, int) for at in part.unmatched.values()):
            return None
        size, body = encode_part(part, {"run": run_id, "unit": unit.name})
        digests = part.contents.digests.tobytes()  # a copy: a retirement replaces the array
        heads.append(
            {
                "run": run_id,
                "first_offset": part.first_offset,
                "foreign": part.foreign,
                "unmatched": [x for (t, r), at in part.unmatched.items() for x in (t, r, at)],
                "out": sorted(part.state.left_out()),
                "seen": seen.get(run_id),
                "bytes": size,
                "digests": len(digests),
            }
        )
        bodies += [*body, digests]
    head = {"format": FORMAT, "v": VERSION, "unit": unit.name, "position": unit.position}
    return [orjson.dumps(head | {"parts": heads}, option=orjson.OPT_APPEND_NEWLINE), *bodies]


def pieces(buffers: Sequence[Section], size: int) -> Iterator[bytes]:
    """``buffers`` back to back, in pieces of ``size`` bytes (the last one shorter), each a
    copy of at most ``size`` bytes: a checkpoint is sent without ever being joined whole."""
    out: list[memoryview] = []
    have = 0
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        while len(view):
            take = view[: size - have]
            out.append(take)
            have += len(take)
            view = view[len(take) :]
            if have == size:
                yield b"".join(out)
                out, have = [], 0
    if out:
        yield b"".join(out)


def decode_unit(data: bytes, unit: str) -> Checkpoint:
    """The checkpoint :func:`encode_unit` gave ``data`` of, for ``unit``; raises
    :class:`CheckpointError` unless every piece is there and consistent."""
    end = data.find(b"\n")
    try:
        head = orjson.loads(data[:end]) if end >= 0 else None
    except orjson.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CheckpointError(f"not a {FORMAT}: it starts {data[:40]!r}")
    if head.get("v") != VERSION:
        raise CheckpointError(f"checkpoint format v{head.get('v')} is not v{VERSION}")
    if head.get("unit") != unit or not _count(head.get("position")):
        raise CheckpointError(f"the checkpoint is of {head.get('unit')!r}, not {unit!r}")
    parts, at, whole = {}, end + 1, memoryview(data)
    metas = head.get("parts")
    for meta in metas if isinstance(metas, list) else [None]:
        try:
            run, held, at = _part(data, whole, at, meta, unit)
        except (PartFormatError, ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"a part of the checkpoint is unusable: {exc}") from None
        parts[run] = held
    if at != len(data):
        raise CheckpointError(f"the checkpoint has {len(data) - at} bytes past its parts")
    return Checkpoint(head["position"], parts)


def _part(
    data: bytes, whole: memoryview, at: int, meta: Any, unit: str
) -> tuple[str, tuple[int | None, HeldPart], int]:
    """One part's entry of the header and its bytes from ``at``; the offset after them."""
    if not isinstance(meta, dict):
        raise ValueError("its header entry is not an object")
    run, size, digests = meta["run"], meta["bytes"], meta["digests"]
    numbers = (size, digests, meta["first_offset"], meta["foreign"])
    if not isinstance(run, str) or not all(map(_count, numbers)) or digests % 8:
        raise ValueError("its header entry's run, sizes or counts are not what they must be")
    if at + size + digests > len(data):
        raise ValueError(f"it is truncated: {len(data) - at} bytes left of {size + digests}")
    received, after = decode_part(data, {"run": run, "unit": unit}, at)
    if after != at + size:
        raise ValueError(f"its wire form is {after - at} bytes, its header says {size}")
    codes = array("Q")
    codes.frombytes(whole[at + size : at + size + digests])
    flat, out, seen = meta["unmatched"], meta["out"], meta["seen"]
    if not (
        isinstance(flat, list)
        and len(flat) % 3 == 0
        and all(type(x) is int for x in flat)
        and isinstance(out, list)
        and all(type(x) is int for x in out)
        and (seen is None or type(seen) is int)
    ):
        raise ValueError("its held rollouts, left-out results or time are not integers")
    unmatched = {(t, r): o for t, r, o in zip(flat[::3], flat[1::3], flat[2::3], strict=True)}
    held = HeldPart(
        received.state,
        received.samples(),
        codes,
        meta["first_offset"],
        received.duplicates,
        received.conflicts,
        meta["foreign"],
        unmatched,
        out,
    )
    state = received.state
    rollouts = state.num_results - len(unmatched) - meta["foreign"]
    if content_sum(codes) != received.content or rollouts != received.rollouts:
        raise ValueError("its digests or held rollouts do not add up to its counts")
    if state.num_inputs != received.inputs:
        raise ValueError("its rows do not add up to its count")
    return run, (seen, held), at + size + digests


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0
