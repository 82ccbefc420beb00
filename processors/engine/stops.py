"""A processor's early-stop decisions (docs/early-stop.md §The processors' decisions).

The task rule needs all of a task's results: both data topics are keyed by task, so they are
in one partition, and each processor applies the rule to the parts it owns, reading their
results a batch at a time. The agent rule needs the whole run's tally, which only the merged
member records give: the leader applies it. Each decision is returned once per process
lifetime; a restarted processor (or a new owner of a partition) may return one again, with the
same place, and a collector takes the first. Pure: the stream adapter publishes what is
returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.core.stopping import StopRule, Verdict, agent_settled, task_place

__all__ = ["RunStops"]


@dataclass
class _Read:
    """How far the task rule has read one part's state: results and their values in the
    pool, the results read while their row had not come (agent id, task, reward), and per
    (agent id, task) the reward's [total, count] (total NaN: never decided)."""

    state: ProfileState
    results: int = 0
    pool: int = 0
    waiting: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    sums: dict[tuple[int, int], list[float]] = field(default_factory=dict)


class RunStops:
    """One run's early stop as this processor applies it (see the module docstring)."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.said: set[tuple[str, int | None]] = set()  # (agent, task or None) returned
        self._reads: dict[str, _Read] = {}  # per unit

    def tasks(self, states: Mapping[str, ProfileState]) -> list[Verdict]:
        """The task rule on what ``states`` (per unit, the run's parts owned here) folded
        since the last call. A part new to a unit (a rebuild) is read from its start."""
        if self.rule.band is None:
            return []
        for name in self._reads.keys() - states.keys():  # released
            del self._reads[name]
        verdicts = []
        for name, state in states.items():
            read = self._reads.get(name)
            if read is None or read.state is not state:
                read = self._reads[name] = _Read(state)
            if read.results < state.num_results or read.waiting:
                verdicts += self._read(read)
        return verdicts

    def _read(self, read: _Read) -> list[Verdict]:
        state, rule, lo = read.state, self.rule, read.results
        tasks, agents, rewards, read.pool = state.rewards_from(lo, read.pool)
        read.results = state.num_results
        rewards[~((rewards >= rule.lo) & (rewards <= rule.hi))] = math.nan  # outside: no place
        held = state.left_out(min(read.waiting, default=lo))
        if held or read.waiting:  # rollouts that came before their rows: rare
            came = [read.waiting.pop(at) for at in [at for at in read.waiting if at not in held]]
            keep = np.ones(len(tasks), dtype=np.bool_)
            for at in sorted(at - lo for at in held if at >= lo):
                read.waiting[at + lo] = (int(agents[at]), int(tasks[at]), float(rewards[at]))
                keep[at] = False
            agents = np.concatenate([agents[keep], np.array([a for a, _, _ in came], np.int32)])
            tasks = np.concatenate([tasks[keep], np.array([t for _, t, _ in came], np.int64)])
            rewards = np.concatenate([rewards[keep], np.array([r for _, _, r in came])])
        if not len(tasks):
            return []
        # sums per (agent, task) of what came, then per pair touched: a pair per repeat set
        pairs, inverse = np.unique(np.stack([agents, tasks]), axis=1, return_inverse=True)
        totals = np.bincount(inverse.ravel(), weights=rewards)  # a NaN makes its pair's NaN
        counts = np.bincount(inverse.ravel())
        verdicts = []
        for (agent_id, task), total, n in zip(
            pairs.T.tolist(), totals.tolist(), counts.tolist(), strict=True
        ):
            held_sums = read.sums.setdefault((agent_id, task), [0.0, 0])
            held_sums[0] += total
            held_sums[1] += n
            agent = state.names[agent_id] if agent_id >= 0 else ""
            if (agent, task) in self.said:
                continue
            if place := task_place(held_sums[0], int(held_sums[1]), rule):
                self.said.add((agent, task))
                verdicts.append(Verdict(agent, task, place, int(held_sums[1])))
        return verdicts

    def agents(self, tallies: Mapping[str, Tally]) -> list[Verdict]:
        """The agent rule on the whole run's tally per agent. The tallies are over their own
        range (the live figures' [0, 1]); one that holds the rule's range gives a valid
        interval, wider than the rule's own would be; any other is passed over."""
        rule = self.rule
        if rule.half_width is None:
            return []
        verdicts = []
        for agent, tally in tallies.items():
            if (agent, None) in self.said or not tally.lo <= rule.lo <= rule.hi <= tally.hi:
                continue
            if agent_settled(tally, rule) is not None:
                self.said.add((agent, None))
                verdicts.append(Verdict(agent, None, "half-width", tally.n))
        return verdicts
