"""Prometheus metrics of the stream processor.

Per event, the hot path only notes the rollout's agent and its publish-to-visible latency
(~0.3 us; prometheus_client's ``inc`` and ``observe`` cost ~3 us together); the notes are folded
into the counter and the histogram's buckets with numpy at scrape time, or every 64 Ki events.
Reward statistics are computed at scrape time by a custom collector from the live Welford
moments of each run and agent, so a scrape costs O(runs x agents + new events), never
O(rollouts). No label is per task. The comparisons of the run pairs the processor was given
(``--compare``) are computed there too, from the same whole-run view.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rewardstream.contract.events import REJECT_REASONS, RejectReason
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.difference import (
    BETTER,
    NO_DIFFERENCE,
    UNDECIDED,
    WORSE,
    Rule,
    compare_agents,
)
from rewardstream.processors.core.difficulty import EDGES
from rewardstream.processors.engine.live import sides

if TYPE_CHECKING:
    from rewardstream.contract.events import EventKind
    from rewardstream.processors.core.profile import TaskFigures
    from rewardstream.processors.engine.live import AgentLive
    from rewardstream.processors.engine.runs import Run

__all__ = ["Metrics"]

# fine around the 0.5 s objective, so a p99 can be told from the histogram within 0.1 s
_LATENCY_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 10.0, 30.0),
)


class _LiveCollector(Collector):
    """Reward mean/std/min/max by (run, agent), completion by run, consumer lag, latency.

    An open run's additive series are this processor's share; a final run's every series is
    its final record's, the same on every processor whatever partitions it holds (some, none,
    some it lost or got back): ``max``, not ``sum``, over processors for those (the recording
    rules tell them apart by ``rewardstream_run_done``)."""

    def __init__(
        self,
        runs: Callable[[], dict[str, Run]],
        lag: Callable[[], dict[str, int]],
        folded: Callable[[], Iterator[Metric]],
        clock: Callable[[], float],
        compares: Sequence[tuple[str, str]],
        rule: Rule,
        level: float,
    ) -> None:
        self._runs, self._lag, self._folded, self._clock = runs, lag, folded, clock
        self._compares, self._rule, self._level = compares, rule, level

    def collect(self) -> Iterator[Metric]:
        yield from self._folded()
        stats = {
            name: GaugeMetricFamily(
                f"rewardstream_reward_{name}",
                f"reward {name} over the whole run (this processor's parts and its peers' "
                "member records; the final's once final)",
                labels=["run_id", "agent"],
            )
            for name in ("mean", "std", "min", "max")
        }
        bounds = {
            side: GaugeMetricFamily(
                f"rewardstream_reward_mean_{side}",
                f"{side} end of the mean reward's anytime-valid interval over the whole run "
                "(docs/intervals.md; absent once a reward fell outside its range)",
                labels=["run_id", "agent", "level"],
            )
            for side in ("lower", "upper")
        }
        # additive over processors while open (tasks, hence rollouts, are partitioned): PromQL's
        # sum by run_id and agent gives the run-wide mean and std (deploy/prometheus/rules.yml)
        additive = {
            name: GaugeMetricFamily(
                f"rewardstream_reward_{name}",
                f"{text} of the rewards of the rollouts consumed here (of the whole run once "
                "final)",
                labels=["run_id", "agent"],
            )
            for name, text in (
                ("count", "number"),
                ("sum", "sum"),
                ("sum_squares", "sum of the squares"),
            )
        }
        completion = GaugeMetricFamily(
            "rewardstream_run_completion_ratio",
            "rollouts of the whole run (this processor's and, as last heard, its peers'; the "
            "final's once final) / expected rollouts (NaN until its RunStarted arrives): max "
            "by run_id",
            labels=["run_id"],
        )
        tasks = GaugeMetricFamily(
            "rewardstream_run_tasks_complete",
            "tasks with every expected rollout consumed (a share per processor while open, "
            "the final's once final)",
            labels=["run_id"],
        )
        done = GaugeMetricFamily(
            "rewardstream_run_done",
            "1 once the run has its final profile (written by any processor of the group)",
            labels=["run_id"],
        )
        age = GaugeMetricFamily(
            "rewardstream_run_last_event_age_seconds",
            "seconds since the last event of a run without its final, as this processor knows "
            "(its own, dated by Kafka when read again after a restart, or a peer's)",
            labels=["run_id"],
        )
        failed = CounterMetricFamily(
            "rewardstream_failed_attempts",
            "failed attempts at rollouts the collector reported (every processor reads them "
            "all: max by run_id, not sum)",
            labels=["run_id", "agent", "failure_class"],
        )
        skipped = GaugeMetricFamily(
            "rewardstream_run_skipped_rows",
            "rows an early stop left out, per reason, as the collector's run_finished said (the "
            "final's once final): the run ended early, its final is partial",
            labels=["run_id", "reason"],
        )
        now = self._clock()
        task_figures: dict[str, dict[str, _Tasks]] = {}
        wholes: dict[str, dict[str, AgentLive]] = {}
        for run_id, run in self._runs().items():
            if run.terminal is not None and run.terminal.evicted:
                continue  # abandoned: its series go (docs/streaming.md, --evict-after)
            for agent, classes in run.failures.items():
                for failure_class, n in classes.items():
                    failed.add_metric([run_id, agent, failure_class], n)
            for reason, n in (run.skipped or {}).items():
                skipped.add_metric([run_id, reason], n)
            whole = wholes[run_id] = run.whole(now, figures=False)
            for agent, live in whole.items():
                reward = live.reward
                if reward.count:
                    for name, value in (
                        ("mean", reward.mean),
                        ("std", reward.std),
                        ("min", reward.min),
                        ("max", reward.max),
                    ):
                        stats[name].add_metric([run_id, agent], value)
                interval = live.interval(self._level)
                if interval["lower"] is not None:
                    level = repr(interval["level"])
                    for side in ("lower", "upper"):
                        bounds[side].add_metric([run_id, agent, level], interval[side])
            if run.done:
                shares = {agent: live.reward for agent, live in whole.items()}
                task_figures[run_id] = {a: _Tasks.of_final(live) for a, live in whole.items()}
            else:
                shares = {
                    a: s.columns[_REWARD] for a, s in run.live().items() if _REWARD in s.columns
                }
                task_figures[run_id] = {a: _Tasks.of(f) for a, f in run.task_figures().items()}
                age.add_metric([run_id], now - run.seen)
            for agent, reward in shares.items():
                if reward.count:
                    total = reward.count * reward.mean
                    additive["count"].add_metric([run_id, agent], reward.count)
                    additive["sum"].add_metric([run_id, agent], total)
                    additive["sum_squares"].add_metric(
                        [run_id, agent], reward.m2 + total * reward.mean
                    )
            expected = run.expected
            completion.add_metric([run_id], run.rollouts / expected if expected else math.nan)
            tasks.add_metric([run_id], run.tasks_complete())
            done.add_metric([run_id], float(run.done))
        yield from stats.values()
        yield from bounds.values()
        yield from additive.values()
        yield from (completion, tasks, done, age, failed, skipped)
        yield from _task_families(task_figures)
        yield from _compare_families(self._compares, wholes, self._rule)
        lag = GaugeMetricFamily(
            "rewardstream_consumer_lag", "messages behind the log end", labels=["partition"]
        )
        for partition, behind in self._lag().items():
            lag.add_metric([partition], behind)
        yield lag


_REWARD = "reward"
_TASK_KINDS = ("scored", "single", "zero_variance", "mixed", "all_max", "all_min")


class _Tasks(NamedTuple):
    """One agent's task figures as exported: counts by kind, pass@k sums and the per-task
    mean reward histogram (cumulative buckets and sum), where known."""

    kinds: dict[str, int]
    passes: dict[int, tuple[float, int]]
    histogram: tuple[list[float], float] | None

    @classmethod
    def of(cls, fig: TaskFigures) -> _Tasks:
        kinds = {kind: fig.difficulty[kind] for kind in _TASK_KINDS}  # type: ignore[literal-required]
        return cls(kinds, fig.passes, (list(map(float, fig.mean_le)), fig.mean_sum))

    @classmethod
    def of_final(cls, live: AgentLive) -> _Tasks:
        """From a final record (one of an older processor has no :attr:`AgentLive.spread`:
        no ``all_max``/``all_min`` nor histogram, then)."""
        kinds = {
            "scored": live.scored,
            "single": live.single,
            "zero_variance": live.zero_variance,
            "mixed": live.scored - live.zero_variance,
        }
        spread = live.spread
        if spread is None:
            return cls(kinds, live.passes, None)
        kinds |= {"all_max": spread.all_max, "all_min": spread.all_min}
        mean_sum = math.nan if spread.mean_sum is None else spread.mean_sum
        return cls(kinds, live.passes, (list(map(float, spread.mean_le)), mean_sum))


def _task_families(figures: dict[str, dict[str, _Tasks]]) -> Iterator[Metric]:
    """Task difficulty and pass@k by (run, agent), over this processor's tasks while the run is
    open (each family adds up over the processors of a group: tasks are partitioned, so
    run-wide values are sums: pass@k = sum(..._tasks_sum) / sum(..._tasks) by run_id, agent,
    k), over the whole run once final."""
    kinds = GaugeMetricFamily(
        "rewardstream_tasks",
        "tasks by reward spread: scored (2+ rollouts), single, zero_variance (all equal: no "
        "GRPO signal), mixed, all_max / all_min (all at the agent's highest / lowest reward)",
        labels=["run_id", "agent", "kind"],
    )
    pass_sum = GaugeMetricFamily(
        "rewardstream_pass_at_k_tasks_sum",
        "sum over tasks with at least k rollouts of their pass@k (0..1; NeMo Gym's estimator)",
        labels=["run_id", "agent", "k"],
    )
    pass_n = GaugeMetricFamily(
        "rewardstream_pass_at_k_tasks",
        "tasks with at least k rollouts (k: 1, the largest power of two below the most "
        "rollouts of a task, and that most)",
        labels=["run_id", "agent", "k"],
    )
    means = HistogramMetricFamily(
        "rewardstream_task_mean_reward",
        "per-task mean reward (the pass rate, for 0/1 rewards)",
        labels=["run_id", "agent"],
    )
    bounds = [*map(str, EDGES), "+Inf"]
    for run_id, agents in figures.items():
        for agent, fig in agents.items():
            for kind, n in fig.kinds.items():
                kinds.add_metric([run_id, agent, kind], n)
            for k, (total, n) in fig.passes.items():
                pass_sum.add_metric([run_id, agent, str(k)], total)
                pass_n.add_metric([run_id, agent, str(k)], n)
            if fig.histogram is not None:
                le, total = fig.histogram
                means.add_metric([run_id, agent], list(zip(bounds, le, strict=True)), total)
    yield from (kinds, pass_sum, pass_n, means)


# a number per verdict, so that its series lives as long as the pair (a label would start a new
# series at every change): alert on == 1 or == -1; undecided is NaN, which no comparison selects
_VERDICTS = {BETTER: 1.0, WORSE: -1.0, NO_DIFFERENCE: 0.0, UNDECIDED: math.nan}


def _compare_families(
    pairs: Sequence[tuple[str, str]], wholes: dict[str, dict[str, AgentLive]], rule: Rule
) -> Iterator[Metric]:
    """Per pair of runs both known here (not evicted) and agent in both, the difference of mean
    reward, its anytime-valid interval and the verdict (docs/intervals.md §Comparing two runs);
    no interval, no bounds nor verdict."""
    names = ["baseline", "candidate", "agent"]
    point = GaugeMetricFamily(
        "rewardstream_compare_difference",
        "candidate minus baseline mean reward over the whole runs (--compare)",
        labels=names,
    )
    bounds = {
        side: GaugeMetricFamily(
            f"rewardstream_compare_difference_{side}",
            f"{side} end of the difference's anytime-valid interval (docs/intervals.md)",
            labels=[*names, "level"],
        )
        for side in ("lower", "upper")
    }
    verdicts = GaugeMetricFamily(
        "rewardstream_compare_verdict",
        "1 better (lower end > noise floor), -1 worse (upper end < -noise floor), 0 no "
        "difference larger than the noise floor, NaN undecided",
        labels=[*names, "level", "noise_floor"],
    )
    level, floor = repr(rule.level), repr(rule.noise_floor)
    for baseline, candidate in pairs:
        if baseline not in wholes or candidate not in wholes:
            continue
        for row in compare_agents(sides(wholes[baseline]), sides(wholes[candidate]), rule)[
            "agents"
        ]:
            labels = [baseline, candidate, row["agent"]]
            if row["difference"] is not None:
                point.add_metric(labels, row["difference"])
            if row["lower"] is not None:
                for side, family in bounds.items():
                    family.add_metric([*labels, level], row[side])
                verdicts.add_metric([*labels, level, floor], _VERDICTS[row["verdict"]])
    yield from (point, *bounds.values(), verdicts)


class Metrics:
    """The processor's metrics, in their own registry (tests build one each)."""

    def __init__(
        self,
        runs: Callable[[], dict[str, Run]],
        lag: Callable[[], dict[str, int]] = dict,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        compares: Sequence[tuple[str, str]] = (),
        rule: Rule | None = None,
        level: float = DEFAULT_LEVEL,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the engine's (:attr:`rewardstream.processors.engine.pipeline.Pipeline.clock`),
        which times the runs' last events; ``compares``: (baseline, candidate) run ids whose
        comparison is exported, judged by ``rule``; ``level``: the mean reward intervals';
        ``wall``: the wall clock rollouts' publish times are read against."""
        self._wall = wall
        self.registry = registry or CollectorRegistry()
        self.duplicates = Counter(
            "rewardstream_duplicates_dropped",
            "redelivered or republished events dropped",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "rewardstream_events_rejected",
            "events that could not be used (dead letters), by kind and reason category",
            ["kind", "reason"],
            registry=self.registry,
        )
        for kind in ("input", "rollout", "control"):  # every series exists from the start
            for reason in REJECT_REASONS:
                self.rejected.labels(kind, reason)
        self._buckets = np.zeros(len(_LATENCY_BUCKETS) + 1, dtype=np.int64)  # last: +Inf
        self._latency_sum = 0.0
        self._consumed: dict[str, int] = {}  # rollouts by agent, folded
        self._agents: collections.Counter[str | None] = collections.Counter()  # since last fold
        self._latencies: list[float] = []
        live = _LiveCollector(runs, lag, self._families, clock, compares, rule or Rule(), level)
        self.registry.register(live)

    def duplicate(self, kind: EventKind, n: int = 1) -> None:
        self.duplicates.labels(kind).inc(n)

    def reject(self, kind: EventKind, reason: RejectReason, n: int = 1) -> None:
        self.rejected.labels(kind, reason).inc(n)

    def rollouts(self, agents: Sequence[str | None], published_at: Sequence[float]) -> None:
        """Note consumed rollouts (their agents, their publishers' clocks) and their
        publish-to-visible latency (the hot path)."""
        self._agents.update(agents)
        now = self._wall()
        self._latencies.extend([now - at for at in published_at])
        if len(self._latencies) >= 1 << 16:
            self.fold()

    def fold(self) -> None:
        """Move the noted rollouts into the counter and the latency buckets."""
        agents, self._agents = self._agents, collections.Counter()
        latencies, self._latencies = np.maximum(np.array(self._latencies), 0.0), []
        for agent, n in agents.items():
            self._consumed[agent or ""] = self._consumed.get(agent or "", 0) + n
        where = np.searchsorted(np.array(_LATENCY_BUCKETS), latencies, side="left")
        self._buckets += np.bincount(where, minlength=len(self._buckets))
        self._latency_sum += float(latencies.sum())

    def _families(self) -> Iterator[Metric]:
        """The folded counter and histogram, as of now."""
        self.fold()
        consumed = CounterMetricFamily(
            "rewardstream_rollouts_consumed",
            "rollouts consumed (deduplicated)",
            labels=["agent"],
        )
        for agent, n in self._consumed.items():
            consumed.add_metric([agent], n)
        yield consumed
        bounds = [*map(str, _LATENCY_BUCKETS), "+Inf"]
        cumulative = np.cumsum(self._buckets).tolist()
        yield HistogramMetricFamily(
            "rewardstream_publish_to_visible_seconds",
            "from the publisher's send to the rollout being in the live profile",
            buckets=list(zip(bounds, cumulative, strict=True)),
            sum_value=self._latency_sum,
        )
