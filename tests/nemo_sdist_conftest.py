"""The conftest that runs NeMo Gym 0.7.0's own unit tests, unchanged, against rewardstream.

``tests/test_nemo_sdist.py`` copies it beside ``test_reward_profile.py`` and
``test_aggregate_metrics.py`` from the 0.7.0 sdist (``.ci/nemo-reference`` fetches them) and runs
them with the reference's Python. Their assertions stay NeMo's; what they call is routed to ours:

- ``RewardProfiler.profile_from_data`` / ``align_rows_and_results`` /
  ``profile_completion_summary`` and ``coverage_by_agent``: our ``ng_reward_profile``
  (``REWARDSTREAM_PROFILE_CMD``) on the rows written to files; its files and printed summary
  read back;
- ``compute_aggregate_metrics`` (and so the resources server's and agent's
  ``aggregate_metrics`` routes) and ``compute_perf_summary``: POST to our servers'
  ``/aggregate_metrics`` (``REWARDSTREAM_AGGREGATE_URL``).

Tests of NeMo's in-process helpers (precomputed metrics written by ``write_to_disk``, custom
Python metric hooks, private methods) have nothing of ours to call: they are skipped with the
reason, and the runner checks that only those are.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import nemo_gym.base_resources_server as resources_module
import nemo_gym.base_responses_api_agent as agent_module
import pytest
from nemo_gym.config_types import AggregateMetrics
from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.reward_profile import AggregateMetricsMixin, RewardProfiler

PROFILE_CMD = shlex.split(os.environ.get("REWARDSTREAM_PROFILE_CMD", "ng_reward_profile"))
AGGREGATE_URL = os.environ.get("REWARDSTREAM_AGGREGATE_URL", "")
NOT_ADAPTABLE = "not adaptable: "
HISTOGRAM = "<a W&B histogram: never in the files>"

_HELPER = "a library helper of custom compute_metrics, not on /aggregate_metrics"
_PRIVATE = "a private method of NeMo's profiler"
SKIPPED = {
    "test_reward_profile.py::TestWriteToDisk": "write_to_disk of precomputed metrics",
    "test_reward_profile.py::TestTheTwoViewsAgree::test_nothing_masked_leaves_both_sides_"
    "untouched": "select_measured only",
    "test_reward_profile.py::TestMaskingDoesNotHideAnIncompleteCollection::test_only_the_"
    "masked_pair_is_removed": "select_measured only",
    "test_aggregate_metrics.py::TestComputePassMajorityMetrics": _HELPER,
    "test_aggregate_metrics.py::TestMajorityNoAnswerCounting": _HELPER,
    "test_aggregate_metrics.py::TestHighestKMetrics": _HELPER,
    "test_aggregate_metrics.py::TestComputeSubsetMetrics": _HELPER,
    "test_aggregate_metrics.py::TestAddAvgSampleStdDev": _HELPER,
    "test_aggregate_metrics.py::TestRepeatMetricEligibility": _PRIVATE,
    "test_aggregate_metrics.py::TestAggregateRepeatLevelMetrics::test_empty_input": _PRIVATE,
    "test_aggregate_metrics.py::TestAggregateRepeatLevelMetrics::test_single_repeat_metric_is_"
    "degenerate": _PRIVATE,
    "test_aggregate_metrics.py::TestAggregateRepeatLevelMetrics::test_known_values_across_"
    "repeats": _PRIVATE,
    "test_aggregate_metrics.py::TestAggregateRepeatLevelMetrics::test_skewed_repeats_median_"
    "differs_from_mean": _PRIVATE,
    "test_aggregate_metrics.py::TestAggregateRepeatLevelMetrics::test_per_agent_grouping": _PRIVATE,
    "test_aggregate_metrics.py::TestConfidenceIntervalZeroSem::test_collapses_to_mean_and_"
    "warns": _PRIVATE,
    "test_aggregate_metrics.py::TestConfidenceIntervalZeroSem::test_no_warning_for_nonzero_"
    "sem": _PRIVATE,
    "test_aggregate_metrics.py::TestConfidenceIntervalZeroSem::test_n_le_1_returns_none_"
    "without_warning": _PRIVATE,
}
"""Node id prefixes skipped before they run (tests passing custom Python metric hooks are
skipped when they make the call: a hook cannot cross HTTP)."""

WARNING_ONLY = {
    "test_aggregate_metrics.py::TestMissingRolloutWarning::test_warns_when_a_repeat_is_"
    "missing_tasks",
    "test_aggregate_metrics.py::TestConfidenceIntervalZeroSem::test_end_to_end_identical_per_"
    "repeat_means_yield_point_ci",
}
"""Their values are checked through our endpoint; the ``UserWarning`` NeMo raises in process
cannot cross HTTP, so ``pytest.warns`` accepts its absence there."""


def _short_id(item: pytest.Item) -> str:
    return item.nodeid.split("unit_tests/", 1)[-1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        nid = _short_id(item)
        for prefix, reason in SKIPPED.items():
            if nid == prefix or nid.startswith(prefix + "::"):
                item.add_marker(pytest.mark.skip(reason=NOT_ADAPTABLE + reason))


# ---------------------------------------------------------------------- ng_reward_profile
_COMPLETION = re.compile(r"Reward profile completion: (\d+)/(\d+) rollout rows")
_INPUT_ROWS = re.compile(r"Input rows: (\d+) total; (\d+) complete; (\d+) partial; (\d+) without")

Profiled = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], str]


def _profile(rows: list[dict[str, Any]], results: list[dict[str, Any]], partial: bool) -> Profiled:
    """Our command on the rows: (task rows, agent entries, repeat rows, stdout); its error
    (one line) raised as the ValueError NeMo's profiler raises, so ``match=`` reads ours."""
    folder = Path(tempfile.mkdtemp(prefix="rewardstream-"))
    inputs, rollouts = folder / "inputs.jsonl", folder / "rollouts.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in results))
    cmd = [*PROFILE_CMD, f"+materialized_inputs_jsonl_fpath={inputs}"]
    cmd += [f"+rollouts_jsonl_fpath={rollouts}", "+quiet=true"]
    if partial:
        cmd.append("++allow_partial_rollouts=True")
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise ValueError(proc.stderr.strip())
    tasks = [json.loads(x) for x in (folder / "rollouts_reward_profiling.jsonl").open()]
    agents = json.loads((folder / "rollouts_agent_metrics.json").read_text())
    repeats = json.loads((folder / "rollouts_repeat_level_metrics.json").read_text())
    return tasks, agents, repeats, proc.stdout


