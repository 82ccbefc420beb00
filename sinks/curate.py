"""``rewardstream curate``: the tasks worth training on, from a profile's task rows.

For GRPO-style training a task whose rollouts all score the same gives no gradient, and teams
keep the prompts whose pass rate lies in a band (commonly 20-80%). A profile's
``_reward_profiling.jsonl`` has one row per task (per task and agent under fan-out) with its
``mean/reward`` (the pass rate, for 0/1 rewards), its ``std/reward`` and its ``sample``: the
materialized input row. Curation keeps the rows in the band and/or above the std, and writes
each surviving task's sample once, in the profile's (task) order, without the collector's
``_ng_task_index`` / ``_ng_rollout_index``: a dataset row ready for the next collection.

With ``--confidence LEVEL`` a task is kept only when its pass rate's confidence sequence at
that level lies inside the band, not merely its mean: four passes of eight is a mean of 0.5 but
says little about the task, and a sequence may be read at any moment of a live run
(docs/intervals.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from rewardstream.contract.names import ProfilePaths
from rewardstream.errors import InputError
from rewardstream.infra.jsonl import iter_jsonl
from rewardstream.processors.core.confseq import bernoulli_interval
from rewardstream.processors.core.difficulty import EDGES
from rewardstream.sinks.files import write_files

__all__ = ["Criteria", "Curated", "curate", "find_profile", "report_lines"]

_INDEX_KEYS = ("_ng_task_index", "_ng_rollout_index")


class Criteria(NamedTuple):
    """Keep a task row when its mean reward is in ``band`` (inclusive) and its reward std is
    above ``min_std``; either may be None (not checked), not both. With ``confidence``, the
    band must hold the task's whole interval at that level (:func:`task_interval`)."""

    band: tuple[float, float] | None
    min_std: float | None
    confidence: float | None = None

    def check(self) -> None:
        if self.band is None and self.min_std is None:
            raise InputError("curate needs --band LO HI and/or --min-std S")
        if self.band is not None:
            lo, hi = self.band
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise InputError(f"--band needs finite LO <= HI, got {lo:g} {hi:g}")
        if self.min_std is not None and not math.isfinite(self.min_std):
            raise InputError(f"--min-std needs a finite number, got {self.min_std:g}")
        if self.confidence is not None:
            if self.band is None:
                raise InputError("--confidence needs --band LO HI")
            if not 0 < self.confidence < 1:
                raise InputError(f"--confidence needs a level in (0, 1), got {self.confidence:g}")

    def keeps(
        self, mean: float, std: float | None, interval: tuple[float, float] | None = None
    ) -> bool:
        """``interval``: the task's, which the band must hold instead of the mean."""
        low, high = (mean, mean) if interval is None else interval
        if self.band is not None and not self.band[0] <= low <= high <= self.band[1]:
            return False
        return self.min_std is None or (std is not None and std > self.min_std)


class _Intervals:
    """The task intervals of a run's ``_intervals.json`` at ``level``, by (agent, task); none
    when the file is absent or was written at another level."""

    def __init__(self, profile: Path, level: float) -> None:
        self.path = ProfilePaths(profile, profile, profile).intervals
        self.level = level
        self._by_task: dict[tuple[str, Any], tuple[Any, Any]] = {}
        if not self.path.is_file():
            return
        written = orjson.loads(self.path.read_bytes())
        if not math.isclose(written.get("level", math.nan), level):
            return
        for agent in written.get("agents", []):
            name = agent.get("agent_ref", {}).get("name", "")
            for task in agent.get("tasks", []):
                ends = (task.get("lower"), task.get("upper"))
                self._by_task[name, task.get("_ng_task_index")] = ends

    def of(self, agent: str, task: Any) -> tuple[float, float]:
        lower, upper = self._by_task.get((agent, task), (None, None))
        if _number(lower) is None or _number(upper) is None:
            whose = f"task {task}" + (f" of agent {agent!r}" if agent else "")
            raise InputError(
                f"{whose} has rewards other than 0 and 1: --confidence "
                f"{self.level:g} needs its interval from {self.path.name} at that level "
                "(written with the aggregate metrics, at 0.95)"
            )
        return float(lower), float(upper)


def _binary_counts(row: dict[str, Any]) -> tuple[int, int] | None:
    """(passes, rollouts) of a task row whose rewards are all 0 or 1, as its min, max, mean
    and std show (the std tells {0, 1} from {0, 1/2, 1} with the same mean), else None."""
    n, mean = row.get("num_rollouts"), _number(row.get("mean/reward"))
    low, high = _number(row.get("min/reward")), _number(row.get("max/reward"))
    if type(n) is not int or n < 1 or mean is None or low not in (0, 1) or high not in (0, 1):
        return None
    passes = round(mean * n)
    if abs(mean * n - passes) > 1e-9 * n:
        return None
    if n > 1:
        std = _number(row.get("std/reward"))
        if std is None or abs(std - math.sqrt(passes * (n - passes) / (n * (n - 1)))) > 1e-9:
            return None
    return passes, n


