"""The wire contract of the streaming pipeline: every stage imports its events from here.

Three topics per prefix (``<prefix>.inputs``, ``<prefix>.rollouts``, ``<prefix>.control``) plus
``<prefix>.dead-letters`` for events that cannot be processed. Every message is keyed by its
task index (ASCII decimal), so all rollouts of a task meet in one partition; control events are
keyed by run id. Every event carries ``v`` (schema version) and ``run_id``, so several
collections can share the topics.

A rollout event carries the *slim* result (:func:`processors.records.slim_result`): every
top-level key in order, with only the values profiling reads, so the processor extracts exactly
what the batch profiler extracts from the full row while the full row stays in rollouts.jsonl.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "SCHEMA_VERSION",
    "ControlEvent",
    "InputEvent",
    "RolloutEvent",
    "RunFinished",
    "RunStarted",
    "Topics",
    "decode_control",
    "decode_input",
    "decode_rollout",
    "encode",
    "encode_input",
    "encode_rollout",
    "run_id_from",
    "task_key",
]

SCHEMA_VERSION: Literal[1] = 1


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


def run_id_from(text: str) -> str:
    """``text`` made into a valid run id (invalid characters become ``_``)."""
    return re.sub(r"[^\w.-]", "_", text).lstrip(".-") or "run"


def task_key(task: int) -> bytes:
    """Message key of everything about one task: its index in ASCII decimal."""
    return b"%d" % task


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    # a path component of the output folder: no separators, no leading dot
    run_id: str = Field(min_length=1, max_length=200, pattern=r"^\w[\w.-]*$")


class InputEvent(_Event):
    """One materialized input row; ``line`` is its 0-based line in the inputs file (its order)."""

    type: Literal["input"] = "input"
    line: int = Field(ge=0)
    row: dict[str, Any]


class RolloutEvent(_Event):
    """One completed rollout: its key, its agent (for live stats) and its slim result."""

    type: Literal["rollout"] = "rollout"
    task: int
    rollout: int
    agent: str | None = None
    result: dict[str, Any]
    published_at: float = Field(description="publisher's wall clock, seconds since the epoch")


class RunStarted(_Event):
    """A collection began: how many rollouts to expect and the rollouts file's stem."""

    type: Literal["run_started"] = "run_started"
    expected_rollouts: int = Field(ge=0)
    output_stem: str = Field(min_length=1, max_length=200, pattern=r"^[\w.-]+$")


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
    result: dict[str, Any],
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
            "result": result,
            "published_at": published_at,
        }
    )


# Decoding parses with orjson (not pydantic's parser) so numbers follow the batch reader's rules
# exactly (spec §0.2: NaN/Infinity rejected, ints beyond 64 bits become floats).


def decode_input(raw: bytes) -> InputEvent:
    return InputEvent.model_validate(orjson.loads(raw))


def decode_rollout(raw: bytes) -> RolloutEvent:
    return RolloutEvent.model_validate(orjson.loads(raw))


def decode_control(raw: bytes) -> RunStarted | RunFinished:
    return _CONTROL.validate_python(orjson.loads(raw))
