"""Task difficulty: how a group's tasks spread between always solved, never solved and mixed.

Pure, no I/O. For GRPO-style training a task whose rollouts all score the same gives no
gradient (DAPO's dynamic sampling, veRL's, OpenRLHF's and SkyRL's filters drop such groups), so
the figure that matters live is the share of tasks with zero reward variance, and where the
rest lie: the distribution of per-task mean reward (the pass rate, for 0/1 rewards).

Definitions (per group, e.g. an agent in a run, over its measured rollouts with a reward):

- ``tasks``: tasks with at least one rollout; ``single``: those with exactly one (no variance
  can be seen yet); ``scored``: those with two or more;
- ``all_max`` / ``all_min``: scored tasks whose rollouts all equal the group's highest /
  lowest reward; ``zero_variance``: scored tasks whose rollouts are all equal (all_max and
  all_min included: a constant in between counts here only); ``mixed`` = scored - zero_variance;
  ``zero_variance_share`` = zero_variance / scored (None with nothing scored);
- ``mean_reward``: a histogram of per-task mean reward over :data:`EDGES` (bin ``i`` is
  ``[EDGES[i], EDGES[i+1])``, the last one closed), with ``below`` / ``above`` for means
  outside ``[0, 1]`` (continuous rewards).

The counts add up across disjoint sets of tasks (partitions, processors): Prometheus sums them.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

__all__ = ["EDGES", "Difficulty", "difficulty", "task_means"]

EDGES = tuple(i / 10 for i in range(11))


class Difficulty(TypedDict):
    tasks: int
    rollouts: int
    single: int
    scored: int
    all_max: int
    all_min: int
    zero_variance: int
    mixed: int
    zero_variance_share: float | None
    reward_min: float | None
    reward_max: float | None
    mean_reward: dict[str, Any]


def _share(zero: int, scored: int) -> float | None:
    return zero / scored if scored else None


def task_means(
    task: npt.NDArray[np.int64], reward: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Each task's mean reward, from rollouts in task order (``task`` ascending)."""
    if not len(task):
        return np.zeros(0)
    starts = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
    means: npt.NDArray[np.float64] = np.add.reduceat(reward, starts) / np.diff(
        np.r_[starts, len(task)]
    )
    return means


def difficulty(task: npt.NDArray[np.int64], reward: npt.NDArray[np.float64]) -> Difficulty:
    """The figures of one group, from its rollouts in task order (``task`` ascending)."""
    n = len(task)
    if not n:
        return _empty()
    starts = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
    sizes = np.diff(np.r_[starts, n])
    lo, hi = float(reward.min()), float(reward.max())
    t_min = np.minimum.reduceat(reward, starts)
    t_max = np.maximum.reduceat(reward, starts)
    means = task_means(task, reward)
    scored = sizes >= 2
    same = scored & (t_min == t_max)
    counts, below, above = _histogram(means)
    return Difficulty(
        tasks=len(starts),
        rollouts=n,
        single=int((~scored).sum()),
        scored=int(scored.sum()),
        all_max=int((same & (t_min == hi)).sum()),
        all_min=int((same & (t_max == lo)).sum()),
        zero_variance=int(same.sum()),
        mixed=int((scored & ~same).sum()),
        zero_variance_share=_share(int(same.sum()), int(scored.sum())),
        reward_min=lo,
        reward_max=hi,
        mean_reward={"edges": list(EDGES), "counts": counts, "below": below, "above": above},
    )


def _histogram(means: npt.NDArray[np.float64]) -> tuple[list[int], int, int]:
    inside = (means >= 0) & (means <= 1)
    bins = np.minimum(np.searchsorted(EDGES, means[inside], side="right") - 1, 9)
    counts = np.bincount(bins, minlength=10)
    return counts.tolist(), int((means < 0).sum()), int((means > 1).sum())


def _empty() -> Difficulty:
    hist = {"edges": list(EDGES), "counts": [0] * 10, "below": 0, "above": 0}
    return Difficulty(
        tasks=0,
        rollouts=0,
        single=0,
        scored=0,
        all_max=0,
        all_min=0,
        zero_variance=0,
        mixed=0,
        zero_variance_share=None,
        reward_min=None,
        reward_max=None,
        mean_reward=hist,
    )
