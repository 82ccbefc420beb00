"""What stream processors tell each other through Kafka: the engine's own wire records.

The producers' events (:mod:`rewardstream.contract.events`) are the data; these records are the
state that lets processors on separate hosts, sharing nothing but Kafka, act as one:

- ``<prefix>.members`` (compacted, keyed by member id): each processor's *member record*, its
  consumer-group generation, the URL where it serves its parts, and per unit (topic-partition)
  it owns the next offset to consume and the inputs and rollouts it holds of each run. The
  leader knows from them when a run is complete; any processor knows whom to ask for a part.
- ``<prefix>.finals`` (compacted, keyed by ``<group>/<run_id>``): a run's terminal record,
  ``final`` (its profile is in ``<prefix>.profiles``) or ``evicted`` (it never finished). It is
  written in one Kafka transaction with the profile's chunks, so it is there exactly once, and
  carries per unit the offset the profile covers (its *cut*): a processor that replays the
  unit after a restart skips the run's events before the cut and parks those after it.
- ``<prefix>.profiles`` (compacted, keyed by ``<group>/<run_id>/<file>/<chunk>``): the final
  files, in zlib-compressed chunks of at most :data:`CHUNK_BYTES`.
- ``<prefix>.checkpoints`` (compacted, old records deleted after a week, keyed by
  ``<group>/<unit>/<id>/<chunk>``): a unit's open parts at a position
  (:mod:`rewardstream.processors.engine.checkpoints`), in chunks of at most
  :data:`CHUNK_BYTES`; the commit of the unit's offset names the one to restore
  (:mod:`rewardstream.processors.stream.changelog`).

Every record names its format, version, prefix and group. A processor refuses, with one clear
line, a record of a format or version it does not read, or one whose prefix is not its own;
records of other groups in the same topics are simply not its business.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from rewardstream.contract.events import Topics
from rewardstream.contract.names import RUN_ID, STEM, fits_a_name
from rewardstream.errors import RewardstreamError
from rewardstream.processors.core.sequence import LadderFields
from rewardstream.processors.core.stopping import Reason

__all__ = [
    "CHUNK_BYTES",
    "ENGINE_VERSION",
    "AgentProgress",
    "AgentSpread",
    "EngineTopics",
    "FileRef",
    "FinalRecord",
    "ForeignState",
    "MemberRecord",
    "UnitFinal",
    "UnitProgress",
    "decode_final",
    "decode_member",
    "encode_record",
    "final_key",
]

ENGINE_VERSION: Literal[1] = 1
RunId = Annotated[
    str, Field(min_length=1, max_length=200, pattern=RUN_ID), AfterValidator(fits_a_name)
]
OutputStem = Annotated[
    str, Field(min_length=1, max_length=200, pattern=STEM), AfterValidator(fits_a_name)
]
CHUNK_BYTES = 512 << 10  # a profile chunk before compression: below Kafka's 1 MiB message limit


class ForeignState(RewardstreamError):
    """A record this processor must not load: another format, version or prefix."""


class EngineTopics(BaseModel):
    """The engine's topics of one prefix."""

    model_config = ConfigDict(frozen=True)

    members: str
    finals: str
    profiles: str
    checkpoints: str

    @classmethod
    def of(cls, topics: Topics) -> EngineTopics:
        prefix = topics.control.removesuffix(".control")
        return cls(
            members=f"{prefix}.members",
            finals=f"{prefix}.finals",
            profiles=f"{prefix}.profiles",
            checkpoints=f"{prefix}.checkpoints",
        )


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = ENGINE_VERSION
    prefix: StrictStr
    group: StrictStr


class AgentProgress(BaseModel):
    """One agent's live figures in one unit's part of a run, for the whole-run view any
    processor shows (:mod:`rewardstream.processors.engine.live`): ``reward`` is [count, mean, sum of
    squared deviations, min, max] (None where not finite), ``tasks`` [tasks, single, scored,
    zero variance], ``histogram`` the per-task mean reward counts per bin then below and
    above, ``passes`` per k [sum of pass@k, tasks with k rollouts or more], ``tokens`` per
    output-token bin [rollouts, sum of their rewards], ``tally`` the reward's confidence-sequence
    sums [range low, range high, count, total, variance process, rewards outside the range]
    (:class:`~rewardstream.processors.core.confseq.Tally`; None from an older processor), and
    ``sequence`` the same sequence folded in dispatch order, for a cut at one key across parts
    (:class:`~rewardstream.processors.core.sequence.Ladder`: [frontier, floor, base [n, total,
    spread], keys, totals, spreads, outside, repeat-major, epoch]; None from an older
    processor)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollouts: int
    reward: tuple[int, float | None, float | None, float | None, float | None] | None
    tasks: tuple[int, int, int, int]
    histogram: Annotated[list[int], Field(min_length=12, max_length=12)]
    passes: dict[str, tuple[float, int]]
    tokens: dict[str, tuple[int, float]] = {}
    tally: tuple[float, float, int, float, float, int] | None = None
    sequence: LadderFields | None = None


class AgentSpread(BaseModel):
    """What only the whole run has of one agent's tasks, which a final record carries beside
    its :class:`AgentProgress` (a member record's parts cannot: these do not add up over
    parts): ``all_max``/``all_min``, tasks whose rollouts all equal the agent's highest /
    lowest reward, and the per-task mean reward as Prometheus histogram buckets: ``mean_le``
    per edge of :data:`rewardstream.processors.core.difficulty.EDGES` the tasks whose mean is at
    most it, then every task, and ``mean_sum`` the means' sum (None where not finite)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    all_max: int
    all_min: int
    mean_le: Annotated[list[int], Field(min_length=12, max_length=12)]
    mean_sum: float | None


