"""Comparing two runs while peeking, by simulation: how often ``rewardstream compare`` is wrong,
and how many rollouts it needs to be right.

    python -m bench.compare_bench [--runs 10000] [--ab-runs 1000] [--seed 0] [--level 0.95]

Each simulated comparison is two independent collections of the same tasks, made by
``bench/coverage_bench.py``'s :func:`~bench.coverage_bench.simulate`, collected in parallel;
the verdict (:mod:`rewardstream.processors.core.difference`: each run's sequence at level
``1 - alpha / 2``, the difference ``[lower_B - upper_A, upper_B - lower_A]``) is checked after
every rollout pair, the ``t``-th rollout of each run to arrive.

- **A/A**: both runs have the same task means (the true difference is 0). Counted: the runs in
  which ``better`` or ``worse`` is *ever* said, at noise floor 0 (the strictest: a floor only
  makes those verdicts rarer) and at 0.01; and ``better`` alone, whose bound is ``alpha / 2``.
- **A/B**: the candidate's task means are the baseline's plus ``delta`` (on a mean of 0.5,
  task means close together so none leaves [0, 1]). Counted: the rollouts per run until the
  first ``better``, median over runs, against the rollouts per run a fixed-size two-sample
  test of the same power needs: the one-sided z-test at ``alpha / 2`` (the error ``better``
  has) with power 80%, ``n = (z_(1 - alpha/2) + z_0.8)^2 (var_A + var_B) / (delta - d)^2``,
  with each run's reward variance over all its simulated rollouts; that test's power at ``n``
  is measured on the same runs, as a check of the formula.

The judge (:func:`judged`) reports an A/A setting where a wrong verdict was ever said in more
than ``alpha`` of runs (``better`` alone: ``alpha / 2``) beyond 3 standard errors of the
simulation; its self-test plants an interval of half the width and sees it reported
(tests/test_compare_bench.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

from bench.coverage_bench import Interval, Setting, said, simulate, task_means
from rewardstream.processors.core.confseq import eb_interval, prefix_sums
from rewardstream.processors.core.difference import decided, difference_bounds

F64 = npt.NDArray[np.float64]

FLOORS = (0.0, 0.01)
POWER = 0.8
_CHUNK = 250

AA_SETTINGS = [
    *(
        Setting(rewards, mean, 50.0, "collector")
        for rewards in ("binary", "continuous")
        for mean in (0.02, 0.5, 0.98)
    ),
    *(Setting(rewards, 0.5, 1.0, "shuffled") for rewards in ("binary", "continuous")),
]
"""Task means close together in file order, as a collector returns them (where the coverage
bench found the sequences tightest), and spread-out ones in random order (where the two runs'
mixes of tasks differ most)."""
AB_SETTINGS = [
    (Setting(rewards, 0.5, 50.0, "shuffled", tasks=2000), delta)
    for rewards in ("binary", "continuous")
    for delta in (0.05, 0.10)
]


def _arrived(s: Setting, means: F64, rng: np.random.Generator) -> F64:
    """One collection of each row's tasks: its rewards in arrival order."""
    rewards, _, arrival = simulate(s, len(means), rng, means)
    return np.take_along_axis(rewards, arrival.astype(np.int64), axis=1)


def _difference(a: F64, b: F64, alpha: float, interval: Interval) -> tuple[F64, F64]:
    """The difference's interval after every rollout pair (rewards in [0, 1], arrival order)."""
    n = np.arange(1, a.shape[1] + 1, dtype=np.float64)
    ends = []
    for run in (a, b):
        totals, spreads = prefix_sums(run)
        ends.append(interval(n, totals, spreads, alpha / 2))
    lower, upper = difference_bounds((ends[0][0], ends[0][1]), (ends[1][0], ends[1][1]))
    return lower, upper


@dataclass
class Null:
    """What one A/A setting measured: shares of runs."""

    setting: Setting
    runs: int
    ever: dict[float, float]  # per noise floor: better or worse said at some moment
    better: float  # better said at some moment, noise floor 0


def null(s: Setting, runs: int, level: float, seed: int, interval: Interval = eb_interval) -> Null:
    """``runs`` A/A comparisons of setting ``s`` (``interval``: planted by the self-test)."""
    rng = np.random.default_rng(seed)
    alpha = 1 - level
    ever: dict[float, list[npt.NDArray[np.bool_]]] = {d: [] for d in FLOORS}
    better_ever = []
    for start in range(0, runs, _CHUNK):
        means = task_means(s.mean, s.concentration, (min(_CHUNK, runs - start), s.tasks), rng)
        lower, upper = _difference(
            _arrived(s, means, rng), _arrived(s, means, rng), alpha, interval
        )
        for d in FLOORS:
            better, worse = decided(lower, upper, d)
            ever[d].append(np.asarray((better | worse).any(axis=1), dtype=np.bool_))
            if d == 0:
                better_ever.append(np.asarray(better.any(axis=1), dtype=np.bool_))
    return Null(
        s,
        runs,
        {d: float(np.concatenate(v).mean()) for d, v in ever.items()},
        float(np.concatenate(better_ever).mean()),
    )


