r"""``ng_aggregate_rollouts`` (NeMo Gym 0.7.0's ``gym eval aggregate``): the shards of a
collection (``+disable_aggregation=true`` runs, one per host or chunk) as one.

    ng_aggregate_rollouts +input_glob='out/r-*.jsonl' +output_jsonl_fpath=out/r.jsonl \
        [+merge_shards=false] [+aggregate_with_servers=true [+head_server.port=P]]

As 0.7.0: ``input_glob`` is a glob or comma-separated globs (sorted matches, duplicates once,
``*_failures`` and ``*_materialized_inputs`` files skipped); blank lines are skipped; the rows
are sorted by task and rollout index; with ``merge_shards`` (default) they are written to
``output_jsonl_fpath``; and ``<stem>_aggregate_metrics.json`` gets one entry per agent (and
environment server stamp) in 0.7.0's shape. Unlike 0.7.0 it needs no running servers: the
default metrics (0.7.0's ``compute_aggregate_metrics``, which our servers' ``/aggregate_metrics``
equals: ``tests/test_nemo_interop.py``) are computed here; ``+aggregate_with_servers=true``
asks each agent's environment server instead, as 0.7.0 does (for agents with metrics of their
own). Both files are written together or not at all, and an output that is one of the shards
is refused (re-running would read the merged file as a shard).
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop
from pydantic import Field

from rewardstream.command import override_command
from rewardstream.errors import InputError
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.overrides import parse_overrides
from rewardstream.producers.collect import (
    Servers,
    agent_of,
    metrics_entry,
    metrics_file,
    routes_of,
    server_metrics,
    validated,
    verify_entry,
)
from rewardstream.sinks.files import write_files

__all__ = ["AggregateConfig", "aggregate", "main"]


class AggregateConfig(Servers):
    """0.7.0's ``RolloutAggregationConfig`` keys, and ``aggregate_with_servers``."""

    input_glob: str
    output_jsonl_fpath: Path
    config_paths: list[str] | str | None = None  # 0.7.0 reads the servers from them; not needed
    merge_shards: bool = True
    aggregate_with_servers: bool = False
    count_failure_classes_as_zero: list[str] = Field(default_factory=list)
    count_missing_rollouts_as_zero: bool = False
    # 0.7.0's rollout health reports (quality_summary.json, ...): not written here
    disable_health_check: bool = False
    health_check_workers: int | None = Field(default=None, ge=1)
    health_check_ignored_checks: list[str] = Field(default_factory=list)


def shards(input_glob: str) -> list[Path]:
    """The files ``input_glob`` matches, as 0.7.0 expands it."""
    seen: dict[str, None] = {}
    for pattern in (p.strip() for p in input_glob.split(",")):
        if pattern:
            for path in sorted(glob.glob(pattern)):
                if not Path(path).stem.endswith(("_failures", "_materialized_inputs")):
                    seen.setdefault(path, None)
    return [Path(p) for p in seen]


def _rows(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise InputError(
                        f"Malformed JSON in '{path}' at line {lineno}: {exc}"
                    ) from None
                if not isinstance(row, dict) or not all(
                    isinstance(row.get(k), int) for k in ("_ng_task_index", "_ng_rollout_index")
                ):
                    raise InputError(
                        f"{path} line {lineno}: a rollout row needs integer _ng_task_index and "
                        "_ng_rollout_index"
                    )
                out.append(row)
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None
    return out


async def aggregate(cfg: AggregateConfig) -> tuple[Path | None, Path]:
    """Merge (unless told not to) and aggregate; returns (merged rollouts, metrics file)."""
    if cfg.count_failure_classes_as_zero or cfg.count_missing_rollouts_as_zero:
        raise InputError(
            "count_failure_classes_as_zero and count_missing_rollouts_as_zero are not "
            "supported by rewardstream's ng_aggregate_rollouts yet"
        )
    found = shards(cfg.input_glob)
    if not found:
        raise InputError(f"No shards matched input_glob={cfg.input_glob!r}")
    output = cfg.output_jsonl_fpath
    if any(p.resolve() == output.resolve() for p in found):
        raise InputError(
            f"+output_jsonl_fpath={output} is one of the shards +input_glob matches: choose "
            "another output, or a narrower glob (nothing was written)"
        )
    print(f"Aggregating {len(found)} shard(s):")
    for path in found:
        print(f"  - {path}")
    results = [row for path in found for row in _rows(path)]
    print(f"Loaded {len(results)} rollout record(s) from {len(found)} shard(s)")
    results.sort(key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    kept = [verify_entry(r) for r in results]
    if cfg.aggregate_with_servers:
        entries = await server_metrics(kept, await routes_of(cfg, {agent_of(r) for r in kept}))
        if entries is None:
            raise InputError("the servers' /aggregate_metrics failed (see the warning above)")
    else:
        groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        for entry in kept:
            key = (agent_of(entry), entry.get("_ng_environment_server"))
            groups.setdefault(key, []).append(entry)
        entries = [
            metrics_entry(agent, server, aggregate_metrics(rows))
            for (agent, server), rows in groups.items()
        ]
    metrics = output.with_name(f"{output.stem}_aggregate_metrics.json")
    files: list[tuple[Path, list[bytes]]] = [(metrics, [metrics_file(entries)])]
    if cfg.merge_shards:
        print(f"Merging shards into {output}")
        files.insert(0, (output, [orjson.dumps(r) + b"\n" for r in results]))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot write '{output.parent}': {exc.strerror or exc}") from None
    write_files(files)
    return (output if cfg.merge_shards else None), metrics


def _usage() -> str:
    return __doc__ or ""


def main(argv: Sequence[str] | None = None) -> int:
    def go(args: list[str]) -> int:
        cfg = validated(AggregateConfig, parse_overrides(args))
        merged, metrics = uvloop.run(aggregate(cfg))
        print("Finished rollout aggregation! View results at:")
        print(f"Merged rollouts: {merged if merged is not None else '<not merged>'}")
        print(f"Aggregate metrics: {metrics}")
        return 0

    return override_command("ng_aggregate_rollouts", _usage, argv, go)


if __name__ == "__main__":
    sys.exit(main())
