"""The profile state: everything the final profile needs, kept compactly, mergeable.

Rows (materialized inputs) and results (rollouts) are appended in any order; a profile can be
built from the state at any moment (:mod:`processors.profile`). What is kept per rollout is only
what some output needs: the key, the numeric values (8 bytes each, in typed ``array`` buffers:
exact sums and medians need them), the serialized ``rollout_infos`` entry, and per materialized
row the agent, environment server and a *locator* (e.g. a file offset) from which the sink reads
the ``sample`` row back at write time. Values stay addressable by (task, rollout index), which
pass@k-style aggregates need.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import numpy.typing as npt

from processors.records import ResultRecord, extract_result
from processors.welford import RunningStats
from rewardstream.errors import InvalidRow

__all__ = ["ProfileState", "row_key"]

_NO_NAME = -1
_DTYPES = {"q": np.int64, "i": np.int32, "b": np.int8, "d": np.float64}


def row_key(row: dict[str, Any]) -> tuple[int, int]:
    """The (task, rollout) key of a row or result, with a clear error when it is unusable."""
    try:
        task, rollout = row["_ng_task_index"], row["_ng_rollout_index"]
    except KeyError as exc:
        raise InvalidRow(f"missing field {exc.args[0]!r}") from None
    except TypeError:
        raise InvalidRow(f"expected a JSON object, got {type(row).__name__}") from None
    for name, value in (("_ng_task_index", task), ("_ng_rollout_index", rollout)):
        if type(value) is not int or not -(2**63) <= value < 2**63:
            raise InvalidRow(f"field {name!r} must be a 64-bit integer, got {value!r}")
    return task, rollout


def _optional_name(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidRow(f"field {field!r} must be a string or null, got {value!r}")


class ProfileState:
    """Append-only, mergeable store of rows and results (see module docstring)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # materialized rows, in arrival (file) order
        self.in_task = array("q")
        self.in_rollout = array("q")
        self.in_agent = array("i")
        self.in_server = array("i")
        self.in_locator = array("q")
        # results, in arrival order
        self.res_task = array("q")
        self.res_rollout = array("q")
        self.res_schema = array("i")
        self.res_masked = array("b")
        self.pool = array("d")
        self.info_pool = bytearray()
        self.info_end = array("q")
        self.schemas: list[tuple[tuple[str, ...], tuple[bool, ...]]] = []
        self._schema_ids: dict[tuple[tuple[str, ...], tuple[bool, ...]], int] = {}
        self.live: dict[str, RunningStats] = {}

    # -- ingestion ------------------------------------------------------------------------
    def _name_id(self, name: str | None) -> int:
        if name is None:
            return _NO_NAME
        ident = self._name_ids.get(name)
        if ident is None:
            ident = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return ident

    def add_input(self, row: dict[str, Any], locator: int) -> None:
        """Record one materialized row; ``locator`` lets the sink read its ``sample`` back."""
        task, rollout = row_key(row)
        agent_ref = row.get("agent_ref")
        agent = agent_ref.get("name") if isinstance(agent_ref, dict) else None
        self.in_task.append(task)
        self.in_rollout.append(rollout)
        self.in_agent.append(self._name_id(_optional_name(agent, "agent_ref.name")))
        server = _optional_name(row.get("_ng_environment_server"), "_ng_environment_server")
        self.in_server.append(self._name_id(server))
        self.in_locator.append(locator)

    def add_result(self, result: dict[str, Any], agent: str | None = None) -> None:
        """Record one result row. ``agent``, when the caller knows it, feeds the live stats."""
        task, rollout = row_key(result)
        self.add_record(task, rollout, extract_result(result, task, rollout), agent)

    def add_record(
        self, task: int, rollout: int, record: ResultRecord, agent: str | None = None
    ) -> None:
        """Record an already extracted result (the stream processor extracts upstream)."""
        shape = (record.names, record.is_int)
        schema = self._schema_ids.get(shape)
        if schema is None:
            schema = self._schema_ids[shape] = len(self.schemas)
            self.schemas.append(shape)
        self.res_task.append(task)
        self.res_rollout.append(rollout)
        self.res_schema.append(schema)
        self.res_masked.append(record.masked)
        self.pool.extend(record.values)
        self.info_pool += record.info
        self.info_end.append(len(self.info_pool))
        if agent is not None and not record.masked:
            stats = self.live.get(agent)
            if stats is None:
                stats = self.live[agent] = RunningStats()
            stats.update(zip(record.names, record.values, strict=True))

    def merge(self, other: ProfileState) -> None:
        """Fold another state (e.g. another shard's) into this one."""
        remap = np.array([self._name_id(n) for n in other.names] + [_NO_NAME], dtype=np.int32)
        for mine, theirs in ((self.in_agent, other.in_agent), (self.in_server, other.in_server)):
            mine.extend(array("i", remap[np.frombuffer(theirs, dtype=np.int32)].tobytes()))
        self.in_task.extend(other.in_task)
        self.in_rollout.extend(other.in_rollout)
        self.in_locator.extend(other.in_locator)
        schema_map = []
        for shape in other.schemas:
            ident = self._schema_ids.get(shape)
            if ident is None:
                ident = self._schema_ids[shape] = len(self.schemas)
                self.schemas.append(shape)
            schema_map.append(ident)
        info_base = len(self.info_pool)
        self.res_task.extend(other.res_task)
        self.res_rollout.extend(other.res_rollout)
        mapped = np.array(schema_map, dtype=np.int32)[np.frombuffer(other.res_schema, np.int32)]
        self.res_schema.extend(array("i", mapped.tobytes()))
        self.res_masked.extend(other.res_masked)
        self.pool.extend(other.pool)
        self.info_pool += other.info_pool
        shifted = np.frombuffer(other.info_end, np.int64) + info_base
        self.info_end.extend(array("q", shifted.tobytes()))
        for agent, stats in other.live.items():
            self.live.setdefault(agent, RunningStats()).merge(stats)

    def copy(self) -> ProfileState:
        """An independent copy (a snapshot can be built from it while ingestion goes on)."""
        clone = ProfileState()
        clone.merge(self)
        return clone

    # -- read-only views for the profile builder --------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.in_task)

    @property
    def num_results(self) -> int:
        return len(self.res_task)

    @staticmethod
    def column(buf: array[Any]) -> npt.NDArray[Any]:
        """A numpy copy of a typed buffer (a copy, so the buffer can keep growing)."""
        return np.frombuffer(buf, dtype=_DTYPES[buf.typecode]).copy()
