"""The wire contract of the streaming pipeline: every stage imports its events from here.

Three topics per prefix (``<prefix>.inputs``, ``<prefix>.rollouts``, ``<prefix>.control``) plus
``<prefix>.dead-letters`` for events that cannot be processed. Every message is keyed by its
task index (ASCII decimal), so all rollouts of a task meet in one partition; control events are
keyed by run id. Every event carries ``v`` (schema version) and ``run_id``, so several
collections can share the topics.

A rollout event carries the result's *record*, extracted by the producer with the profiler's own
:func:`rewardstream.processors.core.records.extract_result` (its numeric columns in order, their int
flags and values, its ``rollout_infos`` entry, its mask flag): extraction happens once, where the
full row is, and the processor only appends numbers. The full row stays in rollouts.jsonl.

Each event is defined once, as a msgspec struct (:class:`Input`, :class:`Rollout`,
:class:`RunStarted`, :class:`RunFinished`, :class:`AttemptFailed`, :class:`RowSkipped`) that is
at the same time its
schema (the rules are its field types; ``msgspec.json.schema(Rollout)`` writes them as JSON
Schema), the type the processor applies, and what :func:`encode` writes. Decoding is on the
processor's hot path: msgspec's compiled decoder parses and checks a rollout event in one pass,
and a slice of them goes into columns (:func:`decode_rollout_batch`) unless some event needs the
reference's judgement (:func:`decode_rollouts`, :func:`decode_rollout`).
JSON itself is read by the batch reader's rules (docs/nemo-gym-compat.md §Reading JSONL:
NaN/Infinity rejected, ints beyond 64 bits become floats): those are orjson's, so an event
msgspec rejects is parsed again by orjson, whose error (``not-json``, ``non-finite-number``)
comes first, and ``record.info``, which the record keeps as bytes, is checked and written
canonical by orjson. Encoding is orjson's too: its bytes are the producers' since schema 2
(msgspec writes ``1e16`` where orjson writes ``1e+16``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, TypeVar, cast, get_args

import msgspec
import orjson
import xxhash
from msgspec import Meta, Raw, Struct

from rewardstream.contract.names import (
    DEFAULT_TOPIC_PREFIX,
    MAX_NAME_BYTES,
    RUN_ID,
    STEM,
    check_topic_prefix,
    fits_a_name,
    run_id_from,
    valid_output_stem,
)
from rewardstream.errors import InputError, MissingKey
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.records import NO_ANSWER, ResultRecord
from rewardstream.processors.core.state import Shape
from rewardstream.processors.core.stopping import Reason, StopRule

__all__ = [
    "MAX_NAME_BYTES",
    "REJECT_REASONS",
    "SCHEMA_VERSION",
    "AttemptFailed",
    "BadEvent",
    "ControlEvent",
    "EarlyStop",
    "Event",
    "EventKind",
    "Input",
    "RejectReason",
    "Rollout",
    "RolloutBatch",
    "RolloutRecord",
    "RowSkipped",
    "RunFinished",
    "RunStarted",
    "Topics",
    "checked",
    "content_bytes",
    "content_digest",
    "content_digests",
    "content_hex",
    "content_sum",
    "decode_control",
    "decode_input",
    "decode_inputs",
    "decode_rollout",
    "decode_rollout_batch",
    "decode_rollouts",
    "encode",
    "encode_input",
    "encode_rollout",
    "encode_rollouts",
    "reject_reason",
    "run_id_from",
    "task_key",
    "valid_output_stem",
]

SCHEMA_VERSION: Literal[2] = 2  # 2: rollout events carry the extracted record


# What an event is, by the data topic it travels on (inputs, rollouts) or control.
EventKind = Literal["input", "rollout", "control"]


class Topics(NamedTuple):
    """Topic names for one prefix (several pipelines can share a broker)."""

    inputs: str
    rollouts: str
    control: str
    dead_letters: str

    @classmethod
    def for_prefix(cls, prefix: str = DEFAULT_TOPIC_PREFIX) -> Topics:
        """The topics of ``prefix``; an invalid prefix is an :class:`InputError`."""
        try:
            check_topic_prefix(prefix)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return cls(
            f"{prefix}.inputs", f"{prefix}.rollouts", f"{prefix}.control", f"{prefix}.dead-letters"
        )


def task_key(task: int) -> bytes:
    """Message key of everything about one task: its index in ASCII decimal."""
    return b"%d" % task


# Dead letters: why an event could not be used, as one of a fixed set of categories (the
# ``reason`` header and a metric label, so its cardinality stays bounded; the error text goes
# in the ``detail`` header).
RejectReason = Literal[
    "not-json",  # not a JSON document (truncated, invalid UTF-8, binary, ...)
    # NaN, Infinity, or a number beyond a double: not JSON (docs/nemo-gym-compat.md §Reading JSONL)
    "non-finite-number",
    "schema-version",  # a ``v`` other than SCHEMA_VERSION
    "missing-id",  # no run_id, task or rollout (or a row without its _ng_* indices)
    "invalid-event",  # any other violation of the event's schema (a wrong type, a bad run id)
    "unknown-run",  # run_finished for a run that never had a run_started
    "oversized",  # above the processor's --max-event-bytes (not parsed)
    "run-final",  # of a run whose final profile is written: it came too late to be in it
    "run-evicted",  # of a run evicted unfinished (no event for --evict-after seconds)
    "unknown-key",  # a rollout whose (task, rollout) is no materialized input row of its run
    "conflict",  # the key of an event folded already, with other content (see content_digest)
]
REJECT_REASONS: tuple[RejectReason, ...] = get_args(RejectReason)


class BadEvent(ValueError):
    """An event that breaks the contract: ``reason`` is its dead-letter category, ``field`` the
    path of the field at fault (``""``: the event as a whole), and ``str()`` one line naming it,
    in msgspec's words (``Expected `int`, got `str` - at `$.task```)."""

    def __init__(self, reason: RejectReason, message: str, field: str = "") -> None:
        self.reason, self.message, self.field = reason, message, field
        super().__init__(f"{message} - at `$.{field}`" if field else message)


