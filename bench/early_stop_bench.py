"""Early stop, by simulation: the rollouts it saves, and that it is right when it stops.

    python -m bench.early_stop_bench [--tasks 2000] [--repeats 16] [--runs 5]
                                     [--agent-runs 25] [--seed 0] [--level 0.95]

Each run is one agent's generated collection of ``--tasks`` x ``--repeats``, collected as the
collector does with early stop on: rows dispatched rollout-major (every task's rollout 0, then
every rollout 1, ...), :data:`~bench.coverage_bench.IN_FLIGHT` at a time, each finishing after
:func:`~bench.coverage_bench.latencies` (a wrong rollout slower). Every result is given, as it
arrives, to a :class:`~rewardstream.processors.core.stopping.Stopper` with its dispatch
position (which folds the agent's tally in dispatch order, as the collector does); its
decisions keep rows that are not dispatched yet from ever being dispatched (each such row told
to the Stopper as lacking), and in-flight rows complete.
All rewards are drawn before the run, so the full collection is the same run without the rule.

- **Task rule** (``band``): counted, the share of rollouts never dispatched, and the tasks
  ``rewardstream curate --band`` keeps (``Criteria.keeps`` on each task's mean reward over the
  rollouts collected, as a partial profile has it) against those it keeps after the full
  collection: the rule claims they are always the same.
- **Agent rule** (``half_width``): the share saved; whether the full collection's mean reward
  is inside the stopped run's final interval (the rule claims it is, at the level, but for the
  noise of the rollouts not collected), and ``|stopped mean - full mean| <= h``.

Task difficulties (:data:`DIFFICULTIES`): uniform, U-shaped, centred, and a mix with many tasks
always right or always wrong, as real datasets have; 0/1 rewards and continuous ones in [0, 1]
(:func:`~bench.coverage_bench.draw_rewards`). Figures are medians and ranges over the seeded
runs of each setting.

The judge (:func:`judged`) reports any run whose curate output differs from the full
collection's, and any half-width whose full-collection mean was inside the final interval in
fewer than ``level`` of its runs (pooled over settings: the sequence is conservative, so a
correct rule is far above it). Its self-test plants a task rule that decides one rollout too
early and an agent rule on an interval half as wide, and sees both reported
(tests/test_early_stop_bench.py).
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from bench.coverage_bench import IN_FLIGHT, draw_rewards, latencies, said, task_means
from rewardstream.processors.core.stopping import Stopper, StopRule, Verdict
from rewardstream.sinks.curate import Criteria

F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Rewards = Literal["binary", "continuous"]

BANDS = ((0.2, 0.8), (0.1, 0.9), (0.05, 0.95))
HALF_WIDTHS = (0.01, 0.02, 0.05)
KINDS: tuple[Rewards, ...] = ("binary", "continuous")
_AGENT = "policy"


@dataclass(frozen=True)
class Difficulty:
    """Task means: ``right`` of the tasks always right (mean 1), ``wrong`` always wrong
    (mean 0), the rest ~ Beta(mean * k, (1 - mean) * k)."""

    name: str
    mean: float = 0.5
    concentration: float = 2.0
    right: float = 0.0
    wrong: float = 0.0

    def draw(self, tasks: int, rng: np.random.Generator) -> F64:
        means = task_means(self.mean, self.concentration, tasks, rng)
        place = rng.random(tasks)
        means[place < self.right] = 1.0
        means[(place >= self.right) & (place < self.right + self.wrong)] = 0.0
        return means


DIFFICULTIES = (
    Difficulty("uniform"),
    Difficulty("U-shaped Beta(0.5,0.5)", concentration=1.0),
    Difficulty("Beta(2,2)", concentration=4.0),
    Difficulty("mix: 30% always right, 20% always wrong, rest uniform", right=0.3, wrong=0.2),
)


@dataclass(frozen=True)
class Collected:
    """One run: which rows were collected, (task, repeat), and the agent's final interval."""

    rewards: F64
    got: Bools
    interval: tuple[float, float] | None

    @property
    def saved(self) -> float:
        return 1 - float(self.got.mean())


def collect(rewards: F64, latency: F64, rule: StopRule, in_flight: int = IN_FLIGHT) -> Collected:
    """Collect ``rewards`` (tasks x repeats) with the Stopper deciding what is dispatched."""
    tasks, repeats = rewards.shape
    stopper = Stopper(rule)
    skipped: set[int] = set()
    stopped = False
    got = np.zeros(rewards.shape, dtype=np.bool_)
    rows = ((t, r) for r in range(repeats) for t in range(tasks))  # rollout-major
    running: list[tuple[float, int, int]] = []

    def decide(verdicts: list[Verdict]) -> None:
        nonlocal stopped
        for verdict in verdicts:
            if verdict.task is None:
                stopped = True
            else:
                skipped.add(verdict.task)

    def dispatch(now: float) -> None:
        for t, r in rows:
            if stopped:
                return
            if t not in skipped:
                heapq.heappush(running, (now + float(latency[t, r]), t, r))
                return
            decide(stopper.lack(_AGENT, r * tasks + t))  # never dispatched: no result

    for _ in range(in_flight):
        dispatch(0.0)
    while running:
        now, t, r = heapq.heappop(running)
        got[t, r] = True
        decide(stopper.add(_AGENT, t, float(rewards[t, r]), r * tasks + t))
        dispatch(now)
    final = stopper.agents[_AGENT].interval(rule.level)
    return Collected(rewards, got, None if final is None else (final.lower, final.upper))