@dataclass
class Power:
    """What one A/B setting measured."""

    setting: Setting
    delta: float
    runs: int
    median: dict[float, float]  # per noise floor: rollouts per run until better (median)
    never: dict[float, float]  # share of runs not better by their end
    fixed: dict[float, int]  # the fixed-size test's rollouts per run, power POWER
    fixed_power: dict[float, float]  # that test's power measured on the same runs


def power(s: Setting, delta: float, runs: int, level: float, seed: int) -> Power:
    """``runs`` A/B comparisons: the candidate's task means are the baseline's + ``delta``."""
    rng = np.random.default_rng(seed)
    alpha = 1 - level
    length = s.tasks * s.repeats
    first: dict[float, list[F64]] = {d: [] for d in FLOORS}
    a_runs, b_runs, gaps = [], [], []
    for start in range(0, runs, _CHUNK):
        means = task_means(s.mean, s.concentration, (min(_CHUNK, runs - start), s.tasks), rng)
        shifted = np.clip(means + delta, 0.0, 1.0)
        a, b = _arrived(s, means, rng), _arrived(s, shifted, rng)
        lower, upper = _difference(a, b, alpha, eb_interval)
        for d in FLOORS:
            better, _ = decided(lower, upper, d)
            at = np.where(better.any(axis=1), better.argmax(axis=1) + 1.0, np.inf)
            first[d].append(at)
        a_runs.append(a)
        b_runs.append(b)
        gaps.append(shifted.mean(axis=1) - means.mean(axis=1))
    a_all, b_all = np.concatenate(a_runs), np.concatenate(b_runs)
    true_delta = float(np.concatenate(gaps).mean())
    z = special.ndtri(1 - alpha / 2) + special.ndtri(POWER)
    spread = float(a_all.var() + b_all.var())
    fixed, fixed_power = {}, {}
    for d in FLOORS:
        n = math.ceil(z**2 * spread / (true_delta - d) ** 2)
        fixed[d] = n
        if n <= length:  # the test at n on each simulated pair of runs
            ma, mb = a_all[:, :n].mean(axis=1), b_all[:, :n].mean(axis=1)
            se = np.sqrt((a_all[:, :n].var(axis=1, ddof=1) + b_all[:, :n].var(axis=1, ddof=1)) / n)
            stat = (mb - ma - d) / se
            fixed_power[d] = float((stat > special.ndtri(1 - alpha / 2)).mean())
    until = {d: np.concatenate(v) for d, v in first.items()}
    return Power(
        s,
        delta,
        runs,
        {d: float(np.median(v)) for d, v in until.items()},
        {d: float(np.isinf(v).mean()) for d, v in until.items()},
        fixed,
        fixed_power,
    )


def judged(outcomes: list[Null], level: float) -> list[str]:
    """Findings: an A/A setting where ``better`` or ``worse`` was ever said in more than
    ``alpha`` of runs, or ``better`` in more than ``alpha / 2``, beyond 3 standard errors."""
    alpha = 1 - level
    findings = []
    for o in outcomes:
        for what, share, bound in (
            ("better or worse", o.ever[0.0], alpha),
            ("better", o.better, alpha / 2),
        ):
            if share > bound + 3 * math.sqrt(bound * (1 - bound) / o.runs):
                findings.append(f"{o.setting.name}: {what} said in {share:.4f} of {o.runs} runs")
    return findings


def tables(nulls: list[Null], powers: list[Power]) -> str:
    """The markdown tables docs/intervals.md quotes."""
    lines = [
        "| A/A setting | better or worse ever, d = 0 | better ever, d = 0 "
        "| better or worse ever, d = 0.01 |",
        "|---|---|---|---|",
        *(
            f"| {o.setting.name} | {o.ever[0.0]:.4f} | {o.better:.4f} | {o.ever[0.01]:.4f} |"
            for o in nulls
        ),
        "",
        "| A/B setting | d | rollouts per run until better, median | not better by the end "
        "| fixed-size test, 80% power | its power measured | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in powers:
        for d in FLOORS:
            measured = p.fixed_power.get(d)
            lines.append(
                f"| {p.setting.rewards} mean 0.5 {p.delta:+.2f} | {d:g} | {p.median[d]:,.0f} "
                f"| {p.never[d]:.4f} | {p.fixed[d]:,} "
                f"| {'' if measured is None else f'{measured:.3f}'} "
                f"| {p.median[d] / p.fixed[d]:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="A/A runs per setting")
    parser.add_argument("--ab-runs", type=int, default=1_000, help="A/B runs per setting")
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    nulls = [null(s, args.runs, args.level, args.seed + i) for i, s in enumerate(AA_SETTINGS)]
    powers = [
        power(s, delta, args.ab_runs, args.level, args.seed + 100 + i)
        for i, (s, delta) in enumerate(AB_SETTINGS)
    ]
    print(tables(nulls, powers))
    return said(judged(nulls, args.level))


if __name__ == "__main__":
    sys.exit(main())
