"""``rewardstream curate``: the tasks worth training on, from a profile's task rows.

For GRPO-style training a task whose rollouts all score the same gives no gradient, and teams
keep the prompts whose pass rate lies in a band (commonly 20-80%). A profile's
``_reward_profiling.jsonl`` has one row per task (per task and agent under fan-out) with its
``mean/reward`` (the pass rate, for 0/1 rewards), its ``std/reward`` and its ``sample``: the
materialized input row. Curation keeps the rows in the band and/or above the std, and writes
each surviving task's sample once, in the profile's (task) order, without the collector's
``_ng_task_index`` / ``_ng_rollout_index``: a dataset row ready for the next collection.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InputError
from rewardstream.infra.jsonl import iter_jsonl
from rewardstream.processors.core.difficulty import EDGES
from rewardstream.sinks.files import write_files

__all__ = ["Criteria", "Curated", "curate", "find_profile", "report_lines"]

_INDEX_KEYS = ("_ng_task_index", "_ng_rollout_index")


class Criteria(NamedTuple):
    """Keep a task row when its mean reward is in ``band`` (inclusive) and its reward std is
    above ``min_std``; either may be None (not checked), not both."""

    band: tuple[float, float] | None
    min_std: float | None

    def check(self) -> None:
        if self.band is None and self.min_std is None:
            raise InputError("curate needs --band LO HI and/or --min-std S")
        if self.band is not None:
            lo, hi = self.band
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise InputError(f"--band needs finite LO <= HI, got {lo:g} {hi:g}")
        if self.min_std is not None and not math.isfinite(self.min_std):
            raise InputError(f"--min-std needs a finite number, got {self.min_std:g}")

    def keeps(self, mean: float, std: float | None) -> bool:
        if self.band is not None and not self.band[0] <= mean <= self.band[1]:
            return False
        return self.min_std is None or (std is not None and std > self.min_std)


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
        if not criteria.keeps(mean, _number(row.get("std/reward"))):
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