def curate_mismatches(run: Collected, band: tuple[float, float]) -> int:
    """Tasks ``curate --band`` keeps after this run but not after the full collection, or the
    reverse (each task's mean over its collected rollouts, as a partial profile has it)."""
    criteria = Criteria(band, None)
    partial = np.where(run.got, run.rewards, 0.0).sum(axis=1) / run.got.sum(axis=1)
    full = run.rewards.sum(axis=1) / run.rewards.shape[1]
    return sum(
        criteria.keeps(a, None) != criteria.keeps(b, None)
        for a, b in zip(partial.tolist(), full.tolist(), strict=True)
    )


def _draw(
    difficulty: Difficulty, kind: Rewards, tasks: int, repeats: int, seed: int
) -> tuple[F64, F64]:
    """One run's rewards and latencies (tasks x repeats)."""
    rng = np.random.default_rng(seed)
    means = np.repeat(difficulty.draw(tasks, rng)[:, None], repeats, axis=1)
    rewards = draw_rewards(kind, means, rng)
    return rewards, latencies(rewards, rng)


@dataclass
class Outcome:
    """One setting's runs: shares saved, and per run what the rule claims."""

    difficulty: Difficulty
    rewards: Rewards
    rule: StopRule
    saved: list[float]
    mismatches: list[int]  # task rule: curate outputs' differences, per run
    covered: list[bool]  # agent rule: the full mean inside the final interval, per run
    close: list[bool]  # agent rule: |stopped mean - full mean| <= h, per run

    @property
    def name(self) -> str:
        what = f"band {list(self.rule.band)}" if self.rule.band else f"h {self.rule.half_width}"
        return f"{self.difficulty.name}, {self.rewards}, {what}"


def measure(
    difficulty: Difficulty,
    kind: Rewards,
    rule: StopRule,
    runs: int,
    tasks: int,
    seed: int,
) -> Outcome:
    """``runs`` seeded runs of one setting under ``rule``."""
    out = Outcome(difficulty, kind, rule, [], [], [], [])
    for i in range(runs):
        rewards, latency = _draw(difficulty, kind, tasks, rule.repeats, seed + i)
        run = collect(rewards, latency, rule)
        out.saved.append(run.saved)
        if rule.band is not None:
            out.mismatches.append(curate_mismatches(run, rule.band))
        if rule.half_width is not None and run.interval is not None:
            full, stopped = float(rewards.mean()), float(rewards[run.got].mean())
            out.covered.append(run.interval[0] <= full <= run.interval[1])
            out.close.append(abs(stopped - full) <= rule.half_width)
    return out


def judged(outcomes: Iterable[Outcome], level: float) -> list[str]:
    """Findings: a run whose curate output differs from the full collection's; a half-width
    whose runs, pooled, had the full mean inside the final interval in fewer than ``level``."""
    findings: list[str] = []
    pooled: dict[float, list[bool]] = {}
    for o in outcomes:
        for i, bad in enumerate(o.mismatches):
            if bad:
                findings.append(f"{o.name}, run {i}: curate keeps {bad} tasks differently")
        if o.rule.half_width is not None:
            pooled.setdefault(o.rule.half_width, []).extend(o.covered)
    for h, covered in sorted(pooled.items()):
        if covered and sum(covered) < level * len(covered):
            share = sum(covered) / len(covered)
            findings.append(f"h {h}: the full mean inside the interval in {share:.4f} of runs")
    return findings


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1%} ({min(values):.1%}-{max(values):.1%})"


def table(outcomes: list[Outcome]) -> str:
    """The markdown tables docs/early-stop.md and BENCHMARKS.md quote."""
    bands = [o for o in outcomes if o.rule.band is not None]
    agents = [o for o in outcomes if o.rule.half_width is not None]
    lines = [
        "| tasks | rewards | band | saved, median (range) | curate mismatches |",
        "|---|---|---|---|---|",
        *(
            f"| {o.difficulty.name} | {o.rewards} | {list(o.rule.band or ())} "
            f"| {_spread(o.saved)} | {sum(o.mismatches)} of {len(o.mismatches)} runs |"
            for o in bands
        ),
        "",
        "| tasks | rewards | h | saved, median (range) | full mean in interval "
        "| abs(stopped - full) <= h |",
        "|---|---|---|---|---|---|",
        *(
            f"| {o.difficulty.name} | {o.rewards} | {o.rule.half_width} | {_spread(o.saved)} "
            f"| {sum(o.covered)}/{len(o.covered)} | {sum(o.close)}/{len(o.close)} |"
            for o in agents
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5, help="runs per band setting")
    parser.add_argument("--agent-runs", type=int, default=25, help="runs per half-width setting")
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    rules = [(StopRule(a.repeats, band=band, level=a.level), a.runs) for band in BANDS] + [
        (StopRule(a.repeats, half_width=h, level=a.level), a.agent_runs) for h in HALF_WIDTHS
    ]
    outcomes = []
    for i, difficulty in enumerate(DIFFICULTIES):
        for j, kind in enumerate(KINDS):
            for rule, runs in rules:  # the same seeds for every rule: the same collections
                seed = a.seed + 1000 * (2 * i + j)
                outcomes.append(measure(difficulty, kind, rule, runs, a.tasks, seed))
                print(f"done: {outcomes[-1].name}", file=sys.stderr, flush=True)
    print(table(outcomes))
    return said(judged(outcomes, a.level))


if __name__ == "__main__":
    sys.exit(main())