# ------------------------------------------------------------------------------ field types

_Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # what the batch reader keeps as int
_Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Finite = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]  # no NaN, no inf
_RunId = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_NAME_BYTES,
        extra_json_schema={"pattern": RUN_ID},  # checked by _check_run_id (see _Event)
        description=f"names the run's output folder; at most {MAX_NAME_BYTES} bytes in UTF-8",
    ),
]
_Stem = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_NAME_BYTES,
        extra_json_schema={"pattern": STEM},  # checked by _check_name (see RunStarted)
        description=f"names the profile's files; at most {MAX_NAME_BYTES} bytes in UTF-8",
    ),
]
_JsonObject = Annotated[Raw, Meta(extra_json_schema={"type": "object"})]
_RUN_ID_RE, _STEM_RE = re.compile(RUN_ID), re.compile(STEM)
_known_run_ids: set[str] = set()  # checked already: a handful per processor
_new_tuple = tuple.__new__


def _check_name(field: str, name: str, pattern: re.Pattern[str]) -> None:
    """What a name must be (it names a folder or a file): its pattern, checked here rather than
    by msgspec, which would run the regex on every event (a run id is checked once, then
    remembered), and its UTF-8 length, which no schema states."""
    if pattern.fullmatch(name) is None:
        raise BadEvent("invalid-event", f"Expected `str` matching regex {pattern.pattern!r}", field)
    try:
        fits_a_name(name)
    except ValueError as exc:
        raise BadEvent("invalid-event", str(exc), field) from None


def _check_run_id(run_id: str) -> None:
    if run_id not in _known_run_ids:
        _check_name("run_id", run_id, _RUN_ID_RE)
        if len(_known_run_ids) >= 10_000:
            _known_run_ids.clear()
        _known_run_ids.add(run_id)


# ------------------------------------------------------------------------------------ events


class _Event(Struct, kw_only=True, forbid_unknown_fields=True):
    """What every event carries: ``v``, the schema version (:data:`SCHEMA_VERSION`), and
    ``run_id``, its collection (a run id names the run's output folder: ``^\\w[\\w.-]*$``, at
    most 200 bytes in UTF-8). Unknown fields are errors. A struct built in Python checks its
    names only; :func:`checked` checks the rest."""

    v: Literal[2] = SCHEMA_VERSION
    run_id: _RunId

    def __post_init__(self) -> None:
        if self.run_id not in _known_run_ids:
            _check_run_id(self.run_id)


class Input(_Event, kw_only=True):
    """One materialized input row (``type: "input"``).

    - ``line``: its 0-based line in the inputs file (its order);
    - ``row``: the row, a JSON object (checked by the processor as the batch profiler checks
      it: its ``_ng_task_index`` and ``_ng_rollout_index`` above all).
    """

    type: Literal["input"] = "input"
    line: _Count
    row: dict[str, Any]