class UnitProgress(BaseModel):
    """One owned unit: the next offset to consume, per run [inputs, rollouts] held and events
    dropped as seen before (an older record has no third figure), and per run and agent the
    live figures of its part."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    position: Annotated[int, Field(ge=0)]
    runs: dict[str, tuple[int, int, int] | tuple[int, int]]
    live: dict[str, dict[str, AgentProgress]] = {}


class MemberRecord(_Record):
    """A processor's claim on its units, renewed while it runs (see the module docstring)."""

    format: Literal["rewardstream.member"] = "rewardstream.member"
    member: StrictStr
    generation: StrictInt
    url: StrictStr | None
    units: dict[str, UnitProgress]
    at: float


class UnitFinal(BaseModel):
    """What a final profile holds of one unit, and the offset it covers the unit to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: int
    rollouts: int
    duplicates: int
    tasks: int
    cut: int


class FileRef(BaseModel):
    """One profile file in ``<prefix>.profiles``: its name, size, digest and chunk count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr
    size: int
    sha256: StrictStr
    chunks: int


class FinalRecord(_Record):
    """A run's terminal record (see the module docstring)."""

    format: Literal["rewardstream.final"] = "rewardstream.final"
    run_id: RunId
    state: Literal["final", "evicted"]
    stem: OutputStem
    partial: bool
    inputs: int
    rollouts: int
    expected: int | None
    units: dict[str, UnitFinal]
    files: list[FileRef] = []
    chunks_from: int = 0  # offset of the first chunk in <prefix>.profiles (partition 0)
    agents: dict[str, AgentProgress] = {}  # per agent the whole run's figures (a final's)
    spread: dict[str, AgentSpread] = {}  # and what only the whole run has (none: an older record)
    # what it holds: its keys' content digests summed (rewardstream.contract.events.content_sum), as
    # 16 hex digits, so a publisher can tell whether it is the profile of its files (None: not
    # a final's, or written before content digests); and the conflicts its parts parked
    content: Annotated[str, Field(pattern="^[0-9a-f]{16}$")] | None = None
    conflicts: int = 0
    # the rows an early stop left out, per reason, as the collector's run_finished said (None:
    # it did not end early, or an older record): the final is partial, and this says why
    skipped: dict[Reason, Annotated[int, Field(ge=0)]] | None = None
    written_by: StrictStr
    at: float


_R = TypeVar("_R", "MemberRecord", "FinalRecord")


def final_key(group: str, run_id: str) -> bytes:
    return f"{group}/{run_id}".encode()


def encode_record(record: _Record) -> bytes:
    return orjson.dumps(record.model_dump())


def _decode(raw: bytes, model: type[_R], what: str, prefix: str) -> _R:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ForeignState(f"a {what} record that is not JSON") from None
    if not isinstance(data, dict) or data.get("format") != model.model_fields["format"].default:
        raise ForeignState(f"a {what} record of an unknown format: {str(data)[:120]}")
    if data.get("v") != ENGINE_VERSION:
        raise ForeignState(
            f"a {what} record of format version {data.get('v')!r}, which this processor "
            f"(version {ENGINE_VERSION}) does not read; run one rewardstream version per group"
        )
    if data.get("prefix") != prefix:
        raise ForeignState(
            f"a {what} record of topic prefix {data.get('prefix')!r} in topic prefix "
            f"{prefix!r}'s topics; refusing to load it"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ForeignState(
            f"a malformed {what} record: {' '.join(str(exc).split())[:300]}"
        ) from None


def decode_member(raw: bytes, prefix: str) -> MemberRecord:
    return _decode(raw, MemberRecord, "member", prefix)


def decode_final(raw: bytes, prefix: str) -> FinalRecord:
    return _decode(raw, FinalRecord, "final", prefix)
