"""A collection's opt-in early stop: which rows it dispatches when, and which it skips.

``+early_stop.half_width=H`` and/or ``+early_stop.band=[LO,HI]`` (docs/early-stop.md). Without
them nothing here runs and the collection is NeMo Gym's. With them:

- rows are dispatched repeat-major (every task's first repeat, then every second, ...), so
  each task has evidence before its later repeats are due, and an agent's running mean covers
  every task early; the materialized inputs file keeps its order;
- the decisions come from the stream processors of the run's group over Kafka
  (:mod:`rewardstream.sinks.topics.decisions`) when the collection streams there, else from a
  :class:`~rewardstream.processors.core.stopping.Stopper` folding the collector's own results
  (no broker needed), each agent's in the order its rows were dispatched, whatever order the
  results come back in (a confidence sequence needs an order its outcomes do not choose); the
  first decision for a key counts;
- a row a decision covers is never dispatched: it becomes a line of ``S_skipped.jsonl`` with
  its reason, and ``RunFinished.skipped`` counts them per reason.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rewardstream.contract.events import EarlyStop
from rewardstream.errors import InputError
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.records import agent_of
from rewardstream.processors.core.stopping import Reason, Stopper, StopRule, Verdict

__all__ = ["EarlyStopConfig", "Skips", "check_resumed", "dispatch_order", "skipped_path"]


class EarlyStopConfig(BaseModel):
    """``+early_stop.*``: what the run may stop early for."""

    model_config = ConfigDict(extra="forbid")

    half_width: float | None = Field(default=None, gt=0)
    band: tuple[float, float] | None = None
    level: float = Field(default=DEFAULT_LEVEL, gt=0, lt=1)
    reward_range: tuple[float, float] = (0.0, 1.0)

    @model_validator(mode="after")
    def _sound(self) -> EarlyStopConfig:
        if (problem := self.rule(1).problem()) is not None:
            raise ValueError(problem)
        return self

    def rule(self, repeats: int) -> StopRule:
        return StopRule(repeats, self.half_width, self.band, self.level, *self.reward_range)

    def wire(self, rows: list[dict[str, Any]]) -> EarlyStop:
        """The ``RunStarted.early_stop`` of a run of ``rows``: their repeats per task and agent
        must be one number (the task rule's final mean is over that many)."""
        counts = Counter((row["_ng_task_index"], _agent(row)) for row in rows)
        repeats = set(counts.values())
        if len(repeats) > 1:
            (task, agent), n = min(counts.items(), key=lambda kv: kv[1])
            raise InputError(
                f"early_stop needs the same number of repeats for every task, but task {task} "
                f"of agent {agent!r} has {n} and others {max(repeats)}"
            )
        return EarlyStop(
            repeats=repeats.pop() if repeats else 1,
            half_width=self.half_width,
            band=self.band,
            level=self.level,
            reward_range=self.reward_range,
        )


def _agent(row: dict[str, Any]) -> str:
    return agent_of(row) or ""


def dispatch_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeat-major: every task's first repeat, then every second, ... (stable)."""
    return sorted(rows, key=lambda row: (row["_ng_rollout_index"], row["_ng_task_index"]))


def skipped_path(rollouts: Path) -> Path:
    """``D/S_skipped.jsonl`` beside ``D/S.jsonl``."""
    stem = rollouts.stem if rollouts.suffix else rollouts.name
    return rollouts.with_name(f"{stem}_skipped.jsonl")


def _key(row: dict[str, Any]) -> tuple[Any, Any]:
    return row["_ng_task_index"], row["_ng_rollout_index"]


class Skips:
    """The decisions a collection honours, and the sidecar line of each row they cover.

    Deciding alone (``local``), it folds the collector's results into a :class:`Stopper`, each
    at its row's place in its agent's :func:`dispatch_order` of ``rows`` (the run's
    materialized rows): the collector tells it each result (:meth:`fold`), each row a decision
    covers (:meth:`skip`), and each row it is done with (:meth:`settled`), so a row that never
    gets a result does not hold the agent's fold back."""

    def __init__(self, early: EarlyStop, local: bool, rows: Iterable[dict[str, Any]] = ()) -> None:
        self.early = early  # what the run asked for, as RunStarted carries it
        self.stopper = Stopper(early.rule()) if local else None  # it decides alone
        self.place: dict[tuple[Any, Any], int] = {}  # a row's place in its agent's dispatch
        if local:
            seen: Counter[str] = Counter()
            for row in dispatch_order(list(rows)):
                agent = _agent(row)
                self.place[_key(row)] = seen[agent]
                seen[agent] += 1
        self.decided: dict[tuple[str, int | None], Verdict] = {}  # task None: the agent's
        self.conflicts: set[tuple[str, int | None]] = set()
        self.counts: Counter[Reason] = Counter()
        self.rule = _named(early)  # each sidecar line names its rule

    def take(self, verdict: Verdict) -> None:
        """A decision, from the processors or the local fold. A repeat of one taken is
        nothing new; another reason for the same key is a conflict (the rule cannot give two):
        said once, and the key is collected in full from then on."""
        key = (verdict.agent, verdict.task)
        first = self.decided.setdefault(key, verdict)
        if first.reason != verdict.reason and key not in self.conflicts:
            self.conflicts.add(key)
            what = "all rows" if verdict.task is None else f"task {verdict.task}"
            print(
                f"WARNING: early stop: conflicting decisions for {what} of agent "
                f"{verdict.agent!r}: {first.reason}, then {verdict.reason}; collected in full",
                file=sys.stderr,
            )

    def fold(self, row: dict[str, Any], result: dict[str, Any]) -> None:
        """A result the collector wrote (deciding alone): fold its reward."""
        if self.stopper is None:
            return
        reward = result.get("reward")
        value = None  # not a number: no rule passes over it (a bool is 0/1, as in the profile)
        if isinstance(reward, int | float) and math.isfinite(reward):
            value = float(reward)
        at = self.place.get(_key(row))
        if at is None:  # not one of the run's rows (a foreign line of a resumed file)
            return
        for verdict in self.stopper.add(_agent(row), row["_ng_task_index"], value, at):
            self.take(verdict)

    def settled(self, row: dict[str, Any]) -> None:
        """The collector is done with ``row`` (deciding alone): if no result of it was folded
        (its attempts failed for good, its result is not kept, it was skipped or failed in an
        earlier part of a resumed collection), it will have none, and its agent's fold goes
        on past it."""
        at = self.place.get(_key(row))
        if self.stopper is None or at is None:
            return
        for verdict in self.stopper.lack(_agent(row), at):
            self.take(verdict)

    def skip(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The sidecar line of ``row`` when a decision covers it (counted), else None."""
        agent = _agent(row)
        for key in ((agent, None), (agent, row["_ng_task_index"])):
            verdict = self.decided.get(key)
            if verdict is not None and key not in self.conflicts:
                break
        else:
            return None
        self.counts[verdict.reason] += 1
        self.settled(row)  # never dispatched: no result
        return {
            "_ng_task_index": row["_ng_task_index"],
            "_ng_rollout_index": row["_ng_rollout_index"],
            "agent": agent,
            "reason": verdict.reason,
            "decided_after": verdict.rollouts,
            "early_stop": self.rule,
        }


def _named(early: EarlyStop) -> dict[str, Any]:
    """The rule as the sidecar names it (JSON's types: lists, not tuples)."""
    named: dict[str, Any] = orjson.loads(orjson.dumps(msgspec.structs.asdict(early)))
    return named


def check_resumed(early: EarlyStop, rules: Sequence[Any], where: Path) -> None:
    """A resume keeps earlier skips only under the rule that decided them: another band would
    break what they guarantee (docs/early-stop.md)."""
    for rule in rules:
        if rule != _named(early):
            raise InputError(
                f"{where}: its rows were skipped under early_stop {orjson.dumps(rule).decode()}"
                "; resume with those settings, or without early_stop to collect them"
            )
