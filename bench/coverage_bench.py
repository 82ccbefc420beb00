"""Coverage of the live intervals under continuous monitoring, by simulation.

    python -m bench.coverage_bench [--runs 10000] [--seed 0] [--level 0.95]

A confidence sequence claims ``P(for all t: theta_t in C_t) >= level``: whoever looks after
every rollout is still right at that rate, provided the order in which observations are folded
does not depend on their outcomes. For each setting this simulates ``--runs`` collections and
counts the runs whose interval held the truth at *every* moment, for

- ``sequence``: the agent-mean sequence the product shows
  (:func:`~rewardstream.processors.core.confseq.eb_interval`), folded in **dispatch order** (the
  order rows were sent, fixed before any outcome), a prefix at a time: a result waits until
  every row dispatched before it is in. It is checked after every item of the dispatch order,
  which includes every moment the folded prefix grows;
- ``arrival``: the same sequence folded in arrival order, as rewardstream did before (the
  contrast: where wrong rollouts are slower, the right ones arrive first and the order depends
  on the outcomes);
- ``t@100``: a fixed-sample t-interval (mean +- t * s / sqrt(n)) over the rollouts in arrival
  order, checked after every 100, as a live dashboard re-checking a textbook interval would
  (the other contrast);
- ``task``: the per-task pass-rate sequence
  (:func:`~rewardstream.processors.core.confseq.bernoulli_interval`) over each task's rollouts
  in rollout-index order, checked after every rollout (binary settings only).

The truth ``theta_t`` is the average of the true task means of the rollouts folded so far
(docs/intervals.md). Settings span binary and continuous rewards in [0, 1], overall means near
0, in the middle and near 1, task difficulty from uniform to spread out, and three orders:
``shuffled`` (rows dispatched in random order, arriving in that order), and two ``collector``
settings, rows dispatched in file order at a steady rate with latencies that depend on the
outcome, as with reasoning models: ``collector 64 x1.5`` (64 rollouts in flight, a wrong rollout
takes 1.5x as long) and ``collector 256 x3`` (256 in flight, 3x as long). Widths are reported as
the ratio of the sequence's half-width to the t-interval's at the end of the run.

The judge (:func:`judged`) reports a finding for any setting whose ``sequence`` or ``task``
coverage is below the level by more than the simulation's own noise (3 standard errors); its
self-test plants an interval of half the width, and the arrival-order fold in the harsh
collector setting, and shows both are reported (tests/test_coverage_bench.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import special

from rewardstream.processors.core.confseq import bernoulli_interval, eb_interval, prefix_sums

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Interval = Callable[[npt.NDArray[Any], F64, F64, float], tuple[F64, F64]]
"""``(n, total, spread, alpha) -> (lower, upper)`` on the unit scale, as ``eb_interval``."""
TaskInterval = Callable[[I64, I64, float], tuple[F64, F64]]
"""``(successes, trials, alpha) -> (lower, upper)``, as ``bernoulli_interval``."""

IN_FLIGHT, SLOWER = 64, 1.5
"""Rollouts a collector keeps in flight; how much slower a wrong rollout is (the default
collector setting; :data:`SETTINGS` add a harsher one)."""
HARSH_IN_FLIGHT, HARSH_SLOWER = 256, 3.0
_CHUNK = 500


@dataclass(frozen=True)
class Setting:
    """One simulated kind of collection (the module docstring)."""

    rewards: Literal["binary", "continuous"]
    mean: float  # the mean of the task means
    concentration: float  # task means ~ Beta(mean * k, (1 - mean) * k): small k, spread out
    order: Literal["shuffled", "collector"]
    tasks: int = 250
    repeats: int = 8
    in_flight: int = IN_FLIGHT  # collector order: rollouts in flight
    slower: float = SLOWER  # collector order: how much slower a wrong rollout is

    @property
    def name(self) -> str:
        spread = "spread" if self.concentration < 10 else "even"
        order = (
            self.order
            if self.order == "shuffled"
            else f"collector {self.in_flight} x{self.slower:g}"
        )
        return f"{self.rewards} mean {self.mean} {spread} {order}"


_ORDERS: tuple[tuple[Literal["shuffled", "collector"], int, float], ...] = (
    ("shuffled", IN_FLIGHT, SLOWER),
    ("collector", IN_FLIGHT, SLOWER),
    ("collector", HARSH_IN_FLIGHT, HARSH_SLOWER),
)
SETTINGS = [
    Setting(rewards, mean, k, order, in_flight=in_flight, slower=slower)
    for rewards in ("binary", "continuous")
    for mean in (0.02, 0.5, 0.98)
    for k in (1.0, 50.0)
    for order, in_flight, slower in _ORDERS
]


@dataclass
class Outcome:
    """What one setting measured."""

    setting: Setting
    runs: int
    sequence: float  # share of runs the sequence, folded as the product does, always covered
    arrival: float  # the same for the sequence folded in arrival order (before)
    t_every_100: float  # the same for the fixed-sample t-interval checked every 100
    task: float | None  # share of (run, task) pairs the task sequence always covered
    width_ratio: float  # the sequence's half-width over the t-interval's, at the end


def task_means(mean: float, concentration: float, shape: Any, rng: np.random.Generator) -> F64:
    """True task means ~ Beta(mean * k, (1 - mean) * k): small ``k``, spread out."""
    k = concentration
    drawn: F64 = rng.beta(mean * k, (1 - mean) * k, size=shape)
    return drawn


def draw_rewards(
    kind: Literal["binary", "continuous"], means: F64, rng: np.random.Generator
) -> F64:
    """One reward per true mean: 0/1, or Beta(mu * 4, (1 - mu) * 4), bounded, mean mu, well
    spread (``mu`` kept off 0 and 1, where the Beta is undefined)."""
    if kind == "binary":
        return (rng.random(means.shape) < means).astype(np.float64)
    mu = np.clip(means, 1e-3, 1 - 1e-3)
    drawn: F64 = rng.beta(mu * 4, (1 - mu) * 4)
    return drawn


def latencies(rewards: F64, rng: np.random.Generator, slower: float = SLOWER) -> F64:
    """How long each rollout takes: lognormal, and ``slower`` times as long when wrong
    (reward 0; in between for continuous rewards), as with reasoning models."""
    base = rng.lognormal(0.0, 0.5, size=rewards.shape)
    slowdown: F64 = base * (1 + (slower - 1) * (1 - rewards))
    return slowdown


def simulate(
    s: Setting, runs: int, rng: np.random.Generator, means: F64 | None = None
) -> tuple[F64, F64, F64]:
    """``runs`` collections: the rewards by (task, rollout index), each task's true mean
    (drawn, unless ``means`` are given: another collection of the same tasks), and the
    arrival order (indices into the flattened rewards)."""
    if means is None:
        means = task_means(s.mean, s.concentration, (runs, s.tasks), rng)
    per_rollout = np.repeat(means, s.repeats, axis=1)
    rewards = draw_rewards(s.rewards, per_rollout, rng)
    if s.order == "shuffled":
        arrival = rng.permuted(
            np.broadcast_to(np.arange(per_rollout.shape[1]), rewards.shape), axis=1
        )
    else:  # dispatched in file order at a steady rate, s.in_flight at a time on average
        latency = latencies(rewards, rng, s.slower)
        started = np.arange(rewards.shape[1]) * (float(latency.mean()) / s.in_flight)
        arrival = np.argsort(started + latency, axis=1)
    return rewards, means, arrival.astype(np.float64)


Fold = Callable[[Setting, F64], I64]
"""``(setting, arrival) -> the order items are folded in`` (indices into each run's rewards)."""


def dispatch_fold(s: Setting, arrival: F64) -> I64:
    """The product's fold: dispatch order. The collector dispatches in file order; a shuffled
    run dispatches in its random order (which is also its arrival order)."""
    if s.order == "shuffled":
        return arrival.astype(np.int64)
    return np.broadcast_to(np.arange(arrival.shape[1], dtype=np.int64), arrival.shape)


def arrival_fold(s: Setting, arrival: F64) -> I64:
    """The fold rewardstream did before: arrival order (outcome-dependent in a collector)."""
    return arrival.astype(np.int64)


def sequence_covered(
    arrived: F64, truth: F64, alpha: float, interval: Interval = eb_interval
) -> Bools:
    """Per run: did the sequence over ``arrived`` (the rewards in the order folded) hold the
    running truth after every rollout?"""
    n = np.arange(1, arrived.shape[1] + 1, dtype=np.float64)
    totals, spreads = prefix_sums(arrived)
    theta = np.cumsum(truth, axis=1) / n
    lower, upper = interval(n, totals, spreads, alpha)
    hit: Bools = np.asarray(((lower <= theta) & (theta <= upper)).all(axis=1), dtype=np.bool_)
    return hit


def t_covered(arrived: F64, truth: F64, alpha: float, every: int) -> tuple[Bools, F64]:
    """Per run: did a fixed-sample t-interval, re-checked every ``every`` rollouts, hold the
    running truth at each check; and its half-width at the end."""
    n = np.arange(1, arrived.shape[1] + 1, dtype=np.float64)
    theta = np.cumsum(truth, axis=1) / n
    at = slice(every - 1, None, every)
    m = n[at]
    mean = np.cumsum(arrived, axis=1)[:, at] / m
    squares = np.cumsum(arrived**2, axis=1)[:, at]
    sd = np.sqrt(np.maximum(squares - m * mean**2, 0.0) / (m - 1))
    half = special.stdtrit(m - 1, 1 - alpha / 2) * sd / np.sqrt(m)
    hit: Bools = np.asarray((np.abs(mean - theta[:, at]) <= half).all(axis=1), dtype=np.bool_)
    return hit, half[:, -1]


def tasks_covered(
    rewards: F64, task_means: F64, repeats: int, alpha: float, interval: TaskInterval
) -> Bools:
    """Per (run, task) of 0/1 rewards: did the task's sequence, over its rollouts in index
    order, hold its true pass rate after every one?"""
    by_task = rewards.reshape(-1, repeats)
    successes = np.cumsum(by_task, axis=1).astype(np.int64)
    trials = np.broadcast_to(np.arange(1, repeats + 1), successes.shape)
    lower, upper = interval(successes.ravel(), trials.ravel(), alpha)
    p = np.repeat(task_means.ravel(), repeats)
    hit: Bools = np.asarray(
        ((lower <= p) & (p <= upper)).reshape(-1, repeats).all(axis=1), dtype=np.bool_
    )
    return hit


def _ordered(rewards: F64, truth: F64, order: I64) -> tuple[F64, F64]:
    """Each run's rewards and true means in ``order``."""
    return np.take_along_axis(rewards, order, axis=1), np.take_along_axis(truth, order, axis=1)


def measure(
    s: Setting,
    runs: int,
    level: float,
    seed: int,
    interval: Interval = eb_interval,
    task_interval: TaskInterval = bernoulli_interval,
    fold: Fold = dispatch_fold,
) -> Outcome:
    """Simulate ``runs`` collections of setting ``s``, in chunks, and count (the intervals
    and the product's fold are parameters so the self-test can plant faults)."""
    rng = np.random.default_rng(seed)
    alpha = 1 - level
    seq, late, tee, task, ratios = [], [], [], [], []
    for start in range(0, runs, _CHUNK):
        rewards, task_means, arrival = simulate(s, min(_CHUNK, runs - start), rng)
        per_rollout = np.repeat(task_means, s.repeats, axis=1)
        folded, folded_truth = _ordered(rewards, per_rollout, fold(s, arrival))
        seq.append(sequence_covered(folded, folded_truth, alpha, interval))
        arrived, truth = _ordered(rewards, per_rollout, arrival_fold(s, arrival))
        late.append(sequence_covered(arrived, truth, alpha, interval))
        hit, t_half = t_covered(arrived, truth, alpha, every=100)
        tee.append(hit)
        n = np.full(len(folded), float(folded.shape[1]))
        totals, spreads = prefix_sums(folded)
        lower, upper = interval(n, totals[:, -1], spreads[:, -1], alpha)
        ratios.append((upper - lower) / 2 / np.where(t_half > 0, t_half, np.nan))
        if s.rewards == "binary":
            task.append(tasks_covered(rewards, task_means, s.repeats, alpha, task_interval))
    return Outcome(
        s,
        runs,
        float(np.concatenate(seq).mean()),
        float(np.concatenate(late).mean()),
        float(np.concatenate(tee).mean()),
        float(np.concatenate(task).mean()) if task else None,
        float(np.nanmedian(np.concatenate(ratios))),
    )


def judged(outcomes: list[Outcome], level: float) -> list[str]:
    """Findings: a sequence covering less than ``level`` beyond 3 standard errors of the
    simulation (per run for the agent mean, per run and task for the task sequence)."""
    findings = []
    for o in outcomes:
        checks = [("sequence", o.sequence, o.runs)]
        if o.task is not None:
            checks.append(("task", o.task, o.runs * o.setting.tasks))
        for what, share, count in checks:
            noise = 3 * math.sqrt(level * (1 - level) / count)
            if share < level - noise:
                findings.append(f"{o.setting.name}: {what} covered in {share:.4f} of {count}")
    return findings


def table(outcomes: list[Outcome]) -> str:
    """The markdown table docs/intervals.md and BENCHMARKS.md quote."""
    lines = [
        "| setting | sequence, dispatch order (product) | sequence, arrival order (before) "
        "| t-interval, every 100 | task sequence | width vs t |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        task = "" if o.task is None else f"{o.task:.4f}"
        lines.append(
            f"| {o.setting.name} | {o.sequence:.4f} | {o.arrival:.4f} | {o.t_every_100:.4f} "
            f"| {task} | {o.width_ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    outcomes = [measure(s, args.runs, args.level, args.seed + i) for i, s in enumerate(SETTINGS)]
    print(table(outcomes))
    return said(judged(outcomes, args.level))


def said(findings: list[str]) -> int:
    """Each finding on stderr; the exit code: 1 if there is any."""
    for finding in findings:
        print(f"FINDING {finding}", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