def task_interval(row: dict[str, Any], intervals: _Intervals) -> tuple[float, float]:
    """A task row's pass-rate confidence sequence at ``intervals.level``: from its passes and
    rollouts for 0/1 rewards (:func:`~rewardstream.processors.core.confseq.bernoulli_interval`),
    else the one the run's ``_intervals.json`` holds; InputError when there is none."""
    counts = _binary_counts(row)
    if counts is None:
        return intervals.of(_agent(row), row.get("_ng_task_index"))
    lower, upper = bernoulli_interval(
        np.array([counts[0]]), np.array([counts[1]]), 1 - intervals.level
    )
    return float(lower[0]), float(upper[0])


class Curated(NamedTuple):
    """Per agent: tasks seen, tasks kept, and histograms of the mean rewards of all scored
    tasks and of the kept ones (the bins of
    :data:`~rewardstream.processors.core.difficulty.EDGES`, then below 0 and above 1)."""

    seen: dict[str, int]
    kept: dict[str, int]
    histogram: dict[str, list[int]]
    kept_histogram: dict[str, list[int]]
    unscored: int  # rows without a numeric mean/reward: never kept
    written: int  # distinct tasks written


def find_profile(where: Path) -> Path:
    """``where`` itself (a ``*_reward_profiling.jsonl``), or the one such file in a folder."""
    if where.is_dir():
        found = sorted(where.glob("*_reward_profiling.jsonl"))
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise InputError(f"{where}: {what} *_reward_profiling.jsonl files; name one")
        return found[0]
    if not where.is_file():
        raise InputError(f"Input file not found: '{where}'")
    return where


def _agent(row: dict[str, Any]) -> str:
    ref = row.get("agent_ref")
    if not isinstance(ref, dict):
        sample = row.get("sample")
        ref = sample.get("agent_ref") if isinstance(sample, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else ""


def _bin(mean: float) -> int:
    if mean < 0:
        return 10
    if mean > 1:
        return 11
    return min(bisect.bisect_right(EDGES, mean) - 1, 9)


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def curate(profile: Path, out: Path, criteria: Criteria) -> Curated:
    """Write the surviving tasks' samples to ``out`` (all or nothing); raises InputError when
    none survives (nothing is written then)."""
    criteria.check()
    seen: dict[str, int] = {}
    kept: dict[str, int] = {}
    histogram: dict[str, list[int]] = {}
    kept_histogram: dict[str, list[int]] = {}
    unscored = 0
    tasks: dict[Any, bytes] = {}
    confidence = None if criteria.confidence is None else _Intervals(profile, criteria.confidence)

    for line in iter_jsonl(profile):
        row = line.value
        if not isinstance(row, dict) or not isinstance(row.get("sample"), dict):
            raise InputError(f"{profile} line {line.lineno}: not a task row with a 'sample'")
        agent = _agent(row)
        seen[agent] = seen.get(agent, 0) + 1
        mean = _number(row.get("mean/reward"))
        if mean is None:
            unscored += 1
            continue
        histogram.setdefault(agent, [0] * 12)[_bin(mean)] += 1
        interval = None if confidence is None else task_interval(row, confidence)
        if not criteria.keeps(mean, _number(row.get("std/reward")), interval):
            continue
        kept[agent] = kept.get(agent, 0) + 1
        kept_histogram.setdefault(agent, [0] * 12)[_bin(mean)] += 1
        sample = row["sample"]
        task = sample.get("_ng_task_index", line.lineno)
        if task not in tasks:
            plain = {k: v for k, v in sample.items() if k not in _INDEX_KEYS}
            tasks[task] = orjson.dumps(plain) + b"\n"
    result = Curated(seen, kept, histogram, kept_histogram, unscored, len(tasks))
    if not tasks:
        total = sum(seen.values())
        why = "no task row has a numeric mean/reward" if unscored == total else "none passes"
        raise InputError(f"no task survives of {total} in {profile}: {why}; nothing written")
    write_files([(out, iter(tasks.values()))])
    return result


def report_lines(result: Curated) -> Iterator[str]:
    """Per agent: kept of seen, and the mean-reward histogram of the kept tasks beside all
    scored ones (``#`` kept, ``.`` left out; a collapsing set is a finding)."""
    labels = [f"{EDGES[i]:.1f}-{EDGES[i + 1]:.1f}" for i in range(10)] + ["<0", ">1"]
    for agent in sorted(result.seen):
        name = agent or "(no agent)"
        kept, seen = result.kept.get(agent, 0), result.seen[agent]
        yield f"{name}: kept {kept} of {seen} tasks ({100.0 * kept / seen:.1f}%)"
        every = result.histogram.get(agent, [0] * 12)
        chosen = result.kept_histogram.get(agent, [0] * 12)
        top = max(every) or 1
        yield f"  {'':19} {'kept':>7} {'of all':>7}  (# kept, . left out)"
        for label, k, n in zip(labels, chosen, every, strict=True):
            if n or label[0].isdigit():
                bar = "#" * round(30 * k / top) + "." * (round(30 * n / top) - round(30 * k / top))
                yield f"  mean reward {label:>7} {k:>7} {n:>7}  {bar}".rstrip()
    if result.unscored:
        yield f"{result.unscored} task rows without a numeric mean/reward were left out"
    yield f"wrote {result.written} tasks"