class RolloutRecord(Struct, forbid_unknown_fields=True, gc=False):
    """A rollout's record on the wire:
    :class:`rewardstream.processors.core.records.ResultRecord`, field for field (decoding turns it
    into one).

    - ``names``: the result's numeric columns, in the row's order;
    - ``ints`` (``is_int``): per column, whether it is an int (or bool) in the row;
    - ``values``: per column, its value as a finite float (the three have the same length:
      :class:`Rollout` checks it);
    - ``info``: the result's ``rollout_infos`` entry, a JSON object (kept as its bytes, which
      decoding checks and writes as orjson writes them);
    - ``masked``: a truthy ``mask_sample``: not a measurement;
    - ``answer`` (absent: none): the identity of the value under the run's answer key
      (:func:`~rewardstream.processors.core.records.answer_id`), which majority@k votes on;
    - ``big`` (absent: none): ``[column, value]`` of each int column beyond 2**53, exact
      (its float in ``values`` is rounded).
    """

    names: tuple[str, ...]
    is_int: tuple[bool, ...] = msgspec.field(name="ints")
    values: tuple[_Finite, ...]
    info: _JsonObject
    masked: bool
    answer: _Int64 = NO_ANSWER
    big: tuple[tuple[_Count, _Int64], ...] = ()


class Rollout(_Event, kw_only=True, gc=False):
    """One completed rollout (``type: "rollout"``), as the processor applies it.

    - ``task``, ``rollout``: its key, 64-bit ints;
    - ``agent``: its agent's name, for live stats (null or absent: none);
    - ``record``: what profiling keeps of the result, a :class:`RolloutRecord` on the wire and a
      :class:`~rewardstream.processors.core.records.ResultRecord` once decoded (or built in Python);
    - ``published_at``: the publisher's clock, seconds since the epoch (a finite float).
    """

    type: Literal["rollout"] = "rollout"
    task: _Int64
    rollout: _Int64
    agent: str | None = None
    if TYPE_CHECKING:
        record: ResultRecord
    else:
        record: RolloutRecord
    published_at: _Finite

    def __post_init__(self) -> None:  # one call per event: the record's check is here too
        if self.run_id not in _known_run_ids:
            _check_run_id(self.run_id)
        rec: RolloutRecord | ResultRecord = self.record
        if type(rec) is RolloutRecord:  # decoded: ``info`` as sent, until the decoder checks it
            if not len(rec.names) == len(rec.is_int) == len(rec.values):
                message = "names, ints and values must have the same length"
                raise BadEvent("invalid-event", message, "record")
            if rec.big:
                _check_big(rec)
            fields = (rec.names, rec.is_int, rec.values, bytes(rec.info), rec.masked, rec.answer)
            self.record = _new_tuple(ResultRecord, (*fields, rec.big))  # ResultRecord(*...), faster


def _check_big(rec: RolloutRecord) -> None:
    """Each exact int names an int column whose float it rounds to (else a profile could write
    a max the values never had)."""
    for column, value in rec.big:
        if not (
            column < len(rec.values)
            and rec.is_int[column]
            and float(value) == rec.values[column]
            and abs(value) > 2**53
        ):
            raise BadEvent(
                "invalid-event", f"[{column}, {value}] is not an int column's", "record.big"
            )


class EarlyStop(Struct, kw_only=True, forbid_unknown_fields=True):
    """A run's opt-in early stop (docs/early-stop.md): stop an agent once its mean reward's
    interval at ``level`` is no wider than ``half_width`` each side, and/or skip a task's
    remaining repeats once its final mean's place relative to ``band`` is fixed; ``repeats``
    is the rollouts per task and agent of the full collection, ``reward_range`` the declared
    range of every reward. The processors publish what they decide on
    :func:`~rewardstream.contract.decisions.decisions_topic`."""

    repeats: Annotated[int, Meta(ge=1)]
    half_width: float | None = None
    band: tuple[float, float] | None = None
    level: float = DEFAULT_LEVEL
    reward_range: tuple[float, float] = (0.0, 1.0)

    def rule(self) -> StopRule:
        return StopRule(self.repeats, self.half_width, self.band, self.level, *self.reward_range)

    def __post_init__(self) -> None:
        if (problem := self.rule().problem()) is not None:
            raise ValueError(problem)


