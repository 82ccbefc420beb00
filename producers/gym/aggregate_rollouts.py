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

``+count_failure_classes_as_zero=[agent_run_error]`` and ``+count_missing_rollouts_as_zero=true``
put failed or lost rollouts in the metrics' denominator as zeros, as 0.7.0 does: each shard read
against its own ``_failures.jsonl`` and ``_materialized_inputs.jsonl``, a rollout keyed by the
environment server that scores it (an unstamped row's agent's one server, which the shards'
stamped rows tell without asking the servers), the last recorded attempt standing, the zeros
given their task's dataset fields; no file but the metrics changes.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field

from rewardstream.errors import InputError
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.infra.command import override_command, run_loop
from rewardstream.infra.overrides import parse_overrides
from rewardstream.processors.core.records import agent_of as named_agent
from rewardstream.producers.gym.collect import (
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


def _rows(path: Path, keyed: bool = True) -> list[dict[str, Any]]:
    """The JSON rows of a file, blank lines skipped; ``keyed``: each with integer indices."""
    return [row for _, row in _read(path, keyed)]


def _read(path: Path, keyed: bool = True) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`_rows`, each with the byte offset of its line."""
    try:
        with path.open("rb") as fh:
            offset = 0
            for lineno, line in enumerate(fh, 1):
                at, offset = offset, offset + len(line)
                line = line.strip()
                if not line:
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise InputError(
                        f"Malformed JSON in '{path}' at line {lineno}: {exc}"
                    ) from None
                if not isinstance(row, dict) or (
                    keyed
                    and not all(
                        isinstance(row.get(k), int) for k in ("_ng_task_index", "_ng_rollout_index")
                    )
                ):
                    raise InputError(
                        f"{path} line {lineno}: a rollout row needs integer _ng_task_index and "
                        "_ng_rollout_index"
                    )
                yield at, row
    except OSError as exc:
        raise InputError(f"Cannot read '{path}': {exc.strerror or exc}") from None


class _Shards:
    """The shards' rows as the metrics need them, :func:`verify_entry` of each (the bulk,
    ~90 % of a row's bytes, dropped as it is read), with where each row's line is, so the
    merged file re-reads the lines in order rather than holding every row: 977 -> 416 MB and
    7.1 -> 5.8 s for 245 MB of shards (measured, ``bench/aggregate_bench.py``). The key
    names of the full rows are kept per agent and environment server stamp
    (``_fill_task_fields`` needs them)."""

    def __init__(self, found: list[Path]) -> None:
        self.rows: dict[Path, list[dict[str, Any]]] = {}
        self.lines: list[tuple[int, int, int, int]] = []  # task, rollout, shard, offset
        self.keys: dict[tuple[str | None, str | None], set[str]] = {}
        self.stats: list[tuple[int, int]] = []  # size and mtime of each shard as it was read
        for shard, path in enumerate(found):
            rows = self.rows[path] = []
            with contextlib.suppress(OSError):  # unreadable: _read says so
                self.stats.append(_version(path.stat()))
            for offset, row in _read(path):
                self.keys.setdefault((named_agent(row), _stamp(row)), set()).update(row)
                rows.append(verify_entry(row))
                self.lines.append((row["_ng_task_index"], row["_ng_rollout_index"], shard, offset))
        self.lines.sort(key=lambda line: line[:2])  # stable: shards in order within a key
        self.found = found

    def merged(self) -> Iterator[bytes]:
        """The merged file's lines: the rows sorted by task and rollout, as orjson writes them.
        A shard changed since it was read is an error (the metrics were computed on what it
        held), raised before the merged file is in place."""
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(path.open("rb")) for path in self.found]
            for path, fh, seen in zip(self.found, handles, self.stats, strict=True):
                if _version(os.fstat(fh.fileno())) != seen:
                    raise InputError(
                        f"{path} changed while the shards were being aggregated "
                        "(nothing was written): run again once it is complete"
                    )
            for _, _, shard, offset in self.lines:
                fh = handles[shard]
                fh.seek(offset)
                yield orjson.dumps(orjson.loads(fh.readline().strip())) + b"\n"


def _version(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns


def _sidecar(shard: Path, suffix: str) -> Path:
    return shard.with_name(f"{shard.stem}{suffix}")


Key = tuple[Any, Any]


def _key(row: dict[str, Any]) -> Key:
    return (row.get("_ng_task_index"), row.get("_ng_rollout_index"))


def _latest_failures(path: Path) -> dict[Key, dict[str, Any]]:
    """The last attempt recorded for each rollout in a failures sidecar (none: no file)."""
    if not path.exists():
        return {}
    return {_key(row): row for row in _rows(path, keyed=False)}


class _Zeros:
    """0.7.0's zero-counting (``_counted_failure_row``, ``_missing_rollout_rows_counted_as_zero``,
    ``_fill_task_fields``): the rows it adds to the metrics' input, and what it reports."""

    def __init__(self, keys: dict[tuple[str | None, str | None], set[str]]) -> None:
        """``keys``: the rows' key names by agent and stamp (:attr:`_Shards.keys`)."""
        # an unstamped row's group is its agent's one environment server: the stamped rows say
        servers: dict[str | None, set[str]] = {}
        for agent, stamp in keys:
            if stamp is not None:
                servers.setdefault(agent, set()).add(stamp)
        self.server_of = {a: next(iter(s)) for a, s in servers.items() if len(s) == 1}
        self.keys = keys
        self.lines: list[str] = []
        self.imputed = 0  # materialized rollouts with no row, scored as zeros

    def server(self, row: dict[str, Any]) -> str | None:
        """The environment server that scores a row: its stamp, else its agent's one server."""
        return self._server(named_agent(row), _stamp(row))

    def _server(self, agent: str | None, stamp: str | None) -> str | None:
        return stamp if stamp is not None else self.server_of.get(agent)

    def group(self, row: dict[str, Any]) -> Any:
        return self.server(row) or named_agent(row)

    def identity(self, row: dict[str, Any]) -> tuple[Any, Any, Any]:
        return (self.group(row), *_key(row))

    def counted(
        self, cfg: AggregateConfig, shard_rows: dict[Path, list[dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], Counter[str]]:
        """The rows to score as zeros, and the classes of the failures left out of the score."""
        found = list(shard_rows)
        results = [row for rows in shard_rows.values() for row in rows]
        shard_keys = {path: {_key(row) for row in rows} for path, rows in shard_rows.items()}
        latest: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        for path in found:
            for key, row in _latest_failures(_sidecar(path, "_failures.jsonl")).items():
                if key not in shard_keys[path]:
                    latest[self.identity(row)] = row
        landed = {self.identity(r) for r in results}
        wanted = set(cfg.count_failure_classes_as_zero)
        counted = [
            _counted_failure_row(row)
            for identity, row in latest.items()
            if identity not in landed
            and row.get("_ng_failure_class") in wanted
            and _routing_identity(row) is not None
        ]
        if wanted:
            self.lines.append(
                f"Counting {len(counted)} failure row(s) as scored zeros: "
                f"{cfg.count_failure_classes_as_zero}"
            )
        missing: list[dict[str, Any]] = []
        if cfg.count_missing_rollouts_as_zero:
            accounted = landed | set(latest)
            for path in found:
                for zero in self._missing(path, set(shard_keys[path])):
                    if self.identity(zero) not in accounted:
                        accounted.add(self.identity(zero))
                        missing.append(zero)
            self.lines.append(
                f"Counting {len(missing)} materialized rollout(s) with no row as scored zeros"
            )
            counted += missing
        self.imputed = len(missing)
        if counted:
            self._fill_task_fields(counted, found)
        ids = {self.identity(r) for r in counted}
        dropped = Counter(
            row.get("_ng_failure_class") or "unknown"
            for identity, row in latest.items()
            if identity not in landed and identity not in ids
        )
        return counted, dropped

    def _missing(self, path: Path, scored: set[Key]) -> list[dict[str, Any]]:
        materialized = _sidecar(path, "_materialized_inputs.jsonl")
        recorded = set(_latest_failures(_sidecar(path, "_failures.jsonl")))
        if not materialized.exists():
            print(
                f"[WARNING] {materialized} is missing; rollouts owed by that shard cannot be "
                "counted"
            )
            return []
        zeros, unroutable = [], 0
        for row in _rows(materialized):
            key = _key(row)
            if key in scored or key in recorded:
                continue
            if _routing_identity(row) is None:
                unroutable += 1
                continue
            scored.add(key)
            zero = {
                "_ng_task_index": key[0],
                "_ng_rollout_index": key[1],
                "agent_ref": row.get("agent_ref"),
                "reward": 0.0,
            }
            if "_ng_environment_server" in row:
                zero["_ng_environment_server"] = row["_ng_environment_server"]
            zeros.append(zero)
        if unroutable:
            print(
                f"[WARNING] {unroutable} materialized rollout(s) name no agent or environment "
                "server and are not counted"
            )
        return zeros

    def _fill_task_fields(self, added: list[dict[str, Any]], found: list[Path]) -> None:
        """The added rows get their task's dataset fields that real rows of their group carry."""
        wanted = {self.identity(row): row for row in added}
        carried: dict[Any, set[str]] = {}
        for (agent, stamp), keys in self.keys.items():
            carried.setdefault(self._server(agent, stamp) or agent, set()).update(keys)
        for path in found:
            materialized = _sidecar(path, "_materialized_inputs.jsonl")
            for source in _rows(materialized) if materialized.exists() else []:
                target = wanted.get(self.identity(source))
                if target is None:
                    continue
                for key in carried.get(self.group(source), set()) & source.keys():
                    if key[:1] != "_" and key not in ("responses_create_params", "response"):
                        target.setdefault(key, source[key])

    def coverage(self, scored: int, dropped: Counter[str]) -> str:
        """0.7.0's ``_coverage_report``: how much of the input the score covers."""
        expected, report = scored + sum(dropped.values()), ""
        if expected > scored:
            routed = ", ".join(f"{n} {name}" for name, n in sorted(dropped.items()))
            routed = f"{routed} routed this run; " if routed else ""
            report = (
                f"\nRollouts missing from the score: {expected - scored} of {expected} "
                f"materialized ({routed}see the shards' _failures.jsonl sidecars)"
                f"\nMetrics cover: {scored} of {expected} rollouts"
            )
        if self.imputed:
            report += (
                f"\nScored as zero because they left no row: {self.imputed} of {expected} rollouts"
            )
        return report


def _stamp(row: dict[str, Any]) -> str | None:
    stamp = row.get("_ng_environment_server")
    return stamp if isinstance(stamp, str) else None


def _routing_identity(row: dict[str, Any]) -> Any:
    return named_agent(row) or row.get("_ng_environment_server")


def _counted_failure_row(row: dict[str, Any]) -> dict[str, Any]:
    """The metrics-only copy of a failure row counted as zero: diagnostics left out (an HTTP
    status is a number, which the metrics would average), unmasked, reward 0 unless it has one."""
    scored = {
        k: v
        for k, v in row.items()
        if not k.startswith("_ng_failure_") and k not in ("failure_kind", "failure_reason")
    }
    scored["mask_sample"] = False
    scored.setdefault("reward", 0.0)
    return scored


async def aggregate(cfg: AggregateConfig) -> tuple[Path | None, Path, str]:
    """Merge (unless told not to) and aggregate; returns (merged rollouts, metrics file, the
    coverage report)."""
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
    read = _Shards(found)
    results = [row for rows in read.rows.values() for row in rows]
    print(f"Loaded {len(results)} rollout record(s) from {len(found)} shard(s)")
    zeros = _Zeros(read.keys)
    counted, dropped = zeros.counted(cfg, read.rows)
    for line in zeros.lines:
        print(line)
    scored = sorted(results + counted, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    kept = [verify_entry(r) for r in scored]  # the zeros; the shards' rows already are
    if cfg.aggregate_with_servers:
        entries = await server_metrics(kept, await routes_of(cfg, {agent_of(r) for r in kept}))
        if entries is None:
            raise InputError("the servers' /aggregate_metrics failed (see the warning above)")
    else:
        groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        for entry in kept:
            key = (agent_of(entry), zeros.server(entry))
            groups.setdefault(key, []).append(entry)
        entries = [
            metrics_entry(agent, server, aggregate_metrics(rows))
            for (agent, server), rows in groups.items()
        ]
    metrics = output.with_name(f"{output.stem}_aggregate_metrics.json")
    files: list[tuple[Path, Iterable[bytes]]] = [(metrics, [metrics_file(entries)])]
    if cfg.merge_shards:
        print(f"Merging shards into {output}")
        files.insert(0, (output, read.merged()))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot write '{output.parent}': {exc.strerror or exc}") from None
    write_files(files)
    return (output if cfg.merge_shards else None), metrics, zeros.coverage(len(scored), dropped)


_USAGE = """\
usage: ng_aggregate_rollouts +input_glob='out/r-*.jsonl' +output_jsonl_fpath=out/r.jsonl \
[+key=value ...]

Merge the shards of one collection (each collected with +disable_aggregation=true) into one
rollouts file, sorted by task and rollout, and write its _aggregate_metrics.json, as NeMo Gym
0.7.0's gym eval aggregate does; both files are written together or not at all.

Shards of one collection: split the dataset after numbering it, so that every row carries its
task's _ng_task_index from the whole dataset (a shard numbers the rows without one from 0, and
two shards would then share keys); give each shard its own output file.

overrides (+key=value, ++key=value or key=value):
  +input_glob=GLOB[,GLOB]                (required) the shards' rollouts files (sorted; each once;
                                         *_failures and *_materialized_inputs skipped)
  +output_jsonl_fpath=PATH               (required) the merged file; never one of the shards
  +merge_shards=BOOL                     write the merged file (true); false: the metrics only
  +aggregate_with_servers=BOOL           ask each agent's environment server for its metrics, as
                                         0.7.0 does (false: computed here, equal by default)
  +head_server_url=URL                   the head server, for aggregate_with_servers
  +head_server.host=HOST                 the same as host and port (+head_server.port=P)
  +agent_url=URL                         one agent server for every agent
  +count_failure_classes_as_zero=[A,B]   failed attempts of these classes count as reward 0
                                         (e.g. [agent_run_error]; each shard's _failures.jsonl)
  +count_missing_rollouts_as_zero=BOOL   rollouts never written count as reward 0 (false)
  +config_paths=[A,B]                    accepted as 0.7.0 does; not needed here
  +disable_health_check=BOOL             accepted; 0.7.0's health reports are not written here
  +health_check_workers=N                accepted, as above
  +health_check_ignored_checks=[A,B]     accepted, as above

options:
  -h, --help                             show this help and exit
  --version                              show the version and exit"""


def _usage() -> str:
    return _USAGE


def main(argv: Sequence[str] | None = None) -> int:
    def go(args: list[str]) -> int:
        cfg = validated(AggregateConfig, parse_overrides(args))
        merged, metrics, coverage = run_loop(aggregate(cfg))
        print("Finished rollout aggregation! View results at:")
        print(f"Merged rollouts: {merged if merged is not None else '<not merged>'}")
        print(f"Aggregate metrics: {metrics}{coverage}")
        return 0

    return override_command("ng_aggregate_rollouts", _usage, argv, go)


if __name__ == "__main__":
    sys.exit(main())
