"""NeMo Gym 0.7.0's pass@k reference, transcribed for the tests (not the code under test).

``compute_pass_majority_metrics`` and ``highest_k_metrics`` of ``nemo_gym/reward_profile.py``
(Apache-2.0, NVIDIA) and the ``get_key_metrics`` of its ``math_with_judge`` server, kept as
plain Python over lists of dicts so that ``rewardstream.processors.core.passk``, which computes the
same numbers from columns, is checked against the definition rather than against itself.

NeMo Gym 0.7.0 runs on Python >= 3.13, whose built-in ``sum`` of floats is compensated
(Neumaier, since 3.12): :func:`psum` is that ``sum`` on any Python
(:func:`rewardstream.processors.core.kernels.builtin_sum`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from rewardstream.processors.core.kernels import builtin_sum as psum

STATS = ("std_dev_across_runs", "std_err_across_runs", "avg_sample_std_dev")


def compute_pass_majority_metrics(
    tasks: list[list[dict[str, Any]]], answer_key: str | None = None
) -> dict[str, Any]:
    if not tasks:
        return {}
    max_k = max(len(rollouts) for rollouts in tasks)
    metrics: dict[str, Any] = {}
    all_score_dicts: list[list[dict[str, float]]] = []
    all_answers: list[list[Any]] = []
    for rollouts in tasks:
        task_scores, task_answers = [], []
        for r in rollouts:
            raw = {"accuracy": r["reward"]}
            scores = {k: (int(v) if isinstance(v, bool) else v) for k, v in raw.items()}
            if answer_key is not None:
                answer = r.get(answer_key)
                task_answers.append(answer)
                scores["no_answer"] = 1 if answer is None else 0
            task_scores.append(scores)
        all_score_dicts.append(task_scores)
        if answer_key is not None:
            all_answers.append(task_answers)
    score_names = sorted({name for ts in all_score_dicts for s in ts for name in s})
    for k in range(1, max_k + 1):
        for name in score_names:
            pass_values = []
            for task_scores in all_score_dicts:
                vals = [s.get(name) for s in task_scores if name in s]
                if not vals or k > len(vals):
                    continue
                if all(v in (0, 1, 0.0, 1.0) for v in vals):
                    n_total = len(vals)
                    n_incorrect = sum(1 for v in vals if not v)
                    if n_incorrect < k:
                        pass_values.append(1.0)
                    else:
                        pass_values.append(1.0 - math.comb(n_incorrect, k) / math.comb(n_total, k))
                else:
                    pass_values.append(max(vals[:k]))  # type: ignore[type-var, arg-type]
            if pass_values:
                metrics[f"pass@{k}/{name}"] = 100.0 * psum(pass_values) / len(pass_values)
            avg_values = []
            for task_scores in all_score_dicts:
                vals = [s.get(name) for s in task_scores[:k] if name in s]
                if vals:
                    avg_values.append(psum(vals) / len(vals))
            if avg_values:
                metrics[f"pass@1[avg-of-{k}]/{name}"] = 100.0 * psum(avg_values) / len(avg_values)
            if answer_key is not None:
                majority_values: list[float] = []
                for task_scores, task_answers in zip(all_score_dicts, all_answers, strict=True):
                    valid = [
                        (a, s.get(name))
                        for a, s in zip(task_answers[:k], task_scores[:k], strict=False)
                        if a is not None and name in s
                    ]
                    if not valid:
                        majority_values.append(0)
                        continue
                    counter = Counter(valid)
                    max_count = counter.most_common(1)[0][1]
                    tied = [(a, s) for (a, s), c in counter.items() if c == max_count]
                    majority_values.append(psum(s for _, s in tied) / len(tied))
                if majority_values:
                    metrics[f"majority@{k}/{name}"] = (
                        100.0 * psum(majority_values) / len(majority_values)
                    )
    per_sample_agg: dict[str, list[float]] = {name: [] for name in score_names}
    for run_idx in range(max_k):
        for name in score_names:
            run_scores = [
                ts[run_idx].get(name)
                for ts in all_score_dicts
                if run_idx < len(ts) and name in ts[run_idx]
            ]
            if run_scores:
                per_sample_agg[name].append(100.0 * psum(run_scores) / len(run_scores))
    per_sample_agg = {k: v for k, v in per_sample_agg.items() if v}
    metrics["per_sample_aggregate"] = per_sample_agg
    if max_k > 1:
        for k in range(2, max_k + 1):
            for name in score_names:
                runs = per_sample_agg.get(name, [])[:k]
                if len(runs) >= 2:
                    mean_val = psum(runs) / len(runs)
                    variance = psum((x - mean_val) ** 2 for x in runs) / (len(runs) - 1)
                    std_dev = math.sqrt(variance)
                    metrics[f"pass@1[avg-of-{k}]/{name}/std_dev_across_runs"] = std_dev
                    metrics[f"pass@1[avg-of-{k}]/{name}/std_err_across_runs"] = std_dev / math.sqrt(
                        len(runs)
                    )
    return metrics


def highest_k_metrics(
    agent_metrics: dict[str, Any], pattern: str, exclude_names: list[str] | None = None
) -> dict[str, Any]:
    escaped = re.escape(pattern).replace(r"\{k\}", r"(\d+)")
    regex = re.compile(f"^{escaped}/(.+)$")
    matches = []
    for key in agent_metrics:
        m = regex.match(key)
        if not m:
            continue
        score_name = m.group(2)
        if any(score_name.endswith(s) for s in STATS):
            continue
        if exclude_names is not None and score_name in exclude_names:
            continue
        matches.append((int(m.group(1)), key))
    if not matches:
        return {}
    max_k = max(k for k, _ in matches)
    return {key: agent_metrics[key] for k, key in matches if k == max_k}


def get_key_metrics(agent_metrics: dict[str, Any]) -> dict[str, Any]:
    """``math_with_judge``'s headline metrics."""
    key: dict[str, Any] = {}
    for name in ("mean/input_tokens", "mean/output_tokens"):
        if name in agent_metrics:
            key[name] = agent_metrics[name]
    key.update(highest_k_metrics(agent_metrics, "pass@1[avg-of-{k}]"))
    key.update(highest_k_metrics(agent_metrics, "pass@{k}", exclude_names=["no_answer"]))
    key.update(highest_k_metrics(agent_metrics, "majority@{k}", exclude_names=["no_answer"]))
    return key
