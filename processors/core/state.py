"""The profile state: everything the final profile needs, kept compactly, mergeable.

Rows (materialized inputs) and results (rollouts) are appended in any order; a profile can be
built from the state at any moment (:mod:`rewardstream.processors.core.profile`). What is kept per
rollout is only what some output needs: the key, the numeric values (8 bytes each, in typed
``array`` buffers: exact sums and medians need them), the serialized ``rollout_infos`` entry, and
per materialized row the agent, environment server and a *locator* (e.g. a file offset) from which
the sink reads the ``sample`` row back at write time. Values stay addressable by (task, rollout
index), which pass@k-style aggregates need.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Sequence
from itertools import accumulate, chain, islice
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from rewardstream.errors import InvalidRow, MissingKey
from rewardstream.processors.core.records import ResultRecord, extract_result
from rewardstream.processors.core.welford import Moments, RunningStats

__all__ = ["LOCATOR_BITS", "ProfileState", "Shape", "keys_in", "row_key", "row_names"]

LOCATOR_BITS = 40
"""Merged parts tag their locators with ``part << LOCATOR_BITS`` (offsets stay below 1 TiB)."""

_NO_NAME = -1
_REWARD = "reward"  # the column the early-stop rules and the confidence sequences read
_DTYPES = {"q": np.int64, "i": np.int32, "b": np.int8, "d": np.float64}

InfoBytes = bytes | bytearray | memoryview | mmap.mmap
"""Serialized ``rollout_infos`` entries: in memory, a spill file's memory map, or a slice of a
part received from another processor (:mod:`rewardstream.processors.engine.partwire`)."""

Shape: TypeAlias = tuple[tuple[str, ...], tuple[bool, ...]]
"""A result's numeric columns and their int flags (``ResultRecord.names``, ``.is_int``)."""

Section: TypeAlias = "InfoBytes | array[Any]"  # array is generic at run time from 3.12
"""Raw bytes of one section of a state's wire form (:meth:`ProfileState.export_columns`)."""