class RunStarted(_Event, kw_only=True):
    """A collection began (``type: "run_started"``).

    - ``expected_rollouts``: how many rollouts to expect (its input rows);
    - ``output_stem``: the rollouts file's stem, which names the profile's files
      (``^[\\w.-]+$``, at most 200 bytes in UTF-8);
    - ``aggregate_metrics``: its snapshots and final also carry ``_aggregate_metrics.json``
      (pass@k and friends), ``_task_difficulty.json`` and ``_intervals.json``;
    - ``answer_key``: the result field its rollout records carry answers of (majority@k);
    - ``early_stop``: the run may end early on the processors' decisions (:class:`EarlyStop`).
    """

    type: Literal["run_started"] = "run_started"
    expected_rollouts: _Count
    output_stem: _Stem
    aggregate_metrics: bool = False
    answer_key: str | None = None
    early_stop: EarlyStop | None = None

    def __post_init__(self) -> None:
        _check_run_id(self.run_id)
        _check_name("output_stem", self.output_stem, _STEM_RE)


class RunFinished(_Event, kw_only=True):
    """The collection ended, complete or not (``type: "run_finished"``): the processor writes
    the final profile. ``skipped``: the rows an early stop left out, per reason (none: absent),
    which the final carries as why the run ended early."""

    type: Literal["run_finished"] = "run_finished"
    skipped: dict[Reason, _Count] | None = None


class AttemptFailed(_Event, kw_only=True):
    """An attempt at a rollout failed (``type: "attempt_failed"``): the collector's
    ``_failures.jsonl`` row, or a result it writes nowhere (``_ng_no_persist``, class
    ``no_persist``), counted live (the failure rate), never a result.

    - ``task``, ``rollout``: the row's key; ``attempt``: its 0-based attempt index (a
      redelivered event, same key and attempt, counts once);
    - ``agent``: its agent's name (null or absent: none);
    - ``failure_class``: ``agent_request_failed`` (no reply) or ``agent_run_error`` (an error
      reply), or another word; ``terminal``: no attempt of the row follows in this collection
      (a terminal failure, its last attempt, a failure result or a result written nowhere),
      so it will have no result and the live sequences go on past it (docs/intervals.md).
    """

    type: Literal["attempt_failed"] = "attempt_failed"
    task: _Int64
    rollout: _Int64
    attempt: _Count = 0
    agent: str | None = None
    failure_class: Annotated[str, Meta(pattern=r"^\w{1,64}$")]
    terminal: bool = False


class RowSkipped(_Event, kw_only=True):
    """A row an early stop left out (``type: "row_skipped"``): never dispatched, it will have
    no result, so the live sequences in dispatch order go on past it (docs/intervals.md); the
    collector's ``_skipped.jsonl`` line. A row in flight when its task was decided is not one:
    its result counts wherever its latency puts it.

    - ``task``, ``rollout``: the row's key; ``agent``: its agent's name (null: none);
    - ``reason``: the decision that covered it (docs/early-stop.md).
    """

    type: Literal["row_skipped"] = "row_skipped"
    task: _Int64
    rollout: _Int64
    agent: str | None = None
    reason: Reason


Event = Input | Rollout | RunStarted | RunFinished | AttemptFailed | RowSkipped
ControlEvent = RunStarted | RunFinished | AttemptFailed | RowSkipped
_E = TypeVar("_E", Input, Rollout, RunStarted, RunFinished, AttemptFailed, RowSkipped)
_CONTROL: dict[object, type[ControlEvent]] = {
    "run_started": RunStarted,
    "run_finished": RunFinished,
    "attempt_failed": AttemptFailed,
    "row_skipped": RowSkipped,
}
_ID_FIELDS: dict[type[_Event], tuple[str, ...]] = {
    Input: ("run_id",),
    Rollout: ("run_id", "task", "rollout"),
    RunStarted: ("run_id",),
    RunFinished: ("run_id",),
    AttemptFailed: ("run_id", "task", "rollout"),
    RowSkipped: ("run_id", "task", "rollout"),
}
assert RolloutRecord.__struct_fields__ == ResultRecord._fields  # field for field

# -------------------------------------------------------------------------------- encoding


def encode(event: Event) -> bytes:
    """Compact JSON bytes of an event, its fields in order, as orjson writes them (a
    ``RunStarted`` without aggregates is written without their fields, as before them)."""
    fields = _asdict(event)
    if type(event) is RunStarted:
        fields = {k: v for k, v in fields.items() if _STARTED_DEFAULTS.get(k, _KEEP) != v}
    elif type(event) is RunFinished and event.skipped is None:
        del fields["skipped"]
    return orjson.dumps(fields, default=_wire)


_STARTED_DEFAULTS = {"aggregate_metrics": False, "answer_key": None, "early_stop": None}
_KEEP = object()


_asdict = msgspec.structs.asdict


_NAMES, _INTS, _VALUES, _INFO, _MASKED, _ANSWER, _BIG = RolloutRecord.__struct_encode_fields__


