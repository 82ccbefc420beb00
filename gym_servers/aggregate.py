"""``/aggregate_metrics`` of the bundled servers: NeMo Gym's server-side computation (spec §1.8).

The verify responses are profiled as one synthetic agent (``{"name": "agent"}``) with the same
core as ``ng_reward_profile``, so the numbers agree with the profile files bit for bit. The
environment adds no ``compute_metrics`` keys of its own (no pass@k).
"""

from __future__ import annotations

from typing import Any

import orjson

from rewardstream.processors.profile import build_profile
from rewardstream.processors.state import ProfileState, row_key

__all__ = ["aggregate_metrics"]

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
