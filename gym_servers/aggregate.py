"""``/aggregate_metrics`` of the bundled servers: NeMo Gym's server-side computation.

docs/nemo-gym-compat.md §Aggregate metrics states it.

The verify responses are profiled as one synthetic agent (``{"name": "agent"}``) with the same
core as ``ng_reward_profile``, so the numbers agree with the profile files bit for bit. The
environment adds no ``compute_metrics`` keys of its own (no pass@k). ``perf_summary`` comes
from the responses' ``ng_perf`` (NeMo Gym's collector attaches it with observability on).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from rewardstream.processors.core.kernels import builtin_sum, quantile_int64, quantile_linear
from rewardstream.processors.core.profile import build_profile
from rewardstream.processors.core.state import ProfileState, row_key

__all__ = ["aggregate_metrics", "perf_summary"]

_AGENT = {"name": "agent"}
_SAMPLE = orjson.dumps({"agent_ref": _AGENT})
_COVERAGE_PREFIX = "coverage/"


def aggregate_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """``{group_level_metrics, agent_metrics, key_metrics, perf_summary, repeat_level_metrics}``.

    Raises :class:`~rewardstream.errors.InvalidRow` for a response without its indices.
    """
    out: dict[str, Any] = {  # 0.7.0's AggregateMetrics, its fields in its order
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }
    if not verify_responses:
        return out
    # over every rollout that ran, masked or not (as 0.7.0: a masked one still took its time)
    perfs = [r["ng_perf"] for r in verify_responses if isinstance(r.get("ng_perf"), dict)]
    out["perf_summary"] = perf_summary(perfs, len(verify_responses))
    if all(r.get("mask_sample") for r in verify_responses):
        # as 0.7.0: nothing measured, so no means over an empty set (and no num_repeats),
        # only what happened
        tasks = {row_key(r)[0] for r in verify_responses}
        coverage = {
            "coverage/measured_rollouts": 0,
            "coverage/masked_rollouts": len(verify_responses),
            "coverage/measured_tasks": 0,
            "coverage/fully_masked_tasks": len(tasks),
        }
        return out | {"agent_metrics": coverage, "key_metrics": dict(coverage)}
    state = ProfileState()
    rollouts = set()
    for order, result in enumerate(verify_responses):
        task, rollout = row_key(result)
        rollouts.add(rollout)
        row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": _AGENT}
        state.add_input(row, 0, order)
        state.add_result(result if "response" in result else result | {"response": {}})
    profile = build_profile(state)
    out["group_level_metrics"] = [orjson.loads(row.render(_SAMPLE)) for row in profile.task_rows]
    entry = {k: v for k, v in profile.agent_metrics[0].items() if k != "agent_ref"}
    out["agent_metrics"] = entry | {"num_repeats": len(rollouts)}
    out["key_metrics"] = {
        k: v for k, v in entry.items() if k.startswith(("mean/", _COVERAGE_PREFIX))
    }
    out["repeat_level_metrics"] = [
        {k: v for k, v in e.items() if k != "agent_ref"} for e in profile.repeat_metrics
    ]
    return out


def _quantile(values: list[Any], p: float) -> float:
    """pandas' ``Series(values).quantile(p)``: int64 when every value is an int, else float64."""
    if all(type(v) is int for v in values):
        return quantile_int64(values, p)
    return quantile_linear(np.sort(np.asarray(values, dtype=np.float64)), p)


_STAT: dict[str, Callable[[list[Any]], Any]] = {  # 0.7.0's reward_profile._stat
    "mean": statistics.fmean,
    "median": statistics.median,
    "total": builtin_sum,
    "std": statistics.pstdev,
    "min": min,
    "max": max,
    "p50": lambda v: _quantile(v, 0.5),
    "p90": lambda v: _quantile(v, 0.9),
    "p99": lambda v: _quantile(v, 0.99),
}
_TOKEN_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens")


def perf_summary(records: list[dict[str, Any]], total_rollouts: int) -> dict[str, Any] | None:
    """0.7.0's ``compute_perf_summary``: the ``ng_perf`` records' coverage, token, turn and
    latency stats, each only when some record has its field; None without records."""
    if total_rollouts <= 0 or not records:
        return None

    def numbers(key: str) -> list[Any]:
        return [r[key] for r in records if isinstance(r.get(key), int | float)]

    def stats(names: tuple[str, ...], values: list[Any], key: str) -> dict[str, Any]:
        return {key.format(name): _STAT[name](values) for name in names} if values else {}

    covered = numbers("token_observability_coverage")
    out: dict[str, Any] = {
        "overall_observability_coverage": len(records) / total_rollouts,
        "token_observability_coverage": sum(1 for c in covered if c > 0) / total_rollouts,
    }
    for field in _TOKEN_FIELDS:
        out |= stats(("mean", "median", "total"), numbers(field), f"{{}}_{field}")
    turn_stats = ("mean", "median", "std", "min", "p90", "max")
    out |= stats(turn_stats, numbers("num_turns"), "{}_num_turns")
    per_turn = [
        r["completion_tokens"] / r["num_turns"]
        for r in records
        if isinstance(r.get("completion_tokens"), int | float)
        and isinstance(r.get("num_turns"), int | float)
        and r["num_turns"] > 0
    ]
    out |= stats(("mean", "median"), per_turn, "{}_tokens_per_turn")
    latency = numbers("total_latency_ms")
    out |= stats(("p50", "p90", "p99", "mean"), latency, "total_latency_{}_ms")
    return out