_COLUMNS = {
    "inputs": ("in_task", "in_rollout", "in_agent", "in_server", "in_locator", "in_order"),
    "results": (
        *("res_task", "res_rollout", "res_schema", "res_masked", "res_agent", "res_answer"),
        "info_end",
    ),
    "big": ("big_at", "big_value"),
}
"""The typed columns of a state, by the count each one's length must equal (``pool`` is apart:
its length is the results' widths summed)."""


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: an error line must stay one readable line."""
    try:
        text = repr(value)
    except RecursionError:  # JSON nests deeper (1024) than repr recurses
        return f"a {type(value).__name__} nested too deeply to show"
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def row_key(row: dict[str, Any]) -> tuple[int, int]:
    """The (task, rollout) key of a row or result, with a clear error when it is unusable."""
    try:
        task, rollout = row["_ng_task_index"], row["_ng_rollout_index"]
    except KeyError as exc:
        raise MissingKey(f"missing field {exc.args[0]!r}") from None
    except TypeError:
        raise InvalidRow(f"expected a JSON object, got {type(row).__name__}") from None
    for name, value in (("_ng_task_index", task), ("_ng_rollout_index", rollout)):
        if type(value) is not int or not -(2**63) <= value < 2**63:
            raise InvalidRow(f"field {name!r} must be a 64-bit integer, got {_shown(value)}")
    return task, rollout


def _optional_name(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidRow(f"field {field!r} must be a string or null, got {_shown(value)}")


def row_names(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """A materialized row's ``agent_ref.name`` and ``_ng_environment_server``, checked.

    Shared by the batch reader and every producer of input events, so a row the profiler
    would reject is rejected where its file and line are known, before it is published.
    """
    agent_ref = row.get("agent_ref")
    if agent_ref is not None and type(agent_ref) is not dict:
        raise InvalidRow(f"field 'agent_ref' must be an object or null, got {_shown(agent_ref)}")
    agent = _optional_name(agent_ref.get("name") if agent_ref else None, "agent_ref.name")
    return agent, _optional_name(row.get("_ng_environment_server"), "_ng_environment_server")


def keys_in(
    task: npt.NDArray[np.int64],
    rollout: npt.NDArray[np.int64],
    of_task: npt.NDArray[np.int64],
    of_rollout: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Per (``task``, ``rollout``) key, whether it is one of the keys (``of_task``,
    ``of_rollout``): e.g. which results have a materialized row. Keys outside the rows' index
    ranges (a task past the last) are no row's; the rest are coded as one int64 each (~15 ms
    for 800,000 keys), or compared as 16-byte values when the rows' ranges are too wide."""
    if not len(of_task):
        return np.zeros(len(task), dtype=np.bool_)
    t0, t1, r0, r1 = (
        int(of_task.min()),
        int(of_task.max()),
        int(of_rollout.min()),
        int(of_rollout.max()),
    )
    inside = (task >= t0) & (task <= t1) & (rollout >= r0) & (rollout <= r1)
    span = r1 - r0 + 1
    if (t1 - t0 + 1) * span < 2**62:
        codes = (task[inside] - t0) * span + (rollout[inside] - r0)
        inside[inside] = np.isin(codes, (of_task - t0) * span + (of_rollout - r0))
        return inside

    def pairs(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.void]:
        return np.ascontiguousarray(np.stack([a, b], 1)).view(np.dtype((np.void, 16))).ravel()

    inside[inside] = np.isin(pairs(task[inside], rollout[inside]), pairs(of_task, of_rollout))
    return inside


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
        self.in_order = array("q")  # position in the inputs file (line or byte offset)
        # results, in arrival order
        self.res_task = array("q")
        self.res_rollout = array("q")
        self.res_schema = array("i")
        self.res_masked = array("b")
        self.res_answer = array("q")  # answer identities (records.answer_id), for majority@k
        self.pool = array("d")
        # ints beyond 2**53, exact (their floats in the pool are rounded): pool position, value
        self.big_at = array("q")
        self.big_value = array("q")
        # rollout_infos entries, in offset order: info_taken bytes handed out (take_infos),
        # then entries merged in (held by reference: never copied, never changed), then
        # info_pool, where this state's own entries are appended
        self.info_taken = 0
        self.info_held: list[InfoBytes] = []
        self.info_pool = bytearray()
        self.info_end = array("q")  # end of each result's entry, counted from the first entry
        self.schemas: list[Shape] = []
        self._schema_ids: dict[Shape, int] = {}
        self.res_agent = array("i")  # live-stats agent hint per result (name id, -1: none)
        self._live: dict[str, RunningStats] = {}
        self._folded = 0  # results [0, _folded) are in _live, but those left out
        self._folded_pool = 0  # their values' length in the pool
        self._out: set[int] = set()  # results left out of the live figures (see leave_out)
        self._waiting: dict[tuple[int, int], tuple[int, int]] = {}  # key -> (result, pool at)

    # -- ingestion ------------------------------------------------------------------------
    def _name_id(self, name: str | None) -> int:
        if name is None:
            return _NO_NAME
        ident = self._name_ids.get(name)
        if ident is None:
            ident = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return ident

    def add_input(
        self,
        row: dict[str, Any],
        locator: int,
        order: int,
        key: tuple[int, int] | None = None,
        names: tuple[str | None, str | None] | None = None,
    ) -> None:
        """Record one materialized row; ``locator`` lets the sink read its ``sample`` back.

        ``order`` is the row's position in the inputs file (its line, or byte offset): rows may
        arrive in any order (several partitions), but the profile reads them in file order.
        ``key`` and ``names`` are ``row_key(row)`` and ``row_names(row)`` when the caller has
        them already. A bad row raises :class:`InvalidRow` before anything is recorded.
        """
        task, rollout = key or row_key(row)
        agent, server = names or row_names(row)
        self.in_task.append(task)
        self.in_rollout.append(rollout)
        self.in_agent.append(self._name_id(agent))
        self.in_server.append(self._name_id(server))
        self.in_locator.append(locator)
        self.in_order.append(order)

    def add_inputs(
        self,
        keys: list[tuple[int, int]],
        names: list[tuple[str | None, str | None]],
        locators: list[int],
        orders: list[int],
    ) -> None:
        """:meth:`add_input` of checked rows, column by column (the stream processor's
        batches); names get their ids in the order one call per row gives them."""
        name_ids = {name: self._name_id(name) for name in dict.fromkeys(chain(*names))}
        tasks, rollouts = zip(*keys, strict=True) if keys else ((), ())
        agents, servers = zip(*names, strict=True) if names else ((), ())
        self.in_task.fromlist(list(tasks))
        self.in_rollout.fromlist(list(rollouts))
        self.in_agent.fromlist(list(map(name_ids.__getitem__, agents)))
        self.in_server.fromlist(list(map(name_ids.__getitem__, servers)))
        self.in_locator.fromlist(locators)
        self.in_order.fromlist(orders)

    def add_result(
        self, result: dict[str, Any], agent: str | None = None, answer_key: str | None = None
    ) -> None:
        """Record one result row. ``agent``, when the caller knows it, feeds the live stats;
        ``answer_key`` names the field majority@k votes on."""
        task, rollout = row_key(result)
        self.add_record(task, rollout, extract_result(result, task, rollout, answer_key), agent)

    def add_record(
        self, task: int, rollout: int, record: ResultRecord, agent: str | None = None
    ) -> None:
        """Record an already extracted result (the stream processor extracts upstream)."""
        self.add_records([task], [rollout], [record], [agent])

    def add_records(
        self,
        tasks: Sequence[int],
        rollouts: Sequence[int],
        records: Sequence[ResultRecord],
        agents: Sequence[str | None],
    ) -> None:
        """Record extracted results, column by column (the stream processor's batches: a
        third of the cost of one call per result)."""
        bigs: list[tuple[int, int]] = []
        if any([record.big for record in records]):
            at = 0
            for record in records:
                bigs.extend((at + column, value) for column, value in record.big)
                at += len(record.values)
        self.add_columns(
            list(tasks),
            list(rollouts),
            [(record.names, record.is_int) for record in records],
            [record.masked for record in records],
            [record.answer for record in records],
            list(chain.from_iterable([record.values for record in records])),
            [record.info for record in records],
            list(agents),
            bigs,
        )

    def add_columns(
        self,
        tasks: list[int],
        rollouts: list[int],
        shapes: Sequence[Shape],
        masked: list[bool],
        answers: list[int],
        values: list[float],
        infos: Sequence[bytes],
        agents: list[str | None] | None = None,
        bigs: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Record results given as columns: per result its shape (column names, which hold
        ints), mask, answer identity and ``rollout_infos`` entry; ``values`` are all results'
        column values back to back, ``bigs`` the exact ints beyond 2**53 among them (position
        in ``values``, value). The batch reader's lean rows and the processor's decoded slices
        come so, without a record per result. A run of results of one shape object is looked
        up once, and lists go in by ``fromlist`` (twice as fast as ``extend``)."""
        schema_ids = self._schema_ids
        schemas: list[int] = []
        last: object = None
        ident = -1
        for shape in shapes:
            if shape is not last:  # no tuple hashed per result while the shape holds
                last, ident = shape, schema_ids.get(shape, -1)
                if ident < 0:
                    ident = schema_ids[shape] = len(self.schemas)
                    self.schemas.append(shape)
            schemas.append(ident)
        self.res_task.fromlist(tasks)
        self.res_rollout.fromlist(rollouts)
        self.res_schema.fromlist(schemas)
        self.res_masked.frombytes(bytes(masked))  # 0 or 1 each
        self.res_answer.fromlist(answers)
        if agents is None:
            self.res_agent.extend(array("i", [_NO_NAME]) * len(tasks))
        else:  # ids in the order one call per result gives them
            name_ids = {agent: self._name_id(agent) for agent in dict.fromkeys(agents)}
            self.res_agent.fromlist(list(map(name_ids.__getitem__, agents)))
        at = len(self.pool)
        for column, value in bigs:
            self.big_at.append(at + column)
            self.big_value.append(value)
        self.pool.fromlist(values)
        base = self.info_size
        self.info_pool += b"".join(infos)
        self.info_end.extend(islice(accumulate(map(len, infos), initial=base), 1, None))

    def take_infos(self) -> bytes:
        """Hand over the ``rollout_infos`` entries held so far (a caller keeps them on disk);
        offsets stay as they were, so :meth:`merge` needs them back as ``taken_infos``."""
        taken = b"".join([*self.info_held, self.info_pool])
        self.info_taken += len(taken)
        self.info_held, self.info_pool = [], bytearray()
        return taken

    @property
    def info_size(self) -> int:
        """Bytes of ``rollout_infos`` entries recorded (taken ones included): the next offset."""
        return self.info_taken + sum(map(len, self.info_held)) + len(self.info_pool)

    def info_segments(self) -> list[InfoBytes]:
        """The entries held, in offset order, from offset ``info_taken``."""
        return [*self.info_held, self.info_pool]

    def merge(
        self, other: ProfileState, locator_shift: int = 0, taken_infos: InfoBytes = b""
    ) -> None:
        """Fold another state (e.g. another shard's) into this one.

        ``locator_shift`` is added to the other's locators, so parts whose ``sample`` rows live
        in different files can say which file (see :data:`LOCATOR_BITS`). ``taken_infos`` are
        the other's entries given away by :meth:`take_infos`, its first ``info_taken`` bytes:
        they are held, not copied (a snapshot merges ~100 MB of them: copies cost fresh pages).
        The other's own pool is copied: it may keep growing.
        """
        if len(taken_infos) != other.info_taken:
            raise ValueError(f"merge needs {other.info_taken} bytes of taken rollout infos")
        info_base = self.info_size
        remap = np.array([self._name_id(n) for n in other.names] + [_NO_NAME], dtype=np.int32)
        pairs = (
            (self.in_agent, other.in_agent),
            (self.in_server, other.in_server),
            (self.res_agent, other.res_agent),
        )
        for mine, theirs in pairs:
            mine.extend(array("i", remap[np.frombuffer(theirs, dtype=np.int32)].tobytes()))
        self.in_task.extend(other.in_task)
        self.in_rollout.extend(other.in_rollout)
        locators = other.in_locator
        if locator_shift:
            locators = array("q", (np.frombuffer(locators, np.int64) + locator_shift).tobytes())
        self.in_locator.extend(locators)
        self.in_order.extend(other.in_order)
        schema_map = []
        for shape in other.schemas:
            ident = self._schema_ids.get(shape)
            if ident is None:
                ident = self._schema_ids[shape] = len(self.schemas)
                self.schemas.append(shape)
            schema_map.append(ident)
        self.res_task.extend(other.res_task)
        self.res_rollout.extend(other.res_rollout)
        mapped = np.array(schema_map, dtype=np.int32)[np.frombuffer(other.res_schema, np.int32)]
        self.res_schema.extend(array("i", mapped.tobytes()))
        self.res_masked.extend(other.res_masked)
        self.res_answer.extend(other.res_answer)
        big_at = np.frombuffer(other.big_at, np.int64) + len(self.pool)
        self.big_at.extend(array("q", big_at.tobytes()))
        self.big_value.extend(other.big_value)
        self.pool.extend(other.pool)
        if self.info_pool:  # own entries come first: move them where the held ones go
            self.info_held.append(self.info_pool)
            self.info_pool = bytearray()
        held = [taken_infos, *other.info_held, bytes(other.info_pool)]
        self.info_held += [segment for segment in held if len(segment)]
        shifted = np.frombuffer(other.info_end, np.int64) + info_base
        self.info_end.extend(array("q", shifted.tobytes()))
        # live stats are not merged: the merged results are folded from their values instead

    def results_kept(self, keep: npt.NDArray[np.bool_]) -> ProfileState:
        """A copy with only the results ``keep`` says (per result), its rows all kept: a merged
        state without the rollouts no materialized row has (dead letters, ``unknown-key``).
        Rare (a copy of every column and entry): the state must hold its entries
        (``info_taken`` 0, as a merge's does)."""
        if self.info_taken:
            raise ValueError("results_kept needs a state that holds its rollout infos")
        out = ProfileState()
        out._set_shapes(list(self.names), [list(map(list, shape)) for shape in self.schemas])
        for name in _COLUMNS["inputs"]:
            getattr(out, name).extend(getattr(self, name))
        idx = np.flatnonzero(keep)
        for name in _COLUMNS["results"][:-1]:
            column = getattr(self, name)
            getattr(out, name).frombytes(self.column(column)[idx].tobytes())
        schema = self.column(self.res_schema)
        starts, _ = self.value_starts(schema)
        widths = np.array([len(n) for n, _ in self.schemas] or [0], dtype=np.int64)[schema][idx]
        first = np.repeat(starts[idx] - (np.cumsum(widths) - widths), widths)
        values = first + np.arange(int(widths.sum()), dtype=np.int64)  # old pool positions
        out.pool.frombytes(self.column(self.pool)[values].tobytes())
        big_at, new_at = self.column(self.big_at), np.full(len(self.pool), -1, dtype=np.int64)
        new_at[values] = np.arange(len(values))
        moved = new_at[big_at] if len(big_at) else big_at
        out.big_at.frombytes(moved[moved >= 0].astype(np.int64).tobytes())
        out.big_value.frombytes(self.column(self.big_value)[moved >= 0].tobytes())
        infos = b"".join(self.info_segments())
        end = self.column(self.info_end)
        begin = np.r_[0, end[:-1]]
        out.info_pool += b"".join(
            infos[b:e] for b, e in zip(begin[idx].tolist(), end[idx].tolist(), strict=True)
        )
        out.info_end.frombytes(np.cumsum(end[idx] - begin[idx], dtype=np.int64).tobytes())
        return out

    # -- wire form (rewardstream.processors.engine.partwire): no pickle, no code runs on decode --
    def export_columns(self, taken_infos: InfoBytes = b"") -> tuple[dict[str, Any], list[Section]]:
        """A JSON-able header and the raw sections it lists (``[name, typecode, bytes]``, back
        to back), everything :meth:`from_columns` rebuilds this state from.

        ``taken_infos`` are the entries given away by :meth:`take_infos` (as for
        :meth:`merge`): the ``rollout_infos`` section is all entries in offset order. The
        sections are the live buffers, not copies: join them before this state grows again.
        """
        if len(taken_infos) != self.info_taken:
            raise ValueError(f"export needs {self.info_taken} bytes of taken rollout infos")
        names = [*_COLUMNS["inputs"], *_COLUMNS["results"], *_COLUMNS["big"], "pool"]
        columns: list[array[Any]] = [getattr(self, name) for name in names]
        infos = [taken_infos, *self.info_segments()]
        sections = [
            [n, c.typecode, len(c) * c.itemsize] for n, c in zip(names, columns, strict=True)
        ]
        sections.append(["rollout_infos", "B", sum(map(len, infos))])
        header = {
            "names": list(self.names),
            "schemas": list(self.schemas),
            "counts": {
                "inputs": self.num_inputs,
                "results": self.num_results,
                "big": len(self.big_at),
            },
            "sections": sections,
        }
        return header, [*columns, *infos]

    @classmethod
    def from_columns(cls, header: dict[str, Any], sections: dict[str, memoryview]) -> ProfileState:
        """The state :meth:`export_columns` gave ``header`` of, from its sections by name, each
        cast to its typecode (``rollout_infos``: bytes).

        Columns are copied (a merge appends to them); the entries are held, not copied, as a
        merge holds its segments. Live stats start unfolded: :meth:`live` recomputes them from
        the values. Sections that do not make one consistent state raise ``ValueError``, so a
        bad part fails here, not in a later profile.
        """
        state = cls()
        state._set_shapes(header.get("names"), header.get("schemas"))
        for name in (*_COLUMNS["inputs"], *_COLUMNS["results"], *_COLUMNS["big"], "pool"):
            column, data = getattr(state, name), sections.get(name)
            if data is None or data.format != column.typecode:
                raise ValueError(f"column {name!r} is missing or not {column.typecode!r} values")
            column.frombytes(data.cast("B"))
        counts = header.get("counts")
        for count, names in _COLUMNS.items():
            expected = counts.get(count) if isinstance(counts, dict) else None
            for name in names:
                if len(getattr(state, name)) != expected:
                    raise ValueError(
                        f"inconsistent columns: {name!r} holds {len(getattr(state, name))} of "
                        f"the state's {expected} {count}"
                    )
        infos = sections.get("rollout_infos")
        if infos is None or infos.format != "B":
            raise ValueError("the rollout_infos section is missing or not bytes")
        state._check_references(infos.nbytes)
        state.info_held = [infos] if infos.nbytes else []
        return state

    def _set_shapes(self, names: Any, schemas: Any) -> None:
        """Names and schemas from a header, with the indices that dedupe them."""
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("the state's names are not a list of strings")
        self.names, self._name_ids = names, {name: i for i, name in enumerate(names)}
        for shape in schemas if isinstance(schemas, list) else [None]:
            cols, ints = shape if isinstance(shape, list) and len(shape) == 2 else (None, None)
            if not (
                isinstance(cols, list)
                and isinstance(ints, list)
                and len(cols) == len(ints)
                and all(isinstance(c, str) for c in cols)
                and all(isinstance(i, bool) for i in ints)
            ):
                raise ValueError(f"the state's schemas are not [names, is_int] pairs: {shape!r}")
            self._schema_ids[tuple(cols), tuple(ints)] = len(self.schemas)
            self.schemas.append((tuple(cols), tuple(ints)))
        if len(self._name_ids) != len(names) or len(self._schema_ids) != len(self.schemas):
            raise ValueError("the state's names or schemas repeat")

    def _check_references(self, info_bytes: int) -> None:
        """What the columns point into (schemas, names, values, entries) must exist."""
        schema, end = self.column(self.res_schema), self.column(self.info_end)
        if len(schema) and not 0 <= schema.min() <= schema.max() < len(self.schemas):
            raise ValueError("inconsistent columns: a result's schema is not in the state's")
        if len(self.pool) != self.value_starts(schema)[1]:
            raise ValueError("inconsistent columns: the pool does not hold the results' values")
        big_at = self.column(self.big_at)
        if len(big_at) and not (
            big_at.min() >= 0
            and big_at.max() < len(self.pool)
            and np.array_equal(self.column(self.pool)[big_at], self.column(self.big_value))
        ):
            raise ValueError("inconsistent columns: an exact int is not one of the pool's")
        for column in (self.in_agent, self.in_server, self.res_agent):
            ids = self.column(column)
            if len(ids) and not _NO_NAME <= ids.min() <= ids.max() < len(self.names):
                raise ValueError("inconsistent columns: a name id is not in the state's names")
        if np.any(np.diff(end, prepend=0) < 0) or (end[-1] if len(end) else 0) != info_bytes:
            raise ValueError("inconsistent columns: rollout info offsets do not fit the infos")

    def leave_out(self) -> None:
        """Leave the last result out of the live figures (:meth:`live`, :meth:`counted`) until
        :meth:`count_in`: a rollout whose materialized row has not come (never, when none
        does: a foreign one). It is never folded in first, so nothing is taken out again."""
        at = self.num_results - 1
        self.leave_out_at(at, len(self.pool) - len(self.schemas[self.res_schema[at]][0]))

    def leave_out_at(self, at: int, start: int) -> None:
        """:meth:`leave_out` of result ``at``, whose values start at ``start`` in the pool."""
        self._out.add(at)
        self._waiting[self.res_task[at], self.res_rollout[at]] = (at, start)

    def count_in(self, key: tuple[int, int]) -> None:
        """The result of ``key``, left out, counts now (its row came): a Welford update per
        column when the lazy fold of :meth:`live` has passed it."""
        at, start = self._waiting.pop(key)
        self._out.discard(at)
        agent = self.res_agent[at]
        if at < self._folded and not self.res_masked[at] and agent >= 0:
            stats = self._live.setdefault(self.names[agent], RunningStats())
            stats.rollouts += 1
            for j, name in enumerate(self.schemas[self.res_schema[at]][0]):
                stats.columns.setdefault(name, Moments()).update(self.pool[start + j])

    def counted(self) -> npt.NDArray[np.bool_] | None:
        """Per result, whether it is in the live figures (None: all are)."""
        if not self._out:
            return None
        mask = np.ones(self.num_results, dtype=np.bool_)
        mask[list(self._out)] = False
        return mask

    def live(self) -> dict[str, RunningStats]:
        """Per-agent running moments of every numeric column over the unmasked results (but
        those left out: :meth:`leave_out`).

        Results are folded in lazily, a batch at a time (two-pass moments per batch, merged
        with Chan's formula), so ingestion pays nothing per value and a read costs only the
        results that arrived since the previous read.
        """
        lo, hi = self._folded, self.num_results
        if lo == hi:
            return self._live
        schema = np.frombuffer(self.res_schema, np.int32)[lo:hi].copy()
        agent = np.frombuffer(self.res_agent, np.int32)[lo:hi].copy()
        keep = (np.frombuffer(self.res_masked, np.int8)[lo:hi] == 0) & (agent >= 0)
        if self._out:
            out = np.fromiter(self._out, np.int64, len(self._out))
            keep[out[out >= lo] - lo] = False
        starts, total = self.value_starts(schema)
        base = self._folded_pool
        pool = np.frombuffer(self.pool, np.float64)[base : base + total].copy()
        self._folded, self._folded_pool = hi, base + total
        for ag, sc in {(int(a), int(c)) for a, c in zip(agent[keep], schema[keep], strict=True)}:
            rows = np.flatnonzero(keep & (agent == ag) & (schema == sc))
            names = self.schemas[sc][0]
            values = pool[starts[rows][:, None] + np.arange(len(names))]
            stats = self._live.setdefault(self.names[ag], RunningStats())
            stats.rollouts += len(rows)
            for j, name in enumerate(names):
                moments = stats.columns.setdefault(name, Moments())
                if len(rows) == 1:  # Welford's update: the common case at low traffic
                    moments.update(float(values[0, j]))
                else:
                    moments.merge(Moments.of(values[:, j]))
        return self._live

    def rewards_from(
        self, lo: int, pool_at: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.float64], int]:
        """Per result from ``lo`` on (whose values start at ``pool_at`` in the pool): its task,
        agent id (-1: none) and reward, NaN where it has none or is masked (no task mean
        counts it); and where the next result's values will start. The early-stop rules read
        a part's results this way, a batch at a time."""
        hi = self.num_results
        schema = np.frombuffer(self.res_schema, np.int32)[lo:hi].copy()
        starts, total = self.value_starts(schema)
        column = np.array([_index(n, _REWARD) for n, _ in self.schemas] or [-1], np.int64)[schema]
        usable = (column >= 0) & (np.frombuffer(self.res_masked, np.int8)[lo:hi] == 0)
        rewards = np.full(hi - lo, np.nan)
        pool = np.frombuffer(self.pool, np.float64)
        rewards[usable] = pool[pool_at + starts[usable] + column[usable]]
        del pool  # a view: the pool cannot grow while it lives
        tasks = np.frombuffer(self.res_task, np.int64)[lo:hi].copy()
        return (
            tasks,
            np.frombuffer(self.res_agent, np.int32)[lo:hi].copy(),
            rewards,
            pool_at + total,
        )

    def left_out(self, lo: int = 0) -> set[int]:
        """The results from ``lo`` on left out of the live figures (:meth:`leave_out`): their
        rows have not come (never, for a foreign one)."""
        return {at for at in self._out if at >= lo} if self._out else set()

    def value_starts(self, schema: npt.NDArray[np.int32]) -> tuple[npt.NDArray[np.int64], int]:
        """Where each of consecutive results (given their schema ids) starts in the value pool,
        relative to the first of them, and how many values they hold together."""
        widths = np.array([len(n) for n, _ in self.schemas] or [0], dtype=np.int64)[schema]
        return np.cumsum(widths) - widths, int(widths.sum())

    # -- read-only views for the profile builder --------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.in_task)

    @property
    def num_results(self) -> int:
        return len(self.res_task)

    @staticmethod
    def column(buf: array[Any]) -> npt.NDArray[Any]:
        """A read-only numpy view of a typed buffer, not a copy (a profile's build reads ~60 MB
        of them: copies cost fresh pages). The buffer cannot grow while a view of it lives
        (``BufferError``), so use a view at once and keep only what is derived from it."""
        return np.frombuffer(buf, dtype=_DTYPES[buf.typecode])


def _index(names: tuple[str, ...], name: str) -> int:
    """Where ``name`` is in ``names``; -1 when it is not."""
    return names.index(name) if name in names else -1
