"""Build NeMo Gym 0.7.0's three profile outputs from a :class:`ProfileState`.

The rules: docs/nemo-gym-compat.md §Profiling.

Pure: no I/O. ``sample`` rows are returned as locators for the sink to read back. The same
function gives the final profile and any partial one (``allow_partial=True``), so a snapshot
taken mid-stream is by construction what batch ``ng_reward_profile`` writes for that prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from rewardstream.errors import ProfileError
from rewardstream.processors.core.confseq import Tally, task_intervals
from rewardstream.processors.core.difficulty import EDGES, Difficulty, difficulty, task_means
from rewardstream.processors.core.kernels import (
    GroupStats,
    Summary,
    describe_groups,
    quantile_int64,
    summarize_present,
)
from rewardstream.processors.core.metric_names import ACROSS_REPEATS, is_primary_metric
from rewardstream.processors.core.passk import (
    key_metrics,
    live_ks,
    pass_at_k_sums,
    pass_majority_metrics,
)
from rewardstream.processors.core.state import InfoBytes, ProfileState

__all__ = [
    "CompletionSummary",
    "Profile",
    "TaskFigures",
    "TaskRow",
    "TaskRows",
    "build_profile",
    "live_figures",
    "sampled_rows",
    "token_bin",
]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_STATS = ("mean", "max", "min", "median", "std")
# After 0.7.0's words for a duplicate key: the usual cause, files of shards put together.
_SHARDS_HINT = (
    "A (task, rollout) key names one rollout of one task: shards of one collection must number "
    "their tasks across the whole dataset (give every dataset row its _ng_task_index before "
    "splitting it; rows without one are numbered from 0 in each shard)"
)


class CompletionSummary(NamedTuple):
    """NeMo Gym's ``profile_completion_summary`` (docs/nemo-gym-compat.md §Completion summary),
    over the unmasked data."""

    expected_rollout_rows: int
    completed_rollout_rows: int
    missing_rollout_rows: int
    extra_rollout_rows: int
    reward_profile_completion_pct: float
    total_input_rows: int
    complete_input_rows: int
    partial_input_rows: int
    missing_input_rows: int


class TaskRow(NamedTuple):
    """One ``_reward_profiling.jsonl`` line, rendered but for its ``sample``: ``head`` is the
    line up to the sample value, ``tail`` the rest (newline included)."""

    head: bytes
    sample_locator: int
    tail: bytes

    def render(self, sample: bytes) -> bytes:
        """The line, given the serialized sample row."""
        return b"".join((self.head, sample, self.tail))


@dataclass(frozen=True)
class TaskRows:
    """The task rows, built a chunk at a time as they are iterated (written or sent).

    Held as dicts they would be the largest object of a profile (~2 KB per task); building
    them lazily keeps peak memory at the state plus one chunk. Any range of rows can be built
    on its own, so several processes can render one profile.
    """

    count: int
    make: Callable[[int, int], Iterator[TaskRow]]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[TaskRow]:
        return self.make(0, self.count)

    def range(self, start: int, stop: int) -> Iterator[TaskRow]:
        """Rows ``start`` to ``stop - 1``, as iterating would give them."""
        return self.make(start, stop)


class Profile:
    """Everything ``ng_reward_profile`` writes and prints.

    The agent-level metrics and the completion summary are computed when first read: a
    snapshot needs no summary, and its second renderer computes the agent metrics while the
    first renders task rows.
    """

    def __init__(
        self,
        task_rows: TaskRows,
        masked_rollouts: int,
        agents: Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
        summary: Callable[[], CompletionSummary],
        groups: Callable[[], list[_Group]],
    ) -> None:
        self.task_rows, self.masked_rollouts = task_rows, masked_rollouts
        self._agents, self._summary, self._groups = agents, summary, groups

    @cached_property
    def _agent_entries(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self._agents()

    @property
    def agent_metrics(self) -> list[dict[str, Any]]:
        """``_agent_metrics.json``: one entry per agent label (docs/nemo-gym-compat.md §Agent
        metrics)."""
        return self._agent_entries[0]

    @property
    def repeat_metrics(self) -> list[dict[str, Any]]:
        """``_repeat_level_metrics.json``: one entry per (label, rollout index)
        (docs/nemo-gym-compat.md §Repeat-level metrics)."""
        return self._agent_entries[1]

    @cached_property
    def summary(self) -> CompletionSummary:
        return self._summary()

    def aggregate_metrics(self, answers: bool) -> list[dict[str, Any]]:
        """``_aggregate_metrics.json`` as NeMo Gym's pass@k servers make it
        (docs/nemo-gym-compat.md §Aggregate metrics), one entry per agent label: its profile
        entry with pass@k, avg-of-k and majority@k (with ``answers``: the results carry their
        answer identities), ``num_repeats``, the headline ``key_metrics`` and its repeat-level
        rows."""
        by_name = {g.name: g for g in self._groups()}
        out = []
        for entry in self.agent_metrics:
            name = entry["agent_ref"]["name"]
            group = by_name.get(name)
            metrics = {k: v for k, v in entry.items() if k != "agent_ref"}
            if group is not None:
                metrics |= pass_majority_metrics(
                    group.task, group.reward, group.answer if answers else None, group.reward_int
                )
                metrics["num_repeats"] = group.repeats
            repeats = [
                {k: v for k, v in e.items() if k != "agent_ref"}
                for e in self.repeat_metrics
                if e["agent_ref"]["name"] == name
            ]
            out.append(
                {
                    "agent_ref": {"name": name},
                    "agent_metrics": metrics,
                    "key_metrics": key_metrics(metrics),
                    "repeat_level_metrics": repeats,
                }
            )
        return out

    def task_difficulty(self) -> list[dict[str, Any]]:
        """``_task_difficulty.json`` (rewardstream's own, beside NeMo Gym's files): per agent
        label, :func:`~rewardstream.processors.core.difficulty.difficulty` of its tasks."""
        return [
            {"agent_ref": {"name": g.name}, **difficulty(g.task, g.reward)} for g in self._groups()
        ]

    def intervals(self, level: float) -> dict[str, Any]:
        """``_intervals.json`` (rewardstream's own, beside NeMo Gym's files): per agent label
        the mean reward's anytime-valid interval over its rollouts in (task, rollout) order,
        the same whichever processor or command writes it, and each task's
        (docs/intervals.md); None where a reward fell outside [0, 1]."""
        agents = []
        for g in self._groups():
            tally = Tally()
            tally.add_many(g.reward)
            now = tally.interval(level)
            ids, n, lower, upper = task_intervals(g.task, g.reward, 1 - level)
            tasks = [
                {"_ng_task_index": i, "rollouts": k, "lower": _or_none(lo), "upper": _or_none(hi)}
                for i, k, lo, hi in zip(
                    ids.tolist(), n.tolist(), lower.tolist(), upper.tolist(), strict=True
                )
            ]
            agents.append(
                {
                    "agent_ref": {"name": g.name},
                    "rollouts": len(g.reward),
                    "mean_reward": {
                        "lower": None if now is None else now.lower,
                        "upper": None if now is None else now.upper,
                        "range": [tally.lo, tally.hi],
                        "outside": tally.outside,
                    },
                    "tasks": tasks,
                }
            )
        return {"level": level, "agents": agents}


def _or_none(x: float) -> float | None:
    return None if np.isnan(x) else x


class _Group(NamedTuple):
    """One agent label's measured results with a numeric reward, in key order."""

    name: str
    task: I64
    reward: npt.NDArray[np.float64]
    reward_int: npt.NDArray[np.bool_]  # an int (or bool) in its row: Python sums those apart
    answer: I64
    repeats: int  # distinct rollout indices among the label's measured results


