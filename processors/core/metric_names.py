"""Which metric names are point estimates: NeMo Gym 0.7.0's rule for both the profile's
``*_across_repeats/*`` keys and the rows ``gym eval compare`` lists.

The statistics around a point estimate (``std/…``, ``…/ci_low_95``, ``…/std_err_across_runs``,
the indices and counts) describe it and are not compared or aggregated themselves
(docs/nemo-gym-compat.md §Across repeats, §Compare).
"""

from __future__ import annotations

__all__ = ["ACROSS_REPEATS", "across_repeats", "is_primary_metric"]

ACROSS_REPEATS = "_across_repeats/"
"""The marker of a statistic over the repeat-level values of a metric."""

_STATS = ("max", "min", "median", "std", "sem", "se", "p25", "p75", "ci_low_95", "ci_high_95")
_STAT_PREFIXES = tuple(f"{stat}/" for stat in (*_STATS, "histogram"))
_STAT_SUFFIXES = (
    *("/max", "/min", "/median", "/p5", "/p25", "/p75", "/p95", "/ci_low_95", "/ci_high_95"),
    *("/ci_lower", "/ci_upper", "_ci_lower", "_ci_upper", "_ci95_lower", "_ci95_upper"),
    *("/_ng_attempt_index", "/std_dev_across_runs", "/std_err_across_runs"),
    "/avg_sample_std_dev",
)
_NOT_METRICS = frozenset(
    {"_ng_task_index", "_ng_rollout_index", "_ng_attempt_index", "sample_count", "missing_count"}
    | {"num_repeats", "token_usage_version"}
)


def is_primary_metric(name: str) -> bool:
    """Whether ``name`` is a point estimate (``mean/reward``, ``pass@4/accuracy``)."""
    return (
        name not in _NOT_METRICS
        and not name.startswith(_STAT_PREFIXES)
        and not name.endswith(_STAT_SUFFIXES)
        and ACROSS_REPEATS not in name
    )


def across_repeats(stat: str, name: str) -> str:
    """The key of ``stat`` (``mean``, ``se``, ``ci_low_95``) of ``name`` across repeats."""
    return f"{stat}{ACROSS_REPEATS}{name}"
