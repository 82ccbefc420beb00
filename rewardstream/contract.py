"""The wire contract of the streaming pipeline: every stage imports its events from here.

Three topics per prefix (``<prefix>.inputs``, ``<prefix>.rollouts``, ``<prefix>.control``) plus
``<prefix>.dead-letters`` for events that cannot be processed. Every message is keyed by its
task index (ASCII decimal), so all rollouts of a task meet in one partition; control events are
keyed by run id. Every event carries ``v`` (schema version) and ``run_id``, so several
collections can share the topics.

A rollout event carries the result's *record*, extracted by the producer with the profiler's
own :func:`processors.records.extract_result` (its numeric columns in order, their int flags
and values, its ``rollout_infos`` entry, its mask flag): extraction happens once, where the
full row is, and the processor only appends numbers. The full row stays in rollouts.jsonl.

Decoding is on the processor's hot path: :func:`decode_rollout` parses and checks an event with
msgspec's compiled decoder (a couple of microseconds) and falls back to the pydantic model, which
states the schema and words the errors, for anything the fast path does not accept; the two
agree (tests/test_contract.py).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NamedTuple, Self, get_args

import msgspec
import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from processors.records import ResultRecord
from rewardstream.errors import MissingKey
from rewardstream.names import (
    MAX_NAME_BYTES,
    RUN_ID,
    STEM,
    fits_a_name,
    run_id_from,
    valid_output_stem,
)

__all__ = [
    "MAX_NAME_BYTES",
    "REJECT_REASONS",
    "SCHEMA_VERSION",
    "ControlEvent",
    "Input",
    "InputEvent",
    "RejectReason",
    "Rollout",
    "RolloutEvent",
    "RolloutRecord",
    "RunFinished",
    "RunStarted",
    "Topics",
    "decode_control",
    "decode_input",
    "decode_rollout",
    "decode_rollouts",
    "encode",
    "encode_input",
    "encode_rollout",
    "reject_reason",
    "run_id_from",
    "task_key",
    "valid_output_stem",
]

SCHEMA_VERSION: Literal[2] = 2  # 2: rollout events carry the extracted record
RunId = Annotated[
    str, Field(min_length=1, max_length=200, pattern=RUN_ID), AfterValidator(fits_a_name)
]
OutputStem = Annotated[
    str, Field(min_length=1, max_length=200, pattern=STEM), AfterValidator(fits_a_name)
]


class Topics(NamedTuple):
    """Topic names for one prefix (several pipelines can share a broker)."""

    inputs: str
    rollouts: str
    control: str
    dead_letters: str

    @classmethod
    def for_prefix(cls, prefix: str = "rewardstream") -> Topics:
        return cls(
            f"{prefix}.inputs", f"{prefix}.rollouts", f"{prefix}.control", f"{prefix}.dead-letters"
        )


def task_key(task: int) -> bytes:
    """Message key of everything about one task: its index in ASCII decimal."""
    return b"%d" % task


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[2] = SCHEMA_VERSION
    run_id: RunId


class InputEvent(_Event):
    """One materialized input row; ``line`` is its 0-based line in the inputs file (its order)."""

    type: Literal["input"] = "input"
    line: int = Field(ge=0)
    row: dict[str, Any]


class RolloutRecord(BaseModel):
    """What profiling keeps of one result (:class:`processors.records.ResultRecord`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    names: list[StrictStr] = Field(description="numeric columns, in the row's order")
    ints: list[StrictBool] = Field(description="per column: an int (or bool) in the row")
    values: list[StrictFloat] = Field(description="per column: its value as a float")
    info: dict[str, Any] = Field(description="the result's rollout_infos entry")
    masked: StrictBool = Field(description="a truthy mask_sample: not a measurement")

    @model_validator(mode="after")
    def _columns_align(self) -> Self:
        if not len(self.names) == len(self.ints) == len(self.values):
            raise ValueError("names, ints and values must have the same length")
        return self


class RolloutEvent(_Event):
    """One completed rollout: its key, its agent (for live stats) and its record."""

    type: Literal["rollout"] = "rollout"
    task: StrictInt = Field(ge=-(2**63), le=2**63 - 1)
    rollout: StrictInt = Field(ge=-(2**63), le=2**63 - 1)
    agent: StrictStr | None = None
    record: RolloutRecord
    published_at: StrictFloat = Field(description="publisher's clock, seconds since the epoch")


class Rollout(NamedTuple):
    """A decoded rollout event, as the processor applies it."""

    run_id: str
    task: int
    rollout: int
    agent: str | None
    record: ResultRecord
    published_at: float


class RunStarted(_Event):
    """A collection began: how many rollouts to expect and the rollouts file's stem."""

    type: Literal["run_started"] = "run_started"
    expected_rollouts: int = Field(ge=0)
    output_stem: OutputStem


class RunFinished(_Event):
    """The collection ended (complete or not): the processor writes the final profile."""

    type: Literal["run_finished"] = "run_finished"


ControlEvent = Annotated[RunStarted | RunFinished, Field(discriminator="type")]
_CONTROL: TypeAdapter[RunStarted | RunFinished] = TypeAdapter(ControlEvent)


def encode(event: _Event) -> bytes:
    """Compact JSON bytes of an event."""
    return orjson.dumps(event.model_dump())


# The two hot-path encoders: the same bytes as ``encode(InputEvent(...))`` and
# ``encode(RolloutEvent(...))`` (tests/test_contract.py), without building a model per event,
# which costs more than parsing the line. Callers validate ``run_id`` once with the models.


def encode_input(run_id: str, line: int, row: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {"v": SCHEMA_VERSION, "run_id": run_id, "type": "input", "line": line, "row": row}
    )


def encode_rollout(
    run_id: str,
    task: int,
    rollout: int,
    agent: str | None,
    record: ResultRecord,
    published_at: float,
) -> bytes:
    return orjson.dumps(
        {
            "v": SCHEMA_VERSION,
            "run_id": run_id,
            "type": "rollout",
            "task": task,
            "rollout": rollout,
            "agent": agent,
            "record": {
                "names": record.names,
                "ints": record.is_int,
                "values": record.values,
                "info": orjson.Fragment(record.info),  # already serialized by extract_result
                "masked": record.masked,
            },
            "published_at": published_at,
        }
    )


# Decoding parses with orjson (not pydantic's parser) so numbers follow the batch reader's rules
# exactly (spec §0.2: NaN/Infinity rejected, ints beyond 64 bits become floats).


class Input(NamedTuple):
    """A decoded input event, as the processor applies it."""

    run_id: str
    line: int
    row: dict[str, Any]


def decode_input(raw: bytes) -> Input:
    """Raises ``ValueError`` (pydantic's ``ValidationError`` included) for a bad event."""
    d = orjson.loads(raw)
    if (
        type(d) is dict
        and d.keys() == _INPUT_KEYS
        and type(d["v"]) is int
        and d["v"] == SCHEMA_VERSION
        and d["type"] == "input"
        and type(d["line"]) is int
        and d["line"] >= 0
        and type(d["row"]) is dict
        and _valid_run_id(d["run_id"])
    ):
        return Input(d["run_id"], d["line"], d["row"])
    event = InputEvent.model_validate(d)
    return Input(event.run_id, event.line, event.row)


def decode_rollout(raw: bytes) -> Rollout:
    """Raises ``ValueError`` (pydantic's ``ValidationError`` included) for a bad event."""
    fast = _rollout_fast(raw)
    return fast if fast is not None else rollout_of(RolloutEvent.model_validate(orjson.loads(raw)))


def rollout_of(event: RolloutEvent) -> Rollout:
    """The processor's form of a validated event."""
    rec = event.record
    try:
        info = orjson.dumps(rec.info)
    except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
        raise ValueError(f"record.info cannot be written back as JSON: {exc}") from None
    record = ResultRecord(
        tuple(rec.names), tuple(rec.ints), tuple(map(float, rec.values)), info, rec.masked
    )
    at = float(event.published_at)
    return Rollout(event.run_id, event.task, event.rollout, event.agent, record, at)


_INPUT_KEYS = frozenset(InputEvent.model_fields)
_RUN_ID_RE = re.compile(RUN_ID)
_known_run_ids: set[str] = set()  # checked already; a handful per processor


def _valid_run_id(run_id: Any) -> bool:
    """What the models' ``run_id`` field accepts (remembered: a handful per processor)."""
    if type(run_id) is not str:
        return False
    if run_id not in _known_run_ids:
        if not 0 < len(run_id) <= 200 or not _RUN_ID_RE.fullmatch(run_id):
            return False
        if len(run_id.encode()) > MAX_NAME_BYTES:
            return False
        if len(_known_run_ids) > 10_000:
            _known_run_ids.clear()
        _known_run_ids.add(run_id)
    return True


# The rollout event's shape for msgspec's compiled decoder, which parses and type-checks an
# event in one pass (half the cost of orjson plus Python checks: BENCHMARKS.md). It accepts a
# subset of what the model accepts; anything else goes to the model. ``info`` stays raw here
# and is parsed by orjson, whose number and UTF-8 rules are the batch reader's (msgspec does not
# check what it leaves raw).
_FINITE = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _RecordWire(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    names: tuple[str, ...]
    ints: tuple[bool, ...]
    values: tuple[_FINITE, ...]
    info: msgspec.Raw
    masked: bool


class _RolloutWire(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    v: Literal[2]
    run_id: str
    type: Literal["rollout"]
    task: _INT64
    rollout: _INT64
    agent: str | None
    record: _RecordWire
    published_at: _FINITE


_ROLLOUT_WIRE = msgspec.json.Decoder(_RolloutWire)


def _rollout_fast(raw: bytes) -> Rollout | None:
    """The event if the compiled decoder and a few checks accept it; None otherwise (the model
    then decides, and words the error)."""
    try:
        event = _ROLLOUT_WIRE.decode(raw)
        info = orjson.loads(memoryview(event.record.info))
        if type(info) is not dict:
            return None
        encoded = orjson.dumps(info)  # the canonical form, whatever the publisher's spacing
    except (ValueError, orjson.JSONEncodeError, RecursionError):  # UnicodeDecodeError too
        return None
    return _rollout(event, encoded)


def _rollout(event: _RolloutWire, info: bytes) -> Rollout | None:
    """The processor's form of a decoded event whose ``info`` is canonical, or None when the
    checks msgspec cannot state fail."""
    rec = event.record
    if not _valid_run_id(event.run_id) or not len(rec.names) == len(rec.ints) == len(rec.values):
        return None
    record = ResultRecord(rec.names, rec.ints, rec.values, info, rec.masked)
    return Rollout(event.run_id, event.task, event.rollout, event.agent, record, event.published_at)


def decode_rollouts(raws: Sequence[bytes]) -> list[Rollout] | None:
    """Every one of ``raws`` decoded (the processor's batch path), or None when any of them
    needs :func:`decode_rollout` (an invalid event, a ``record.info`` not written as orjson
    writes it).

    The ``info`` entries of the batch are checked in one orjson round trip: when the joined raw
    entries equal their re-encoding, each entry is already canonical and is kept as sent.
    """
    try:
        events = [_ROLLOUT_WIRE.decode(raw) for raw in raws]
        infos = [event.record.info for event in events]
        joined = b"[%b]" % b",".join(infos)
        parsed = orjson.loads(joined)
        if orjson.dumps(parsed) != joined or not all(type(info) is dict for info in parsed):
            return None
    except (ValueError, orjson.JSONEncodeError, RecursionError):  # UnicodeDecodeError too
        return None
    out = []
    for event, info in zip(events, infos, strict=True):
        rollout = _rollout(event, bytes(info))
        if rollout is None:
            return None
        out.append(rollout)
    return out


def decode_control(raw: bytes) -> RunStarted | RunFinished:
    return _CONTROL.validate_python(orjson.loads(raw))


# Dead letters: why an event could not be used, as one of a fixed set of categories (the
# ``reason`` header and a metric label, so its cardinality stays bounded; the error text goes
# in the ``detail`` header).
RejectReason = Literal[
    "not-json",  # not a JSON document (truncated, invalid UTF-8, binary, ...)
    "non-finite-number",  # NaN, Infinity, or a number beyond a double: not JSON (spec 0.2)
    "schema-version",  # a ``v`` other than SCHEMA_VERSION
    "missing-id",  # no run_id, task or rollout (or a row without its _ng_* indices)
    "invalid-event",  # any other violation of the event's schema (a wrong type, a bad run id)
    "unknown-run",  # run_finished for a run that never had a run_started
    "oversized",  # above the processor's --max-event-bytes (not parsed)
]
REJECT_REASONS: tuple[RejectReason, ...] = get_args(RejectReason)
_ID_FIELDS = frozenset({("run_id",), ("task",), ("rollout",)})
_CONTROL_TYPES = frozenset(get_args(RunStarted.model_fields["type"].annotation))
_CONTROL_TYPES |= frozenset(get_args(RunFinished.model_fields["type"].annotation))


def reject_reason(exc: Exception) -> RejectReason:
    """The dead-letter category of an error raised while decoding or applying an event."""
    if isinstance(exc, orjson.JSONDecodeError):
        rest = exc.doc[exc.pos : exc.pos + 8] if isinstance(exc.doc, str) else ""
        if exc.msg.startswith("number is infinity") or rest.startswith(("NaN", "Infinity")):
            return "non-finite-number"
        return "not-json"
    if isinstance(exc, MissingKey):
        return "missing-id"
    if isinstance(exc, ValidationError):
        errors = exc.errors()
        fields = []
        for err in errors:
            loc = tuple(err["loc"])
            fields.append((err["type"], loc[1:] if loc[:1] and loc[0] in _CONTROL_TYPES else loc))
        if any(loc == ("v",) for _, loc in fields):
            return "schema-version"
        if any(kind == "missing" and loc in _ID_FIELDS for kind, loc in fields):
            return "missing-id"
    return "invalid-event"