def _wire(value: object) -> dict[str, Any]:
    """What orjson does not write itself: a rollout's record, as its :class:`RolloutRecord`
    (without ``answer`` when there is none: the events of a run without an answer key are
    what they were before answers existed)."""
    if type(value) is ResultRecord:
        names, is_int, values, info, masked, answer, big = value
        raw = orjson.Fragment(info)  # already serialized by extract_result
        wire = {_NAMES: names, _INTS: is_int, _VALUES: values, _INFO: raw, _MASKED: masked}
        if answer != NO_ANSWER:
            wire[_ANSWER] = answer
        if big:
            wire[_BIG] = big
        return wire
    if type(value) is EarlyStop:
        return _asdict(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


# The producers' encoders, one call per line: ``encode`` of the event built from the arguments.


def encode_input(run_id: str, line: int, row: dict[str, Any]) -> bytes:
    """``encode(Input(...))``'s bytes: its head joined to the row's own dump (orjson writes a
    nested dict as it writes it alone; ``tests/test_contract.py`` checks it), the run id
    checked as ``Input`` checks it."""
    if run_id not in _known_run_ids:
        _check_run_id(run_id)
    head = b'{"v":%d,"run_id":%s,"type":"input","line":%d,"row":'
    row_json = orjson.dumps(row, default=_wire)
    return b"".join((head % (SCHEMA_VERSION, orjson.dumps(run_id), line), row_json, b"}"))


def encode_rollout(
    run_id: str,
    task: int,
    rollout: int,
    agent: str | None,
    record: ResultRecord,
    published_at: float,
) -> bytes:
    event = Rollout(
        run_id=run_id,
        task=task,
        rollout=rollout,
        agent=agent,
        record=record,
        published_at=published_at,
    )
    return orjson.dumps(_asdict(event), default=_wire)  # encode(event), inlined: once per line


def encode_rollouts(
    run_id: str,
    tasks: Sequence[int],
    rollouts: Sequence[int],
    agents: Sequence[str | None],
    shapes: Sequence[Shape],
    masked: Sequence[bool],
    answers: Sequence[int],
    values: Sequence[Any],
    infos: Sequence[bytes],
    published_at: float,
) -> list[bytes]:
    """:func:`encode_rollout`'s bytes for records given as columns (as ``ProfileState.
    add_columns`` takes them; ints as exact as floats, no ``big``), one ``published_at`` for
    all. The bytes around the values are joined from per-shape pieces, and every row's values
    come from one ``orjson.dumps`` (numbers only: ``],[`` splits them);
    ``tests/test_publish_lean.py`` checks them against :func:`encode_rollout`'s."""
    dumps = orjson.dumps
    head = b'{"v":%d,"run_id":%s,"type":"rollout","task":' % (SCHEMA_VERSION, dumps(run_id))
    tail = b'},"published_at":' + dumps(published_at) + b"}"
    rows: list[tuple[float, ...]] = []
    at = 0
    for names, _ in shapes:
        end = at + len(names)
        rows.append(tuple(map(float, values[at:end])))
        at = end
    if at != len(values):
        raise ValueError("values do not match the shapes' columns")
    dumped = dumps(rows)[2:-2].split(b"],[") if rows else []
    middles: dict[tuple[int, str | None], bytes] = {}
    out: list[bytes] = []
    for task, rollout, agent, shape, mask, answer, row, info in zip(
        tasks, rollouts, agents, shapes, masked, answers, dumped, infos, strict=True
    ):
        middle = middles.get((id(shape), agent))
        if middle is None:
            names, is_int = shape
            middle = middles[id(shape), agent] = b"".join(
                (
                    b',"agent":',
                    dumps(agent),
                    b',"record":{"names":',
                    dumps(names),
                    b',"ints":',
                    dumps(is_int),
                    b',"values":[',
                )
            )
        out.append(
            b"".join(
                (
                    head,
                    b'%d,"rollout":%d' % (task, rollout),
                    middle,
                    row,
                    b'],"info":',
                    info,
                    b',"masked":true' if mask else b',"masked":false',
                    b"" if answer == NO_ANSWER else b',"answer":%d' % answer,
                    tail,
                )
            )
        )
    return out


# -------------------------------------------------------------------------------- decoding

_ROLLOUT = msgspec.json.Decoder(Rollout)
_AT = re.compile(r"(.*) - at `\$\.?(.*)`", re.DOTALL)


def decode_input(raw: bytes) -> Input:
    """Raises ``ValueError`` for a bad event (:class:`BadEvent`, or orjson's error when it is
    not JSON)."""
    event = orjson.loads(raw)
    try:
        return msgspec.convert(event, Input)
    except msgspec.ValidationError as exc:
        raise _bad(event, Input, exc) from None


def decode_inputs(raws: Sequence[bytes]) -> list[Input] | None:
    """Every one of ``raws`` decoded as :func:`decode_input` decodes it, in one parse and one
    conversion for the batch (the processor's batch path), or None when any of them needs
    :func:`decode_input` (an invalid event). A parse that gives as many values as there are
    events gives one per event: no event is empty, so none can give two."""
    try:
        events = orjson.loads(b"[%b]" % b",".join(raws))
        return msgspec.convert(events, list[Input]) if len(events) == len(raws) else None
    except (ValueError, msgspec.ValidationError):  # orjson's JSONDecodeError is a ValueError
        return None


def decode_control(raw: bytes) -> ControlEvent:
    """Raises ``ValueError`` for a bad event, as :func:`decode_input` does."""
    event = orjson.loads(raw)
    kind = event.get("type") if type(event) is dict else None
    cls = _CONTROL.get(kind) if type(kind) is str else None
    if cls is None:
        expected = "`" + "` or `".join(map(str, _CONTROL)) + "`"
        message = f"Expected a control event, `type` {expected}"
        raise BadEvent("invalid-event", message, "type" if type(event) is dict else "")
    try:
        return msgspec.convert(event, cls)
    except msgspec.ValidationError as exc:
        raise _bad(event, cls, exc) from None


def decode_rollout(raw: bytes) -> Rollout:
    """Raises ``ValueError`` for a bad event, as :func:`decode_input` does."""
    try:
        event = _ROLLOUT.decode(raw)
    except (ValueError, RecursionError) as exc:  # msgspec's errors, UnicodeDecodeError
        event = _decode_parsed(raw, exc)
    rec = event.record
    try:
        info = orjson.loads(rec.info)
        canonical = orjson.dumps(info)  # whatever the publisher's spacing
    except orjson.JSONDecodeError:
        orjson.loads(raw)  # the event's own error (a non-finite number, invalid UTF-8, ...)
        raise
    except (orjson.JSONEncodeError, RecursionError) as exc:  # nested deeper than orjson writes
        message = f"cannot be written back as JSON: {exc}"
        raise BadEvent("invalid-event", message, "record.info") from None
    if type(info) is not dict:
        message = f"Expected `object`, got `{type(info).__name__}`"
        raise BadEvent("invalid-event", message, "record.info")
    if canonical != rec.info:
        event.record = rec._replace(info=canonical)
    return event


def _decode_parsed(raw: bytes, error: Exception) -> Rollout:
    """A rollout event msgspec's decoder rejected (with ``error``), decoded from what orjson
    reads: its error when the event is not JSON by the batch reader's rules, the event when
    orjson reads it as msgspec does not (a key given twice: the last one counts), the schema's
    error otherwise."""
    event = orjson.loads(raw)
    try:
        parsed = orjson.dumps(event)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: invalid, as msgspec said
        raise _bad(event, Rollout, error) from None
    try:
        return _ROLLOUT.decode(parsed)
    except (ValueError, RecursionError) as exc:
        raise _bad(event, Rollout, exc) from None


def _bad(event: object, cls: type[_Event], exc: Exception) -> BadEvent:
    """The error of a parsed ``event`` that is not a valid ``cls``: a wrong ``v`` first, then a
    missing id, then what the decoder said."""
    if type(event) is dict:
        v = event.get("v", SCHEMA_VERSION)
        if type(v) is not int or v != SCHEMA_VERSION:
            message = f"Expected schema version {SCHEMA_VERSION}, got {v!r}"
            return BadEvent("schema-version", message, "v")
        for field in _ID_FIELDS[cls]:
            if field not in event:
                return BadEvent("missing-id", f"Object missing required field `{field}`")
    if isinstance(exc, BadEvent):
        return exc
    # one line: a key named "\n" is written as \n
    text = _CONTROL_CHARS.sub(lambda m: repr(m.group())[1:-1], str(exc))
    at = _AT.fullmatch(text)
    return BadEvent("invalid-event", *at.groups()) if at else BadEvent("invalid-event", text)


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def decode_rollouts(raws: Sequence[bytes]) -> list[Rollout] | None:
    """Every one of ``raws`` decoded (the processor's batch path), or None when any of them
    needs :func:`decode_rollout` (an invalid event, a ``record.info`` not written as orjson
    writes it).

    The ``info`` entries of the batch are checked in one orjson round trip: when the joined raw
    entries equal their re-encoding, each entry is already canonical and is kept as sent.
    """
    try:
        events = [_ROLLOUT.decode(raw) for raw in raws]
        joined = b"[%b]" % b",".join([event.record.info for event in events])
        infos = orjson.loads(joined)
        if orjson.dumps(infos) != joined:
            return None
    except (ValueError, orjson.JSONEncodeError, RecursionError):  # UnicodeDecodeError too
        return None
    if len(infos) != len(events) or not all(type(info) is dict for info in infos):
        return None
    return events


# The fast path: a batch of rollout events decoded into columns, exactly as decode_rollouts
# decodes it or not at all (None: the caller takes the reference path above). The checks
# Rollout.__post_init__ makes per event are made per batch, and the record's names and ints,
# which repeat from one event to the next, are decoded once per distinct spelling.


class _LeanRecord(Struct, forbid_unknown_fields=True, gc=False):
    """:class:`RolloutRecord` with ``names`` and ``ints`` kept as sent (see _shape)."""

    names: Raw
    ints: Raw
    values: tuple[_Finite, ...]
    info: Raw
    masked: bool
    answer: _Int64 = NO_ANSWER
    big: tuple[tuple[_Count, _Int64], ...] = ()


class _LeanRollout(Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
    """:class:`Rollout`'s fields and types, without its per-event ``__post_init__``."""

    v: Literal[2] = SCHEMA_VERSION
    run_id: _RunId
    type: Literal["rollout"] = "rollout"
    task: _Int64
    rollout: _Int64
    agent: str | None = None
    record: _LeanRecord
    published_at: _Finite


assert _LeanRollout.__struct_encode_fields__ == Rollout.__struct_encode_fields__
assert _LeanRecord.__struct_encode_fields__ == RolloutRecord.__struct_encode_fields__

_LEAN = msgspec.json.Decoder(_LeanRollout)
_NAMES_TYPE = msgspec.json.Decoder(tuple[str, ...])
_INTS_TYPE = msgspec.json.Decoder(tuple[bool, ...])
_shapes: dict[tuple[bytes, bytes], Shape] = {}  # a few per processor: bounded below


class RolloutBatch(NamedTuple):
    """Rollout events of one run, decoded by :func:`decode_rollout_batch`, column by column:
    row ``i`` of the columns is what :func:`decode_rollouts` gives as ``events[i]``, its record
    ``ResultRecord(*shapes[i], values[i], infos[i], masked[i], answers[i])`` (no exact ints).
    Events of one shape share its objects."""

    run_id: str
    tasks: list[int]
    rollouts: list[int]
    agents: list[str | None]
    published_at: list[float]
    shapes: list[Shape]
    values: list[tuple[float, ...]]
    infos: list[bytes]
    masked: list[bool]
    answers: list[int]


def _shape(names: Raw, ints: Raw) -> Shape:
    """A record's ``names`` and ``ints``, decoded once per spelling (the same bytes decode to
    the same values; msgspec skips a Raw without checking its UTF-8, decoding checks it)."""
    key = (bytes(names), bytes(ints))
    shape = _shapes.get(key)
    if shape is None:
        shape = (_NAMES_TYPE.decode(key[0]), _INTS_TYPE.decode(key[1]))
        if len(_shapes) >= 1_000:
            _shapes.clear()
        _shapes[key] = shape
    return shape


def _objects_as_orjson_writes_them(infos: list[bytes]) -> bool:
    """Each of ``infos`` (one JSON value each: msgspec's Raw) is an object that orjson reads
    and writes back byte for byte, in one round trip for all; raises orjson's errors."""
    joined = b"[%b]" % b",".join(infos)
    parsed = orjson.loads(joined)
    if orjson.dumps(parsed) != joined or len(parsed) != len(infos):
        return False
    return all([type(info) is dict for info in parsed])


def decode_rollout_batch(raws: Sequence[bytes]) -> RolloutBatch | None:
    """``raws`` decoded as :func:`decode_rollouts` decodes them, in columns, when every event
    is of one run, has no exact ints (``big``) and is valid with its ``info`` written as
    orjson writes it; otherwise None, for :func:`decode_rollouts` to decide (it accepts
    more). Never accepts what it rejects: tests/test_fast_decode.py."""
    if not raws:
        return None
    try:
        events = [_LEAN.decode(raw) for raw in raws]
        run_id = events[0].run_id
        if any([event.run_id != run_id for event in events]):
            return None
        _check_run_id(run_id)
        recs = [event.record for event in events]
        if any([rec.big for rec in recs]):
            return None
        first = recs[0]
        names0, ints0 = first.names, first.ints
        shape0 = _shape(names0, ints0)
        shapes = [
            shape0 if rec.names == names0 and rec.ints == ints0 else _shape(rec.names, rec.ints)
            for rec in recs
        ]
        infos = [bytes(rec.info) for rec in recs]
        if not _objects_as_orjson_writes_them(infos):
            return None
    except (ValueError, orjson.JSONEncodeError, RecursionError):  # BadEvent, UnicodeDecodeError
        return None
    if not all([len(n) == len(i) == len(r.values) for (n, i), r in zip(shapes, recs, strict=True)]):
        return None
    return RolloutBatch(
        run_id,
        [event.task for event in events],
        [event.rollout for event in events],
        [event.agent for event in events],
        [event.published_at for event in events],
        shapes,
        [rec.values for rec in recs],
        infos,
        [rec.masked for rec in recs],
        [rec.answer for rec in recs],
    )


_DECODERS: dict[type[_Event], Callable[[bytes], _Event]] = {
    Input: decode_input,
    Rollout: decode_rollout,
    RunStarted: decode_control,
    RunFinished: decode_control,
    AttemptFailed: decode_control,
    RowSkipped: decode_control,
}


def checked(event: _E) -> _E:
    """``event`` as a processor would decode it, or :class:`BadEvent` (a struct built in Python
    is not checked: only the UTF-8 length of its names is)."""
    return cast(_E, _DECODERS[type(event)](encode(event)))


# ---------------------------------------------------------------------------- content identity

_PACK = msgspec.msgpack.Encoder()
_DIGEST_MASK = (1 << 64) - 1


def content_bytes(event: Input | Rollout) -> bytes:
    """What an event says of its key, packed (msgpack): a rollout's key, agent and record, an
    input's line and row (never ``published_at`` or ``run_id``). Call it on a *decoded* event
    (``record.info`` canonical)."""
    if type(event) is Rollout:
        fields: tuple[object, ...] = ("r", event.task, event.rollout, event.agent, event.record)
    else:
        fields = ("i", event.line, event.row)  # type: ignore[union-attr]
    return _PACK.encode(fields)


def content_digest(event: Input | Rollout) -> int:
    """A 64-bit digest (XXH3) of :func:`content_bytes`, the same on every host and version of
    this schema. Same key and same digest is a duplicate; same key and another digest is a
    conflict."""
    return xxhash.xxh3_64_intdigest(content_bytes(event))


def content_digests(batch: RolloutBatch) -> list[int]:
    """:func:`content_digest` of each rollout of a batch, from its columns, its record packed
    as the tuple of its fields. MessagePack concatenates: the record's first two fields, packed
    once per shape, go in as one raw item, so the outer array holds 10 items, not 5 (its
    one-byte header is set back to 5 items: the bytes are then :func:`content_bytes`'s)."""
    buf, digests, last, head = bytearray(), [], None, Raw(b"")
    encode, digest = _PACK.encode_into, xxhash.xxh3_64_intdigest
    columns = (batch.tasks, batch.rollouts, batch.agents, batch.shapes, batch.values)
    for task, rollout, agent, shape, values, info, masked, answer in zip(
        *columns, batch.infos, batch.masked, batch.answers, strict=True
    ):
        if shape is not last:
            last, head = shape, Raw(_RECORD_HEAD + _PACK.encode(shape)[1:])
        encode(("r", task, rollout, agent, head, values, info, masked, answer, ()), buf)
        buf[0] = _CONTENT_HEAD
        digests.append(digest(buf))
    return digests


_RECORD_HEAD, _CONTENT_HEAD = b"\x97", 0x95  # MessagePack arrays of 7 and 5 items


def content_sum(digests: Iterable[int]) -> int:
    """The digests of distinct keys summed modulo 2**64: a run's content, whatever the order
    or the partitions its events came through (parts add up; final records carry it)."""
    return sum(digests) & _DIGEST_MASK


def content_hex(content: int) -> str:
    """A run's content (:func:`content_sum`) as a final record carries it: 16 hex digits."""
    return f"{content:016x}"


def reject_reason(exc: Exception) -> RejectReason:
    """The dead-letter category of an error raised while decoding or applying an event."""
    if isinstance(exc, orjson.JSONDecodeError):
        rest = exc.doc[exc.pos : exc.pos + 8] if isinstance(exc.doc, str) else ""
        if exc.msg.startswith("number is infinity") or rest.startswith(("NaN", "Infinity")):
            return "non-finite-number"
        return "not-json"
    if isinstance(exc, BadEvent):
        return exc.reason
    if isinstance(exc, MissingKey):
        return "missing-id"
    return "invalid-event"
