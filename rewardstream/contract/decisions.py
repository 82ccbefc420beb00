"""Early-stop decisions: what the processors tell a collector it need not collect.

A run whose ``RunStarted`` carries :class:`~rewardstream.contract.events.EarlyStop` may end
early. The processors apply its rules (:mod:`rewardstream.processors.core.stopping`) to what
they hold and publish each decision once on ``<prefix>.decisions`` (one partition, keyed by run
id, so a collector reads a run's decisions in the order they were made); the collector skips
the rows they cover and lists them in its ``_skipped.jsonl`` sidecar. A decision names the
processors' consumer group, so a collector follows the group it waits on and ignores others.
A decision repeated (a processor restarted, or a peer took over the task) is harmless: the
first one for a key counts.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from rewardstream.contract.events import Topics
from rewardstream.processors.core.stopping import Reason, Verdict

__all__ = ["Decision", "decisions_topic", "decode_decision", "encode_decision"]


def decisions_topic(topics: Topics) -> str:
    """``<prefix>.decisions`` of the prefix of ``topics``."""
    return topics.control.removesuffix(".control") + ".decisions"


class Decision(Struct, kw_only=True, forbid_unknown_fields=True):
    """One decision of the processors of ``group`` about run ``run_id``: stop collecting
    ``agent`` (``task`` null: its interval is narrow enough) or skip the rest of ``task`` for
    ``agent`` (its place relative to the band is fixed), decided after ``rollouts`` of them."""

    v: Literal[1] = 1
    type: Literal["decision"] = "decision"
    group: str
    run_id: str
    agent: str
    task: Annotated[int, Meta(ge=0)] | None
    reason: Reason
    rollouts: Annotated[int, Meta(ge=0)]

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.agent, self.task, self.reason, self.rollouts)


_DECODER = msgspec.json.Decoder(Decision)


def encode_decision(group: str, run_id: str, verdict: Verdict) -> bytes:
    agent, task, reason, rollouts = verdict
    decision = Decision(
        group=group, run_id=run_id, agent=agent, task=task, reason=reason, rollouts=rollouts
    )
    return msgspec.json.encode(decision)


def decode_decision(raw: bytes) -> Decision:
    """Raises ``msgspec.ValidationError`` / ``msgspec.DecodeError`` for a bad record."""
    return _DECODER.decode(raw)