def _encode(a: I64, b: I64) -> tuple[I64, Any]:
    """Order-preserving int64 codes of (a, b) pairs, and a function decoding codes back.

    Sorting codes sorts pairs lexicographically; this avoids numpy's slow structured sorts.
    """
    if not len(a):
        return np.zeros(0, dtype=np.int64), lambda c: (c, c)
    a0, b0 = int(a.min()), int(b.min())
    span = int(b.max()) - b0 + 1
    if (int(a.max()) - a0 + 1) * span >= 2**62:
        raise ProfileError("task/rollout indices span too wide a range to profile")
    codes = (a - a0) * span + (b - b0)
    return codes, lambda c: (c // span + a0, c % span + b0)


def _unique(values: I64) -> tuple[I64, I64, I64]:
    """``np.unique(values, return_inverse=True, return_counts=True)``, the same arrays; by a
    presence table when the values span a small range (dense key codes, task ids): linear
    where the sort took ~0.4 s of a snapshot at 1.5M keys."""
    n = len(values)
    if n:
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= 4 * n + 1024:
            at = values - low
            counts = np.bincount(at, minlength=span)
            present = counts > 0
            rank = np.cumsum(present, dtype=np.int64) - 1
            return np.flatnonzero(present) + low, rank[at], counts[present]
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return unique, inverse.astype(np.int64), counts.astype(np.int64)


class _Inputs(NamedTuple):
    """The materialized rows' columns in file order (they may have arrived in any order)."""

    task: I64
    rollout: I64
    agent: I64
    server: I64
    locator: I64

    @classmethod
    def of(cls, state: ProfileState) -> _Inputs:
        position = state.column(state.in_order)
        if np.all(position[1:] >= position[:-1]):  # arrived in file order: the common case
            order: slice | I64 = slice(None)
        else:
            order = np.argsort(position, kind="stable")
        return cls(
            *(
                state.column(buf)[order].astype(np.int64)
                for buf in (
                    state.in_task,
                    state.in_rollout,
                    state.in_agent,
                    state.in_server,
                    state.in_locator,
                )
            )
        )


class _Keys(NamedTuple):
    """Dense key ids (ascending (task, rollout) order) of every row and every result."""

    size: int
    of_input: I64
    of_result: I64


def _align(state: ProfileState, inputs: _Inputs, allow_partial: bool) -> _Keys:
    """Dense key ids plus NeMo Gym's alignment checks, in its order (docs/nemo-gym-compat.md
    §Alignment)."""
    n_in = len(inputs.task)
    tasks = np.concatenate([inputs.task, state.column(state.res_task)])
    rollouts = np.concatenate([inputs.rollout, state.column(state.res_rollout)])
    codes, decode = _encode(tasks, rollouts)
    unique, inverse, _ = _unique(codes)
    k_in, k_res = inverse[:n_in], inverse[n_in:]
    c_in = np.bincount(k_in, minlength=len(unique))
    c_res = np.bincount(k_res, minlength=len(unique))

    def keys(ids: I64) -> str:
        t, r = decode(unique[ids[:10]])
        return str(list(zip(t.tolist(), r.tolist(), strict=True)))

    for counts, what in ((c_in, "materialized input"), (c_res, "result")):
        dup = np.flatnonzero(counts > 1)
        if len(dup):
            raise ProfileError(
                f"Duplicate {what} row for rollout key {keys(dup)[1:-1]}. " + _SHARDS_HINT
            )
    extra = np.flatnonzero((c_res > 0) & (c_in == 0))
    if len(extra):
        raise ProfileError(
            "Rollout results contain rows with no matching materialized input rows. "
            f"Found {len(extra)} extra rollout rows. Extra rollout keys: {keys(extra)}"
        )
    missing = np.flatnonzero((c_in > 0) & (c_res == 0))
    if len(missing) and not allow_partial:
        raise ProfileError(
            "Materialized input rows and rollout results do not have matching rollout keys. "
            f"Missing rollout results for {len(missing)} materialized input rows. "
            f"Missing rollout keys: {keys(missing)}.\n\n"
            "Use ++allow_partial_rollouts=True to profile completed rollouts from a partial "
            "collection."
        )
    return _Keys(len(unique), k_in, k_res)


def _pair_counts(a: I64, b: I64) -> dict[tuple[int, int], int]:
    codes, decode = _encode(a, b)
    unique, _, counts = _unique(codes)
    x, y = decode(unique)
    return dict(zip(zip(x.tolist(), y.tolist(), strict=True), counts.tolist(), strict=True))


def _summary(task: I64, run_key: I64, matched: npt.NDArray[np.bool_]) -> CompletionSummary:
    """Extras never reach here: they fail alignment in both modes."""
    expected = _pair_counts(task, run_key)
    done = _pair_counts(task[matched], run_key[matched])
    completed = int(matched.sum())
    total = len(task)
    complete = sum(1 for k, n in expected.items() if done.get(k, 0) == n)
    without = sum(1 for k in expected if k not in done)
    return CompletionSummary(
        expected_rollout_rows=total,
        completed_rollout_rows=completed,
        missing_rollout_rows=total - completed,
        extra_rollout_rows=0,
        reward_profile_completion_pct=100.0 * completed / total if total else 100.0,
        total_input_rows=len(expected),
        complete_input_rows=complete,
        partial_input_rows=len(expected) - complete - without,
        missing_input_rows=without,
    )


def _labels(run_key: I64, agent: I64, names: list[str]) -> dict[int, int]:
    """Run key -> label name id (docs/nemo-gym-compat.md §Run labels), from the measured rows in
    file order."""
    known = run_key >= 0
    run_key, agent = run_key[known], agent[known]
    keys, first = np.unique(run_key, return_index=True)
    first_agent = dict(zip(keys.tolist(), agent[first].tolist(), strict=True))
    codes, decode = _encode(agent, run_key)
    pair_agent, _ = decode(np.unique(codes))
    ags, n_keys = np.unique(pair_agent, return_counts=True)
    keys_per_agent = dict(zip(ags.tolist(), n_keys.tolist(), strict=True))
    label = {
        rk: ag if ag >= 0 and keys_per_agent[ag] == 1 else rk for rk, ag in first_agent.items()
    }
    users: dict[str, int] = {}
    for lab in label.values():
        users[names[lab]] = users.get(names[lab], 0) + 1
    return {rk: rk if users[names[lab]] > 1 else lab for rk, lab in label.items()}


class _Frame(NamedTuple):
    """Measured matched records in key order, as a dense (rollout x column) matrix; ``big``
    holds the exact ints beyond 2**53 (column -> row -> value) whose floats the matrix rounds,
    ``int_columns`` which columns are ints in every row (pandas' int64 columns)."""

    columns: list[str]
    values: npt.NDArray[np.float64]
    all_int: bool
    big: dict[int, dict[int, int]]
    int_columns: npt.NDArray[np.bool_]

    def exact(self, rows: I64, column: int) -> list[int] | None:
        """The column's ints over ``rows`` exactly, or None when floats hold them exactly (no
        big one among them, or not an int column)."""
        held = self.big.get(column)
        if not held or not self.int_columns[column]:
            return None
        hit = np.flatnonzero(np.isin(rows, np.fromiter(held, np.int64, len(held))))
        if not len(hit):
            return None
        out = list(map(int, self.values[rows, column].tolist()))  # exact up to 2**53
        for i in hit.tolist():
            out[i] = held[int(rows[i])]
        return out


def _frame(state: ProfileState, results: I64) -> _Frame:
    schema_of = state.column(state.res_schema)
    starts, _ = state.value_starts(schema_of)
    pool = state.column(state.pool)
    schemas = schema_of[results]
    if len(schemas) and schemas.min() == schemas.max():  # one schema: the common case
        groups = [np.arange(len(schemas))]
    else:
        order = np.argsort(schemas, kind="stable")
        bounds = np.flatnonzero(np.diff(schemas[order])) + 1
        groups = np.split(order, bounds) if len(order) else []
        groups.sort(key=lambda g: int(g[0]))  # first appearance in key order
    columns: dict[str, int] = {}
    int_rows = np.zeros(0, dtype=np.int64)
    placed = []
    for rows in groups:
        names, is_int = state.schemas[int(schemas[rows[0]])]
        cols = [columns.setdefault(n, len(columns)) for n in names]
        if len(int_rows) < len(columns):
            int_rows = np.pad(int_rows, (0, len(columns) - len(int_rows)))
        for c, flag in zip(cols, is_int, strict=True):
            int_rows[c] += len(rows) if flag else 0
        placed.append((rows, cols))
    width = len(columns)
    if len(results) and width and schema_of.min() == schema_of.max():  # the state: one shape
        values = pool[: len(schema_of) * width].reshape(-1, width)[results]  # rows: one gather
    elif len(placed) == 1:  # every row has every column, in order: one gather
        values = pool[starts[results][:, None] + np.arange(width)]
    else:
        values = np.full((len(results), len(columns)), np.nan)
        for rows, cols in placed:
            pos = starts[results[rows]][:, None] + np.arange(len(cols))
            values[rows[:, None], np.asarray(cols, dtype=np.int64)[None, :]] = pool[pos]
    int_columns = int_rows == len(results)
    return _Frame(
        list(columns), values, bool(np.all(int_columns)), _big(state, results, columns), int_columns
    )


def _big(state: ProfileState, results: I64, columns: dict[str, int]) -> dict[int, dict[int, int]]:
    """:attr:`_Frame.big` from the state's exact ints (few: a search per one)."""
    big: dict[int, dict[int, int]] = {}
    if not len(state.big_at):
        return big
    schema_of = state.column(state.res_schema)
    starts, _ = state.value_starts(schema_of)
    row_of = np.full(len(schema_of), -1, dtype=np.int64)
    row_of[results] = np.arange(len(results))
    at = state.column(state.big_at)
    owner = np.searchsorted(starts, at, side="right") - 1
    for pos, result, value in zip(
        at.tolist(), owner.tolist(), state.column(state.big_value).tolist(), strict=True
    ):
        row = int(row_of[result])
        if row >= 0:  # a masked or unmatched result is not in the frame
            name = state.schemas[int(schema_of[result])][0][pos - int(starts[result])]
            big.setdefault(columns[name], {})[row] = value
    return big


_CHUNK_VALUES = 1 << 20  # values per vectorised call: bounds the kernels' temporaries (~8 MB each)


def _describe_segments(
    values: npt.NDArray[np.float64], rows: I64, starts: I64, sizes: I64
) -> GroupStats:
    """Stats of the row segments ``rows[starts[g] : starts[g] + sizes[g]]`` of ``values``.

    Vectorised over all segments of equal size, in chunks so memory stays flat.
    """
    n_cols, n_groups = values.shape[1], len(starts)
    out = [np.full((n_cols, n_groups), np.nan) for _ in range(5)]
    count = np.zeros((n_cols, n_groups), dtype=np.int64)
    for size in np.unique(sizes).tolist():
        same = np.flatnonzero(sizes == size)
        step = max(1, _CHUNK_VALUES // max(size * n_cols, 1))
        for which in np.array_split(same, range(step, len(same), step)):
            idx = rows[starts[which][:, None] + np.arange(size)]
            if size * n_cols <= _CHUNK_VALUES:
                stats = describe_groups(np.ascontiguousarray(values[idx].transpose(2, 0, 1)))
                count[:, which] = stats.n
                for target, got in zip(out, stats[1:], strict=True):
                    target[:, which] = got
                continue
            # a group wider than a chunk (an agent's rows): a column at a time, the kernels'
            # temporaries one column's size (the whole block: ~300 MB at 400,000 x 15)
            complete = not any(np.isnan(values[idx, c]).any() for c in range(n_cols))
            for c in range(n_cols):
                stats = describe_groups(values[idx, c][None, ...], complete)
                count[c, which] = stats.n[0]
                for target, got in zip(out, stats[1:], strict=True):
                    target[c, which] = got[0]
    mean, mx, mn, median, std = out
    if n_cols:  # NaN->0 std rule (docs/nemo-gym-compat.md §Std fill rule)
        fill = np.isnan(std).all(axis=0)[None, :] & (count == sizes[None, :])
        std = np.where(fill, 0.0, std)
    return GroupStats(count, mean, mx, mn, median, std)


class _StatKeys(NamedTuple):
    """The ``mean/* max/* min/* median/* std/*`` keys, in output order, and which of them
    are written as ints (max and min when every column is int, docs/nemo-gym-compat.md §Max and
    min type)."""

    keys: list[str]
    is_int: list[bool]

    @classmethod
    def of(cls, columns: list[str], all_int: bool) -> _StatKeys:
        keys = [f"{stat}/{name}" for stat in _STATS for name in columns]
        ints = [all_int and stat in ("max", "min") for stat in _STATS for _ in columns]
        return cls(keys, ints)

    def row(self, values: list[float], exact: dict[int, int] | None = None) -> dict[str, Any]:
        """One group's stats as a dict; missing (NaN) stats omitted; ``exact`` (key index ->
        int) overrides an int stat the floats round (:meth:`exact_extremes`)."""
        out = {
            k: int(v) if i else v
            for k, i, v in zip(self.keys, self.is_int, values, strict=True)
            if v == v  # not NaN
        }
        for j, value in (exact or {}).items():
            out[self.keys[j]] = value
        return out

    def exact_extremes(
        self, frame: _Frame, rows: I64, starts: I64, sizes: I64
    ) -> dict[int, dict[int, int]]:
        """Per group (``rows[starts[g]:][:sizes[g]]``) holding an int beyond 2**53, key index ->
        its column's exact max and min, written as ints (pandas keeps int64 max/min exact)."""
        if not frame.big or not any(self.is_int):
            return {}
        n = len(frame.columns)
        top, bottom = _STATS.index("max") * n, _STATS.index("min") * n
        out: dict[int, dict[int, int]] = {}
        base = int(starts[0]) if len(starts) else 0
        span = rows[base : int(starts[-1] + sizes[-1])] if len(starts) else rows[:0]
        for c in sorted(frame.big):
            held = np.isin(span, np.fromiter(frame.big[c], np.int64, len(frame.big[c])))
            for g, (start, size) in enumerate(zip(starts.tolist(), sizes.tolist(), strict=True)):
                if held[start - base : start - base + size].any():
                    exact = frame.exact(rows[start : start + size], c)
                    assert exact is not None  # every column is int here, and one is big
                    out.setdefault(g, {}).update({top + c: max(exact), bottom + c: min(exact)})
        return out


def _stat_table(stats: GroupStats) -> npt.NDArray[np.float64]:
    """The stats as a (group x key) matrix, keys in :class:`_StatKeys` order."""
    arrays = (stats.mean, stats.max, stats.min, stats.median, stats.std)
    return np.concatenate(arrays, axis=0).T


def _tokens(values: npt.NDArray[Any]) -> list[bytes]:
    """Each value of a 1-D array as orjson writes it: one call for all of them (orjson writes
    a numpy float64 exactly as the Python float; NaN and infinities as ``null``)."""
    if not len(values):
        return []
    return orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")


class _RowFormat:
    """Renders task rows a chunk at a time: byte templates filled with number tokens that
    orjson formats per column (~3 us per row where a dict per row and a dump of it took ~10).
    A row with a missing stat, whose keys are then omitted, goes through a dict instead."""

    _TAIL = (
        b',"num_rollouts":%d,"expected_num_rollouts":%d,"missing_num_rollouts":%d,'
        b'"reward_profile_completion_pct":%s,"rollout_infos":%s}\n'
    )

    def __init__(self, columns: list[str], all_int: bool, agent_refs: list[bytes] | None):
        self.stat_keys = _StatKeys.of(columns, all_int)
        self.agent_refs = agent_refs  # by label name id, under fan-out
        fields = [b'"_ng_task_index":%d']
        fields += [orjson.dumps(k).replace(b"%", b"%%") + b":%s" for k in self.stat_keys.keys]
        if agent_refs is not None:
            fields.append(b'"agent_ref":%s')
        self._head = b"{" + b",".join(fields) + b',"sample":'

    def heads(
        self,
        tasks: list[int],
        labels: list[int],
        table: npt.NDArray[np.float64],
        exact: dict[int, dict[int, int]],
    ) -> list[bytes]:
        """Each group's line up to its sample value (``exact``: see
        :meth:`_StatKeys.exact_extremes`; such a line goes through the dict path)."""
        bad = np.asarray(np.isnan(table).any(axis=1), dtype=np.bool_)
        bad[list(exact)] = True
        columns: list[list[bytes]] = []
        for j, is_int in enumerate(self.stat_keys.is_int):
            column = table[:, j]
            if is_int:  # exact ints below 2**63; others (and NaN) through the dict path
                fits = np.abs(column) < 2.0**63
                bad |= ~fits
                column = np.where(fits, column, 0.0).astype(np.int64)
            columns.append(_tokens(column))
        refs = self.agent_refs
        extra = [[refs[lab] for lab in labels]] if refs is not None else []
        out = [self._head % args for args in zip(tasks, *columns, *extra, strict=True)]
        for i in np.flatnonzero(bad).tolist():
            head = {"_ng_task_index": tasks[i]} | self.stat_keys.row(
                table[i].tolist(), exact.get(i)
            )
            if refs is not None:
                head["agent_ref"] = orjson.Fragment(refs[labels[i]])
            out[i] = orjson.dumps(head)[:-1] + b',"sample":'
        return out

    def tails(self, nums: I64, expected: I64, infos: list[bytes]) -> list[bytes]:
        """Each group's line after its sample value (docs/nemo-gym-compat.md §Profile rows, keys
        5-7)."""
        with np.errstate(divide="ignore", invalid="ignore"):  # a group expects >= its rollouts
            pct = np.where(expected > 0, 100.0 * nums / expected, 100.0)
        return [
            self._TAIL % args
            for args in zip(
                nums.tolist(),
                expected.tolist(),
                (expected - nums).tolist(),
                _tokens(pct),
                infos,
                strict=True,
            )
        ]


# (key label, Summary field) in output order; the two places name and order them differently
_REPEAT_KEYS = (
    *(("mean", "mean"), ("median", "median"), ("std", "std"), ("sem", "se")),
    *(("min", "min"), ("max", "max"), ("p25", "p25"), ("p75", "p75")),
)
_ACROSS_KEYS = (
    ("mean", "mean"),
    ("median", "median"),
    ("std", "std"),
    ("min", "min"),
    ("max", "max"),
    ("se", "se"),
)


def _summary_keys(s: Summary, keys: tuple[tuple[str, str], ...], suffix: str) -> dict[str, Any]:
    """``<label><suffix>`` -> value for each key, then the CI bounds when there is one."""
    out = {label + suffix: getattr(s, field) for label, field in keys}
    if s.ci is not None:
        out["ci_low_95" + suffix], out["ci_high_95" + suffix] = s.ci
    return out


def _repeat_entries(
    label: str, rollouts: I64, tasks: I64, frame: _Frame, of: I64
) -> list[dict[str, Any]]:
    """The label's repeat-level rows; ``of`` are its rows of ``frame``."""
    columns = frame.columns
    by_name = sorted(range(len(columns)), key=lambda c: columns[c])
    n_tasks = len(_unique(tasks)[0])
    entries = []
    for r in _unique(rollouts)[0].tolist():
        rows = of[rollouts == r]
        entry: dict[str, Any] = {
            "agent_ref": {"name": label},
            "_ng_rollout_index": r,
            "sample_count": len(rows),
            "missing_count": n_tasks - len(rows),
        }
        for c in by_name:
            s = summarize_present(frame.values[rows, c])
            if s is None:
                continue
            exact = frame.exact(rows, c)  # int columns: no NaN, so the same rows as ``s``
            if exact is not None:
                s = s._replace(p25=quantile_int64(exact, 0.25), p75=quantile_int64(exact, 0.75))
            entry |= _summary_keys(s, _REPEAT_KEYS, f"/{columns[c]}")
        entries.append(entry)
    return entries


def _across_repeats(entries: list[dict[str, Any]]) -> dict[str, Any]:
    keys: dict[str, None] = {}
    for entry in entries:
        for key in entry:
            if key.startswith("mean/") and is_primary_metric(key):
                keys[key] = None
    out: dict[str, Any] = {}
    for key in keys:
        x = np.array([e[key] for e in entries if key in e], dtype=np.float64)
        s = summarize_present(x)
        assert s is not None
        out |= _summary_keys(s, _ACROSS_KEYS, f"{ACROSS_REPEATS}{key}")
    return out


def _coverage(agent: I64, task: I64, masked: npt.NDArray[np.bool_]) -> dict[int, dict[str, int]]:
    """``coverage/*`` per agent that has a masked result, in order of first result
    (docs/nemo-gym-compat.md §Masking)."""
    out: dict[int, dict[str, int]] = {}
    for ag in dict.fromkeys(agent[masked].tolist()):
        if ag < 0:
            continue
        mine = agent == ag
        kept = mine & ~masked
        measured_tasks = set(task[kept].tolist())
        out[ag] = {
            "coverage/measured_rollouts": int(kept.sum()),
            "coverage/masked_rollouts": int((mine & masked).sum()),
            "coverage/measured_tasks": len(measured_tasks),
            "coverage/fully_masked_tasks": len(set(task[mine].tolist()) - measured_tasks),
        }
    first = {ag: int(np.flatnonzero(agent == ag)[0]) for ag in out}
    return dict(sorted(out.items(), key=lambda kv: first[kv[0]]))


# task rows built per chunk: bounds the per-chunk lists (1,024 freed ~2 MB per chunk, which
# glibc gave back and took again: 3x the page faults in a snapshot's renderers, measured)
_GROUPS_PER_CHUNK = 256


class _Infos(NamedTuple):
    """The state's serialized ``rollout_infos`` entries: the buffers holding them (see
    :meth:`ProfileState.info_segments`), and each result's buffer and span in it."""

    segments: list[InfoBytes]
    segment: I64
    begin: I64
    end: I64

    @classmethod
    def of(cls, state: ProfileState) -> _Infos:
        segments = state.info_segments()
        end = state.column(state.info_end).astype(np.int64)
        bounds = np.cumsum([len(s) for s in segments], dtype=np.int64)  # entries never straddle
        segment = np.searchsorted(bounds, end, side="left")
        start = np.r_[0, bounds][segment]
        return cls(segments, segment, np.r_[0, end][:-1] - start, end - start)

    def arrays(self, results: I64, sizes: I64) -> list[bytes]:
        """Each group's JSON array of its results' entries (``results`` are the groups' members
        back to back, ``sizes`` long). Joins memoryview slices: ~0.35 us per entry, less than
        a numpy byte gather (measured), and no copy of the buffers."""
        segment, begin, end = (a[results].tolist() for a in (self.segment, self.begin, self.end))
        views, out, i = [memoryview(s) for s in self.segments], [], 0
        for n in sizes.tolist():  # per group: a chunk's slices at once would churn the heap
            spans = zip(segment[i : i + n], begin[i : i + n], end[i : i + n], strict=True)
            out.append(b"".join((b"[", b",".join([views[s][a:b] for s, a, b in spans]), b"]")))
            i += n
        return out


class _Rollouts(NamedTuple):
    """The measured, matched results in key order, with what grouping needs of each."""

    result: I64  # index into the state's result buffers
    row: I64  # index of the materialized row
    task: I64
    rollout: I64
    label: I64  # name id, -1 when the row has neither agent nor environment server
    frame: _Frame


def _task_rows(
    names: list[str],
    locator: I64,
    infos: _Infos,
    r: _Rollouts,
    m_task: I64,
    m_label: I64,
    fan_out: bool,
) -> TaskRows:
    """Group by task, or by (task, label) under fan-out (docs/nemo-gym-compat.md §Run labels,
    §Profile rows); rows built lazily."""
    if fan_out:
        labelled = m_label >= 0
        keep = np.flatnonzero(r.label >= 0)
        rank = {
            lab: i
            for i, lab in enumerate(sorted(set(m_label[labelled].tolist()), key=names.__getitem__))
        }
        r_rank = np.array([rank[x] for x in r.label[keep].tolist()], dtype=np.int64)
        keep = keep[np.lexsort((keep, r_rank, r.task[keep]))]
        group_key = np.stack([r.task[keep], r.label[keep]], axis=1)
        expected = _pair_counts(m_task[labelled], m_label[labelled])
    else:
        keep = np.arange(len(r.result))
        group_key = np.stack([r.task, np.full(len(r.result), -1)], axis=1)
        expected = _pair_counts(m_task, np.full(len(m_task), -1))
    boundary = np.any(np.diff(group_key, axis=0) != 0, axis=1)
    starts = np.flatnonzero(np.r_[len(keep) > 0, boundary]).astype(np.int64)
    sizes = np.diff(np.r_[starts, len(keep)]).astype(np.int64)

    refs = [orjson.dumps({"name": name}) for name in names] if fan_out else None
    fmt = _RowFormat(r.frame.columns, r.frame.all_int, refs)

    def make_rows(start: int, stop: int) -> Iterator[TaskRow]:
        ends = np.cumsum(sizes)
        for lo in range(start, stop, _GROUPS_PER_CHUNK):
            hi = min(lo + _GROUPS_PER_CHUNK, stop)
            # a chunk of rows at a time: one numpy call per column, not one per row
            firsts, nums = group_key[starts[lo:hi]], sizes[lo:hi]
            tasks, labels = firsts[:, 0].tolist(), firsts[:, 1].tolist()
            exp = np.array(
                [expected[key] for key in zip(tasks, labels, strict=True)], dtype=np.int64
            )
            samples = locator[r.row[keep[starts[lo:hi]]]].tolist()
            arrays = infos.arrays(r.result[keep[starts[lo] : ends[hi - 1]]], nums)
            stats = _describe_segments(r.frame.values, keep, starts[lo:hi], nums)
            exact = fmt.stat_keys.exact_extremes(r.frame, keep, starts[lo:hi], nums)
            heads = fmt.heads(tasks, labels, _stat_table(stats), exact)
            tails = fmt.tails(nums, exp, arrays)
            yield from map(TaskRow, heads, samples, tails)

    return TaskRows(len(starts), make_rows)


def _agent_metrics(
    names: list[str], r: _Rollouts
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Agent entries and repeat-level rows, per label sorted by name (docs/nemo-gym-compat.md
    §Agent metrics, §Repeat-level metrics)."""
    agent_metrics: list[dict[str, Any]] = []
    repeat_metrics: list[dict[str, Any]] = []
    one = np.zeros(1, dtype=np.int64)
    keys = _StatKeys.of(r.frame.columns, r.frame.all_int)
    for lab in sorted(set(r.label[r.label >= 0].tolist()), key=names.__getitem__):
        rows = np.flatnonzero(r.label == lab)
        size = np.array([len(rows)])
        stats = _describe_segments(r.frame.values, rows, one, size)
        exact = keys.exact_extremes(r.frame, rows, one, size).get(0)
        entry = keys.row(_stat_table(stats)[0].tolist(), exact)
        entry["agent_ref"] = {"name": names[lab]}
        if len(_unique(r.rollout[rows])[0]) > 1:
            entries = _repeat_entries(names[lab], r.rollout[rows], r.task[rows], r.frame, rows)
            repeat_metrics.extend(entries)
            entry |= _across_repeats(entries)
        agent_metrics.append(entry)
    return agent_metrics, repeat_metrics


def build_profile(state: ProfileState, allow_partial: bool = False) -> Profile:
    """The profile NeMo Gym 0.7.0 would write for the rows and results in ``state``."""
    if state.info_taken:
        raise ValueError("build_profile needs the rollout infos taken from the state merged back")
    inputs = _Inputs.of(state)
    keys = _align(state, inputs, allow_partial)
    names = state.names
    in_task, in_agent, in_server = inputs.task, inputs.agent, inputs.server
    run_key = np.where(in_server >= 0, in_server, in_agent)

    row_of_key = np.full(keys.size, -1, dtype=np.int64)
    row_of_key[keys.of_input] = np.arange(len(in_task))
    res_row = row_of_key[keys.of_result]
    has_result = np.zeros(keys.size, dtype=bool)
    has_result[keys.of_result] = True

    # masking (docs/nemo-gym-compat.md §Masking): masked results and their rows leave the
    # measured set
    res_masked = state.column(state.res_masked).astype(bool)
    masked_key = np.zeros(keys.size, dtype=bool)
    masked_key[keys.of_result[res_masked]] = True
    measured_rows = ~masked_key[keys.of_input]

    # labels and fan-out mode, from the measured rows (docs/nemo-gym-compat.md §Run labels)
    label_of = _labels(run_key[measured_rows], in_agent[measured_rows], names)
    lookup = np.full(len(names) + 1, -1, dtype=np.int64)  # index -1 (no run key) -> no label
    lookup[list(label_of)] = list(label_of.values())
    row_label = lookup[run_key]
    m_task, m_label = in_task[measured_rows], row_label[measured_rows]
    labelled = m_label >= 0
    pair_codes, decode = _encode(m_task[labelled], m_label[labelled])
    pair_tasks = decode(_unique(pair_codes)[0])[0]
    fan_out = len(pair_tasks) != len(_unique(pair_tasks)[0])  # a task with two labels

    # results in key order: a result's key is its own (_align refuses duplicates), so placing
    # each at its key is the stable argsort, without the sort
    slot = np.full(keys.size, -1, dtype=np.int64)
    slot[keys.of_result] = np.arange(len(keys.of_result))
    by_key = slot[slot >= 0]
    results = by_key[~res_masked[by_key]]
    r_row = res_row[results]
    rollouts = _Rollouts(
        result=results,
        row=r_row,
        task=in_task[r_row],
        rollout=state.column(state.res_rollout)[results],
        label=row_label[r_row],
        frame=_frame(state, results),
    )
    infos = _Infos.of(state)
    task_rows = _task_rows(names, inputs.locator, infos, rollouts, m_task, m_label, fan_out)

    def agents() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        agent_metrics, repeat_metrics = _agent_metrics(names, rollouts)
        # coverage keys, from every matched result in key order (docs/nemo-gym-compat.md §Masking)
        matched = res_row[by_key]
        coverage = _coverage(in_agent[matched], in_task[matched], res_masked[by_key])
        by_name = {e["agent_ref"]["name"]: e for e in agent_metrics}
        for ag, cov in coverage.items():
            if names[ag] in by_name:
                by_name[names[ag]].update(cov)
            else:
                agent_metrics.append({"agent_ref": {"name": names[ag]}} | cov)
        return agent_metrics, repeat_metrics

    return Profile(
        task_rows,
        int(res_masked.sum()),
        agents,
        lambda: _summary(in_task, run_key, has_result[keys.of_input]),
        lambda: _groups(state, names, rollouts),
    )


def _groups(state: ProfileState, names: list[str], r: _Rollouts) -> list[_Group]:
    """Per agent label, sorted by name as the agent entries are."""
    cols = r.frame.columns
    reward = (
        r.frame.values[:, cols.index("reward")]
        if "reward" in cols
        else np.full(len(r.task), np.nan)
    )
    answer = state.column(state.res_answer)[r.result]
    int_schema = [
        bool(ints[names_.index("reward")]) if "reward" in names_ else False
        for names_, ints in state.schemas
    ]
    reward_int = np.asarray(int_schema or [False])[state.column(state.res_schema)[r.result]]
    out = []
    for lab in sorted(set(r.label[r.label >= 0].tolist()), key=names.__getitem__):
        rows = np.flatnonzero((r.label == lab) & ~np.isnan(reward))
        repeats = len(np.unique(r.rollout[r.label == lab]))
        group = (r.task[rows], reward[rows], reward_int[rows], answer[rows])
        out.append(_Group(names[lab], *group, repeats))
    return out


def sampled_rows(inputs: ProfileState, results: Sequence[ProfileState]) -> npt.NDArray[np.bool_]:
    """Which rows of ``inputs`` a profile of these states, merged with any others, may take
    its ``sample`` from (a peer sends only those rows' samples: ~1 in 8 when it holds a
    task's results beside its rows).

    A task row's sample is the row of its group's first unmasked result in rollout order
    (:func:`_task_rows`), and a group (a task, or a task and label under fan-out) is a union
    of the rows of one task, agent and environment server. So a row is out of reach once an
    earlier row of its task, agent and server has an unmasked result in ``results``; a row
    whose results are elsewhere, or not in yet, stays in reach.
    """
    n = inputs.num_inputs
    masked = [s.column(s.res_masked).astype(bool) for s in results]
    res_task = [s.column(s.res_task)[~m] for s, m in zip(results, masked, strict=True)]
    res_rollout = [s.column(s.res_rollout)[~m] for s, m in zip(results, masked, strict=True)]
    if not n or not sum(map(len, res_task)):
        return np.ones(n, dtype=bool)
    task, rollout = inputs.column(inputs.in_task), inputs.column(inputs.in_rollout)
    codes, _ = _encode(np.concatenate([task, *res_task]), np.concatenate([rollout, *res_rollout]))
    has = np.isin(codes[:n], codes[n:])
    agent, server = inputs.column(inputs.in_agent), inputs.column(inputs.in_server)
    order = np.lexsort((rollout, server, agent, task))
    t, a, v = task[order], agent[order], server[order]
    first = np.r_[True, (t[1:] != t[:-1]) | (a[1:] != a[:-1]) | (v[1:] != v[:-1])]
    h = has[order].astype(np.int64)
    before = np.cumsum(h) - h  # results of earlier rows, counted across classes
    at_start = before[first][np.cumsum(first) - 1]  # the count where each row's class begins
    keep = np.empty(n, dtype=bool)
    keep[order] = before == at_start
    return keep


class TaskFigures(NamedTuple):
    """What is shown live of one agent's tasks in a run, over the states given (a processor's
    parts): task difficulty, the per-task mean reward as Prometheus histogram buckets
    (``mean_le[i]``: tasks whose mean is at most ``EDGES[i]``; the last, every task), and
    pass@k sums for the bounded set of k (:func:`~rewardstream.processors.core.passk.live_ks`);
    and the reward by output tokens: per :func:`token_bin`, [rollouts, sum of their rewards]
    (the results with an ``output_tokens`` column: the response's usage)."""

    difficulty: Difficulty
    mean_le: list[int]
    mean_sum: float
    passes: dict[int, tuple[float, int]]
    tokens: dict[int, tuple[int, float]]


TOKEN_BINS = 32  # bin 0: fewer than 1 token; bin b: [2**(b-1), 2**b); the last takes the rest


def token_bin(tokens: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The power-of-two bin of each output token count (see :data:`TOKEN_BINS`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bins = np.where(tokens < 1, 0, np.floor(np.log2(np.maximum(tokens, 1))) + 1)
    return np.minimum(bins, TOKEN_BINS - 1).astype(np.int64)


def _column(state: ProfileState, name: str, schema: I64) -> I64:
    """Per result, where column ``name`` sits among its values (-1: it has none)."""
    where = [names.index(name) if name in names else -1 for names, _ in state.schemas]
    return np.asarray(where, dtype=np.int64)[schema]


def live_figures(
    states: Sequence[ProfileState], ks: Callable[[int], list[int]] = live_ks
) -> dict[str, TaskFigures]:
    """Per agent (the rollout events' agent), the :class:`TaskFigures` of the unmasked results
    with a numeric reward in ``states`` (but those a state leaves out of its live figures:
    :meth:`ProfileState.leave_out`), with pass@k for ``ks(most rollouts of a task)``. Tasks
    never span states (each is one partition's), so the states' results are put side by side,
    not merged."""
    found: dict[str, list[tuple[I64, I64, F64, F64]]] = {}
    for state in states:
        if not state.num_results:
            continue
        schema = state.column(state.res_schema)
        at, tok = _column(state, "reward", schema), _column(state, "output_tokens", schema)
        agent = state.column(state.res_agent)
        keep = (state.column(state.res_masked) == 0) & (agent >= 0) & (at >= 0)
        if (counted := state.counted()) is not None:  # rollouts with no row here (yet)
            keep &= counted
        starts, _ = state.value_starts(schema)
        pool = state.column(state.pool)
        reward = pool[starts[keep] + at[keep]]
        tokens = np.where(tok[keep] >= 0, pool[starts[keep] + np.maximum(tok[keep], 0)], np.nan)
        task, rollout = state.column(state.res_task)[keep], state.column(state.res_rollout)[keep]
        ids = agent[keep]
        for ident in np.unique(ids).tolist():
            mine = ids == ident
            found.setdefault(state.names[ident], []).append(
                (task[mine], rollout[mine], reward[mine], tokens[mine])
            )
    out = {}
    for name, pieces in sorted(found.items()):
        task, rollout, reward, tokens = (np.concatenate(c) for c in zip(*pieces, strict=True))
        has = ~np.isnan(tokens)
        bins = token_bin(tokens[has])
        counts = np.bincount(bins, minlength=TOKEN_BINS)
        sums = np.bincount(bins, weights=reward[has], minlength=TOKEN_BINS)
        order = np.lexsort((rollout, task))
        task, reward = task[order], reward[order]
        means = task_means(task, reward)
        max_k = int(np.bincount(np.unique(task, return_inverse=True)[1]).max())
        out[name] = TaskFigures(
            difficulty(task, reward),
            [int(np.sum(means <= edge)) for edge in EDGES] + [len(means)],
            float(means.sum()),
            pass_at_k_sums(task, reward, ks(max_k)),
            {b: (int(counts[b]), float(sums[b])) for b in np.flatnonzero(counts).tolist()},
        )
    return out
