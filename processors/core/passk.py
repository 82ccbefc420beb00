"""pass@k, pass@1[avg-of-k] and majority@k as NeMo Gym 0.7.0's
``compute_pass_majority_metrics`` computes them (docs/nemo-gym-compat.md §pass@k and
majority@k), from columns.

Pure, no I/O. The input is one group's scored rollouts (an agent's, in a run) in (task, rollout)
order, as the profile already holds them; the state keeps every value by (task, rollout), so a
snapshot, a final profile and the batch command all compute from what has arrived, in any
order, on any number of merged parts.

Exactness: NeMo Gym sums with Python's built-in ``sum``, and it runs on Python >= 3.13, whose
``sum`` of floats is Neumaier's compensated sum (since 3.12), not a plain left-to-right one.
Every sum here is that sum, in NeMo Gym's order (:func:`_neumaier`: the running sum is a plain
``cumsum``, so each step's rounding error is known at once, and the compensation is the running
sum of those), and ``1 - C(n_wrong, k) / C(n, k)`` is computed with Python's exact integers: the
batch file equals NeMo Gym's to the bit, whatever Python runs this. CPython adds an int item
(a reward written as a JSON int) without compensating, so which values were ints is followed
too, through ``max`` (the first largest value is the one returned) and ``Counter`` (the first
of equal keys is the one kept).

Scores: ``accuracy`` is the rollout's ``reward`` (NeMo Gym's default score function; bools count
as 0/1). With an answer key, ``no_answer`` is 1 where the rollout has no answer. Answers enter
as 64-bit identities (:func:`~rewardstream.processors.core.records.answer_id`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from rewardstream.processors.core.records import NO_ANSWER

__all__ = ["curve_ks", "key_metrics", "live_ks", "pass_at_k_sums", "pass_majority_metrics"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

STAT_NAMES = ("std_dev_across_runs", "std_err_across_runs", "avg_sample_std_dev")  # never scores


def _neumaier(values: F64, axis: int = -1, ints: B | None = None) -> tuple[F64, F64]:
    """The running sums of ``values`` along ``axis`` as CPython >= 3.12's ``sum`` computes them:
    ``(plain, compensation)``; a prefix's sum is ``plain + compensation`` where the
    compensation is non-zero and finite (:func:`_total`). ``ints`` marks items that were
    Python ints: CPython adds those exactly while only ints have come, afterwards as floats
    without compensating, and it compensates only from the second float on."""
    plain = np.cumsum(values, axis=axis)
    prev = np.roll(plain, 1, axis=axis)
    np.moveaxis(prev, axis, 0)[0] = 0.0  # the first item is added to sum's start, 0
    error = np.where(
        np.abs(prev) >= np.abs(values), (prev - plain) + values, (values - plain) + prev
    )
    if ints is not None:
        floats_before: I64 = np.cumsum(~ints, axis=axis) - ~ints  # floats among earlier items
        error = np.where(ints | (floats_before == 0), 0.0, error)
    return plain, np.cumsum(error, axis=axis)


def _total(plain: F64 | float, compensation: F64 | float) -> F64:
    """Where the compensation is non-zero and finite, the plain sum plus it (CPython's rule)."""
    ok = (compensation != 0) & np.isfinite(compensation)
    out: F64 = np.where(ok, np.add(plain, compensation), plain)
    return out


def _psum(values: list[float]) -> float:
    """Python >= 3.12's ``sum`` of a short list of floats (the std of a few run averages)."""
    plain, compensation = _neumaier(np.asarray(values, dtype=np.float64))
    return float(_total(plain[-1], compensation[-1]))


def _mean_pct(values: F64, ints: B | None = None) -> float:
    """``100.0 * sum(values) / len(values)``, in NeMo Gym's order of operations."""
    plain, compensation = _neumaier(values, ints=ints)
    return 100.0 * float(_total(plain[-1], compensation[-1])) / len(values)


class _Tasks:
    """The rollouts of one group as (task x position) matrices, NaN-padded."""

    def __init__(self, task: I64) -> None:
        n = len(task)
        starts = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
        self.sizes = np.diff(np.r_[starts, n]).astype(np.int64)
        self.count = len(starts)
        self.of = np.repeat(np.arange(self.count), self.sizes)  # task number of each rollout
        self.pos = np.arange(n) - np.repeat(starts, self.sizes)  # position within its task
        self.max_k = int(self.sizes.max())

    def matrix(self, values: F64) -> F64:
        out = np.full((self.count, self.max_k), np.nan)
        out[self.of, self.pos] = values
        return out

    def flags(self, ints: B) -> B:
        out = np.zeros((self.count, self.max_k), dtype=bool)
        out[self.of, self.pos] = ints
        return out


class _Score:
    """What every k needs of one score, computed once."""

    def __init__(self, tasks: _Tasks, values: F64, ints: B) -> None:
        m = tasks.matrix(values)
        self.matrix, self.ints = m, tasks.flags(ints)
        plain, compensation = _neumaier(np.nan_to_num(m), axis=1, ints=self.ints)
        self.running_sum = _total(plain, compensation)
        self.running_max = np.fmax.accumulate(m, axis=1)
        # which value Python's max(vals[:k]) returns (its int-ness counts): the first largest
        self.max_at = np.zeros((tasks.count, tasks.max_k), dtype=np.int64)
        for j in range(1, tasks.max_k):
            later = m[:, j] > self.running_max[:, j - 1]
            self.max_at[:, j] = np.where(later, j, self.max_at[:, j - 1])
        self.binary = np.all(np.isnan(m) | (m == 0) | (m == 1), axis=1)  # over all its values
        self.wrong = np.sum(m == 0, axis=1)

    def pass_at(
        self, tasks: _Tasks, k: int, comb: dict[tuple[int, int, int], float]
    ) -> tuple[F64, B]:
        """Per task with at least ``k`` values: the unbiased estimator for a 0/1 task, else
        the max of its first ``k`` values; and which of those are Python ints."""
        has = np.flatnonzero(tasks.sizes >= k)
        out: F64 = self.running_max[has, k - 1]
        binary, n, wrong = self.binary[has], tasks.sizes[has], self.wrong[has]
        ints = self.ints[has, self.max_at[has, k - 1]] & ~binary
        out[binary & (wrong < k)] = 1.0
        open_ = np.flatnonzero(binary & (wrong >= k))
        if len(open_):
            codes = n[open_] * (tasks.max_k + 1) + wrong[open_]
            unique, inverse = np.unique(codes, return_inverse=True)
            table = []
            for code in unique.tolist():
                total, incorrect = divmod(code, tasks.max_k + 1)
                key = (total, incorrect, k)
                if key not in comb:
                    comb[key] = 1.0 - math.comb(incorrect, k) / math.comb(total, k)
                table.append(comb[key])
            out[open_] = np.asarray(table)[inverse.ravel()]
        return out, ints

    def avg_of(self, tasks: _Tasks, k: int) -> F64:
        """Per task: the mean of its first ``k`` values."""
        took = np.minimum(tasks.sizes, k)
        avg: F64 = self.running_sum[np.arange(tasks.count), took - 1] / took
        return avg

    def column(self, i: int) -> tuple[F64, B]:
        """The values at position ``i`` of the tasks that have one, and their int flags."""
        present = ~np.isnan(self.matrix[:, i])
        return self.matrix[present, i], self.ints[present, i]


class _Votes:
    """The (task, answer, score) pairs, as ``Counter`` keys them, for majority@k."""

    def __init__(self, tasks: _Tasks, score: F64, ints: B, answers: I64) -> None:
        self.tasks, self.score, self.ints = tasks, score, ints
        self.answered = answers != NO_ANSWER
        bits = (score + 0.0).view(np.int64)  # -0.0 == 0.0 in Python: one key
        keys = np.lexsort((bits, answers, tasks.of))
        t, a, b = tasks.of[keys], answers[keys], bits[keys]
        new = np.r_[True, (t[1:] != t[:-1]) | (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
        self.group = np.empty(len(keys), dtype=np.int64)
        self.group[keys] = np.cumsum(new) - 1
        # lexsort is stable and rows are in (task, position) order: a group's first row in
        # the sort is its first rollout (Counter keeps that key, an int or a float)
        self.first = keys[new]
        self.order = np.lexsort((tasks.pos[self.first], tasks.of[self.first]))  # Counter's

    def majority(self, k: int) -> F64:
        """Per task: the mean score of the most frequent pairs among its first ``k`` rollouts
        with an answer (ties averaged in first-seen order); 0 for a task with none."""
        tasks, first = self.tasks, self.first
        live = (tasks.pos < k) & self.answered
        counts = np.bincount(self.group[live], minlength=len(first))
        active = self.order[counts[self.order] > 0]  # by task, then first position
        task_of = tasks.of[first[active]]
        top = np.zeros(tasks.count, dtype=np.int64)
        if len(active):
            starts = np.flatnonzero(np.r_[True, task_of[1:] != task_of[:-1]])
            top[task_of[starts]] = np.maximum.reduceat(counts[active], starts)
        tied = first[active[counts[active] == top[task_of]]]
        t_tied, s_tied, i_tied = tasks.of[tied], self.score[tied], self.ints[tied]
        plain, compensation = np.zeros(tasks.count), np.zeros(tasks.count)
        float_seen = np.zeros(tasks.count, dtype=bool)
        n_tied = np.bincount(t_tied, minlength=tasks.count)
        if len(tied):  # Python's sum by rank within the task, compensated as it compensates
            starts = np.flatnonzero(np.r_[True, t_tied[1:] != t_tied[:-1]])
            rank = np.arange(len(tied)) - np.repeat(starts, np.diff(np.r_[starts, len(tied)]))
            for r in range(int(rank.max()) + 1):
                at = rank == r
                who, x, is_int = t_tied[at], s_tied[at], i_tied[at]
                before = plain[who]
                after = before + x
                big = np.abs(before) >= np.abs(x)
                error = np.where(big, (before - after) + x, (x - after) + before)
                compensation[who] += np.where(is_int | ~float_seen[who], 0.0, error)
                float_seen[who] |= ~is_int
                plain[who] = after
        total = _total(plain, compensation)
        out = np.zeros(tasks.count)
        voted = n_tied > 0
        out[voted] = total[voted] / n_tied[voted]
        return out


def pass_majority_metrics(
    task: I64, reward: F64, answers: I64 | None = None, reward_int: B | None = None
) -> dict[str, Any]:
    """NeMo Gym's ``compute_pass_majority_metrics(tasks, answer_key=...)[0]`` for one group.

    ``task`` and ``reward`` are per rollout in (task, rollout) order; ``answers`` the answer
    identities (:func:`~rewardstream.processors.core.records.answer_id`) when an answer key is set;
    ``reward_int`` which rewards were ints (or bools) in their rows, which Python sums
    differently (default: none).
    """
    if not len(task):
        return {}
    tasks = _Tasks(task)
    values = {"accuracy": reward}
    ints = {"accuracy": np.zeros(len(task), bool) if reward_int is None else reward_int}
    if answers is not None:  # NeMo Gym's no_answer is 1 if the answer is None, else 0: ints
        values["no_answer"] = (answers == NO_ANSWER).astype(np.float64)
        ints["no_answer"] = np.ones(len(task), bool)
    names = sorted(values)
    scores = {name: _Score(tasks, values[name], ints[name]) for name in names}
    # majority@k/no_answer votes only among rollouts with an answer, whose no_answer is 0:
    # it is 0 for every task, as NeMo Gym's loop finds, without counting the votes
    votes = _Votes(tasks, reward, ints["accuracy"], answers) if answers is not None else None
    nobody = np.zeros(tasks.count)
    comb: dict[tuple[int, int, int], float] = {}
    metrics: dict[str, Any] = {}
    for k in range(1, tasks.max_k + 1):
        for name in names:
            passed, passed_int = scores[name].pass_at(tasks, k, comb)
            if len(passed):
                metrics[f"pass@{k}/{name}"] = _mean_pct(passed, passed_int)
            metrics[f"pass@1[avg-of-{k}]/{name}"] = _mean_pct(scores[name].avg_of(tasks, k))
            if votes is not None:
                voted = votes.majority(k) if name == "accuracy" else nobody
                metrics[f"majority@{k}/{name}"] = _mean_pct(voted)
    per_sample: dict[str, list[float]] = {name: [] for name in names}
    for i in range(tasks.max_k):
        for name in names:
            per_sample[name].append(_mean_pct(*scores[name].column(i)))
    metrics["per_sample_aggregate"] = per_sample
    for k in range(2, tasks.max_k + 1):
        for name in names:
            runs = per_sample[name][:k]
            mean = _psum(runs) / len(runs)
            std = math.sqrt(_psum([(x - mean) ** 2 for x in runs]) / (len(runs) - 1))
            metrics[f"pass@1[avg-of-{k}]/{name}/std_dev_across_runs"] = std
            metrics[f"pass@1[avg-of-{k}]/{name}/std_err_across_runs"] = std / math.sqrt(len(runs))
    return metrics


def live_ks(max_k: int) -> list[int]:
    """The bounded set of k shown live: 1, the largest power of two below ``max_k``, and
    ``max_k`` itself (so a series per agent and run, never per k up to 128)."""
    below = 1 << max(0, (max_k - 1).bit_length() - 1)
    return sorted({1, below, max_k} - {0})


def curve_ks(max_k: int) -> list[int]:
    """The k of a pass@k curve (the live page's): the powers of two up to ``max_k``, and
    ``max_k`` itself."""
    return sorted({1 << i for i in range(max_k.bit_length())} | ({max_k} - {0}))


def pass_at_k_sums(task: I64, reward: F64, ks: list[int]) -> dict[int, tuple[float, int]]:
    """Per k: the sum over tasks with at least k rollouts of their pass@k (a fraction, as
    :func:`pass_majority_metrics` averages it) and how many such tasks. Sums over disjoint
    sets of tasks add up, so processors each report theirs and a query divides the totals."""
    if not len(task):
        return {}
    tasks = _Tasks(task)
    score = _Score(tasks, reward, np.zeros(len(task), dtype=bool))
    comb: dict[tuple[int, int, int], float] = {}
    out = {}
    for k in ks:
        values, _ = score.pass_at(tasks, k, comb)
        out[k] = (float(values.sum()), len(values))
    return out


def _highest_k(
    metrics: Mapping[str, Any], prefix: str, suffix: str, exclude: tuple[str, ...]
) -> dict[str, Any]:
    """NeMo Gym's ``highest_k_metrics(metrics, prefix + "{k}" + suffix, exclude_names=...)``."""
    found: list[tuple[int, str]] = []
    for key in metrics:
        head, sep, name = key.partition("/")
        if not sep or not head.startswith(prefix) or not head.endswith(suffix):
            continue
        k = head[len(prefix) : len(head) - len(suffix)]
        if not k.isdigit() or name.endswith(STAT_NAMES) or name in exclude:
            continue
        found.append((int(k), key))
    top = max((k for k, _ in found), default=0)
    return {key: metrics[key] for k, key in found if k == top}


def key_metrics(agent_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The headline metrics NeMo Gym's pass@k servers (``math_with_judge``) pick: mean input
    and output tokens, then the highest-k avg-of-k, pass@k and majority@k (no ``no_answer``
    but for avg-of-k)."""
    key = {
        n: agent_metrics[n]
        for n in ("mean/input_tokens", "mean/output_tokens")
        if n in agent_metrics
    }
    key |= _highest_k(agent_metrics, "pass@1[avg-of-", "]", ())
    key |= _highest_k(agent_metrics, "pass@", "", ("no_answer",))
    key |= _highest_k(agent_metrics, "majority@", "", ("no_answer",))
    return key
