"""Prometheus metrics of the stream processor.

Counters and the latency histogram are updated as events are applied; reward statistics are
computed at scrape time by a custom collector from the live Welford moments of each run and
agent, so a scrape costs O(runs x agents), never O(rollouts). No label is per task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from processors.runs import Run

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _LiveCollector(Collector):
    """Reward mean/std/min/max by (run, agent), completion by run, and consumer lag."""

    def __init__(
        self, runs: Callable[[], dict[str, Run]], lag: Callable[[], dict[str, int]]
    ) -> None:
        self._runs, self._lag = runs, lag

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = {
            name: GaugeMetricFamily(
                f"rewardstream_reward_{name}",
                f"reward {name} over consumed rollouts",
                labels=["run_id", "agent"],
            )
            for name in ("mean", "std", "min", "max")
        }
        completion = GaugeMetricFamily(
            "rewardstream_run_completion_ratio",
            "rollouts consumed here / expected rollouts of a run (NaN until its RunStarted "
            "arrives); processors of one group each report their share: sum by run_id",
            labels=["run_id"],
        )
        tasks = GaugeMetricFamily(
            "rewardstream_run_tasks_complete",
            "tasks with every expected rollout consumed (a share per processor, like completion)",
            labels=["run_id"],
        )
        for run_id, run in self._runs().items():
            for agent, live in run.live().items():
                reward = live.columns.get("reward")
                if reward is None or reward.count == 0:
                    continue
                for name, value in (
                    ("mean", reward.mean),
                    ("std", reward.std),
                    ("min", reward.min),
                    ("max", reward.max),
                ):
                    stats[name].add_metric([run_id, agent], value)
            expected = run.expected
            completion.add_metric(
                [run_id], run.local_rollouts / expected if expected else float("nan")
            )
            tasks.add_metric([run_id], run.tasks_complete())
        yield from stats.values()
        yield completion
        yield tasks
        lag = GaugeMetricFamily(
            "rewardstream_consumer_lag", "messages behind the log end", labels=["partition"]
        )
        for partition, behind in self._lag().items():
            lag.add_metric([partition], behind)
        yield lag


class Metrics:
    """The processor's metrics, in their own registry (tests build one each)."""

    def __init__(
        self,
        runs: Callable[[], dict[str, Run]],
        lag: Callable[[], dict[str, int]] = dict,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.rollouts = Counter(
            "rewardstream_rollouts_consumed",
            "rollouts consumed (deduplicated)",
            ["agent"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "rewardstream_duplicates_dropped",
            "redelivered or republished events dropped",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "rewardstream_events_rejected",
            "events that could not be used",
            ["kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "rewardstream_publish_to_visible_seconds",
            "from the publisher's send to the rollout being in the live profile",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_LiveCollector(runs, lag))
        self._consumed: dict[str | None, Counter] = {}  # children by agent: labels() is slow

    def rollout(self, agent: str | None, published_at: float) -> None:
        """Count one consumed rollout and its publish-to-visible latency (per event: cheap)."""
        child = self._consumed.get(agent)
        if child is None:
            child = self._consumed[agent] = self.rollouts.labels(agent or "")
        child.inc()
        self.latency.observe(max(0.0, time.time() - published_at))