def _with_histograms(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """NeMo's in-memory entries have a ``histogram/X`` beside each ``mean/X``, which no file
    holds (the tests null or drop them): a stand-in, so key sets compare."""
    for entry in entries:
        for key in list(entry):
            if key.startswith("mean/"):
                entry.setdefault("histogram/" + key[5:], HISTOGRAM)
    return entries


class OurRewardProfiler(RewardProfiler):  # type: ignore[misc]  # NeMo's class: untyped here
    def profile_from_data(
        self,
        rows: list[dict[str, Any]],
        results: list[dict[str, Any]],
        allow_partial_rollouts: bool = False,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        tasks, agents, repeats, _ = _profile(rows, results, allow_partial_rollouts)
        # the command adds coverage_by_agent's keys (as NeMo's does); this method does not
        measured = [
            {k: v for k, v in e.items() if not k.startswith("coverage/")}
            for e in agents
            if any(k.startswith(("mean/", "max/", "min/")) for k in e)
        ]
        return _with_histograms(tasks), _with_histograms(measured), repeats

    def align_rows_and_results(
        self,
        rows: list[dict[str, Any]],
        results: list[dict[str, Any]],
        allow_partial_rollouts: bool = False,
    ) -> Any:
        _profile(rows, results, allow_partial_rollouts)  # our refusal, when there is one
        return super().align_rows_and_results(rows, results, allow_partial_rollouts)

    def profile_completion_summary(
        self, rows: list[dict[str, Any]], results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        *_, stdout = _profile(rows, results, partial=True)
        done, counts = _COMPLETION.search(stdout), _INPUT_ROWS.search(stdout)
        assert done and counts, f"no completion summary printed: {stdout!r}"
        completed, expected = int(done[1]), int(done[2])
        return {
            "expected_rollout_rows": expected,
            "completed_rollout_rows": completed,
            "missing_rollout_rows": expected - completed,
            "extra_rollout_rows": 0,  # extra rows are refused, as NeMo's command refuses them
            "reward_profile_completion_pct": 100.0 * completed / expected if expected else 100.0,
            "total_input_rows": int(counts[1]),
            "complete_input_rows": int(counts[2]),
            "partial_input_rows": int(counts[3]),
            "missing_input_rows": int(counts[4]),
        }


def our_coverage_by_agent(
    rows: list[dict[str, Any]], results: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    _, agents, _, _ = _profile(rows, results, partial=True)
    out = {}
    for entry in agents:
        coverage = {k: v for k, v in entry.items() if k.startswith("coverage/")}
        if coverage:
            out[entry["agent_ref"]["name"]] = coverage
    return out


# ---------------------------------------------------------------------- /aggregate_metrics
_DEFAULT_HOOKS = (
    AggregateMetricsMixin.compute_metrics,
    AggregateMetricsMixin.get_key_metrics,
    AggregateMetricsMixin.compute_repeat_metrics,
)


def our_compute_aggregate_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics_fn: Any = None,
    get_key_metrics_fn: Any = None,
    compute_repeat_metrics_fn: Any = None,
) -> Any:
    hooks = (compute_metrics_fn, get_key_metrics_fn, compute_repeat_metrics_fn)
    for hook, default in zip(hooks, _DEFAULT_HOOKS, strict=True):
        if hook is not None and getattr(hook, "__func__", None) is not default:
            pytest.skip(NOT_ADAPTABLE + "a custom Python metric hook cannot be sent over HTTP")
    body = json.dumps({"verify_responses": verify_responses}).encode()
    request = urllib.request.Request(
        AGGREGATE_URL, body, {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return AggregateMetrics.model_validate(json.loads(response.read()))


def our_compute_perf_summary(records: list[dict[str, Any]], total_rollouts: int) -> Any:
    """``perf_summary`` of ``total_rollouts`` verify responses, the first ones carrying the
    records (0.7.0 computes it from exactly those)."""
    count = total_rollouts if total_rollouts > 0 and len(records) <= total_rollouts else 0
    responses = [
        {TASK_INDEX_KEY_NAME: i, ROLLOUT_INDEX_KEY_NAME: 0, "reward": 0.0}
        | ({"ng_perf": records[i]} if i < len(records) else {})
        for i in range(count)
    ]
    return our_compute_aggregate_metrics(responses).perf_summary


# ---------------------------------------------------------------------- wiring
@contextmanager
def _any_warnings(*_: Any, **__: Any) -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


@pytest.fixture(autouse=True)
def _route_to_rewardstream(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    assert AGGREGATE_URL, "REWARDSTREAM_AGGREGATE_URL: our servers' /aggregate_metrics"
    routes = {
        "RewardProfiler": OurRewardProfiler,
        "coverage_by_agent": our_coverage_by_agent,
        "compute_aggregate_metrics": our_compute_aggregate_metrics,
        "compute_perf_summary": our_compute_perf_summary,
    }
    for name, ours in routes.items():
        if hasattr(request.module, name):
            monkeypatch.setattr(request.module, name, ours)
    for module in (resources_module, agent_module):  # the routes call their own imports
        monkeypatch.setattr(module, "compute_aggregate_metrics", our_compute_aggregate_metrics)
    if _short_id(request.node) in WARNING_ONLY:
        shim = SimpleNamespace(**{k: getattr(pytest, k) for k in dir(pytest) if k[:2] != "__"})
        shim.warns = _any_warnings
        monkeypatch.setattr(request.module, "pytest", shim)
