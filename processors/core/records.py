"""Turn one raw result row into what profiling keeps of it.

The rules: docs/nemo-gym-compat.md §Rollout records and §Profile rows (``rollout_infos``).

Pure functions, no I/O: the batch reader and every producer of rollout events (publisher,
collector, the embedded pipeline's reader) call :func:`extract_result` on the parsed row, and
the stream processor receives its record on the wire, so all keep exactly the same values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from operator import itemgetter
from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InvalidRow

__all__ = [
    "MAX_ANSWER_DEPTH",
    "NO_ANSWER",
    "ResultRecord",
    "answer_field",
    "answer_id",
    "extract_result",
    "extract_result_reference",
    "row_shape",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EXACT = 2**53
MAX_ANSWER_DEPTH = 254  # as deep as orjson writes: an answer deeper could not be compared
"""Ints up to this magnitude are exact as floats; beyond it a record keeps them in ``big``."""

NO_ANSWER = _INT64_MIN
"""The answer identity of a result whose answer is missing or null (or not asked for)."""


class ResultRecord(NamedTuple):
    """The profiled part of one result row.

    ``names``/``is_int``/``values`` are the numeric record in column order (bools as 0/1; ints
    as float64, so ints beyond 2**53 lose precision there, as NeMo Gym's means do); ``info`` is
    the serialized ``rollout_infos`` entry; ``masked`` is a truthy ``mask_sample``; ``answer``
    the identity (:func:`answer_id`) of the value under the run's answer key, which majority@k
    votes on; ``big`` the (column, exact value) of each int beyond 2**53, which NeMo Gym's
    int64 columns keep exact in max/min and quantiles.
    """

    names: tuple[str, ...]
    is_int: tuple[bool, ...]
    values: tuple[float, ...]
    info: bytes
    masked: bool
    answer: int = NO_ANSWER
    big: tuple[tuple[int, int], ...] = ()


def _plain(value: Any) -> Any:
    """``value`` with the numbers Python finds equal made one (``True == 1 == 1.0``)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def answer_field(answer_key: str | None) -> str | None:
    """The field a result's answer is read from: None (no answer) for ``mask_sample``, which
    NeMo Gym strips from a scored result before it reads answers (``select_measured``)."""
    return None if answer_key == "mask_sample" else answer_key


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def answer_id(value: Any, field: str = "answer") -> int:
    """An answer as a 64-bit identity: :data:`NO_ANSWER` for None, otherwise a hash of its
    JSON form, so answers are one exactly where Python's ``==`` makes them one for JSON values
    (``1``, ``1.0`` and ``true`` are one answer, ``"1"`` another; lists and objects, which NeMo
    Gym's ``Counter`` cannot count, compare by content). One nested deeper than
    :data:`MAX_ANSWER_DEPTH` is refused (``InvalidRow`` naming ``field``): reading it would take
    Python's recursion, and whether that fails would depend on the caller's stack."""
    if value is None:
        return NO_ANSWER
    if isinstance(value, list | dict) and _depth(value) > MAX_ANSWER_DEPTH:
        raise InvalidRow(
            f"field '{field}' nests lists or objects deeper than {MAX_ANSWER_DEPTH} levels:"
            " too deep to compare as an answer"
        )
    try:
        text = orjson.dumps(_plain(value), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an int beyond 64 bits
        text = repr(value).encode()
    ident = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)
    return ident + 1 if ident == NO_ANSWER else ident


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    response = result.get("response")
    if isinstance(response, dict):
        usage = response.get("usage")
        if isinstance(usage, dict):
            return usage
        if usage:
            raise InvalidRow("field 'response.usage' must be an object or null")
        return {}
    if response:
        raise InvalidRow("field 'response' must be an object or null")
    return {}


def extract_result(
    result: dict[str, Any], task: int, rollout: int, answer_key: str | None = None
) -> ResultRecord:
    """Extract the numeric record and the ``rollout_infos`` entry of one result row (and its
    answer's identity, given the run's ``answer_key``).

    This runs once per rollout on the hot path. Rows of a collection mostly share a *shape*
    (their keys and their values' types, and their usage's): for each shape the positions of
    its columns and ``rollout_infos`` values are worked out once, by :func:`_plan` from the
    rules of :func:`extract_result_reference`, and a row of that shape is read by position
    (~3x faster on 20-key rows, measured). A row that leaves the common case (an int beyond
    2**53 in a column, a value that will not serialize, an unusual ``response``) is read by the
    reference, which also owns every error. ``tests/test_records.py`` checks the two agree.
    """
    values = tuple(result.values())
    response = result.get("response")
    usage: Any = response.get("usage") if type(response) is dict else None
    shape, used = row_shape(result, values, usage)
    plan = _PLANS.get(shape, _UNSEEN)
    if plan is _UNSEEN:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[shape] = _plan(*shape)
    if not isinstance(plan, _Plan):
        return extract_result_reference(result, task, rollout, answer_key)
    every = values + used
    if plan.ints:
        ints = plan.int_values(every)
        if max(ints) > _EXACT or min(ints) < -_EXACT:
            return extract_result_reference(result, task, rollout, answer_key)
    found = plan.info_values(every)
    if plan.bools:
        found = tuple([int(v) if type(v) is bool else v for v in found])
    head: tuple[Any, ...] = (f"{task}:{rollout}", task, rollout)
    if plan.reward >= 0:
        head += (every[plan.reward],)
    try:
        encoded = orjson.dumps(dict(zip(plan.info_keys, head + found, strict=True)))
    except orjson.JSONEncodeError:
        return extract_result_reference(result, task, rollout, answer_key)
    return ResultRecord(
        plan.names,
        plan.is_int,
        tuple(map(float, plan.column_values(every))),
        encoded,
        plan.mask >= 0 and bool(every[plan.mask]),
        NO_ANSWER
        if (field := answer_field(answer_key)) is None
        else answer_id(result.get(field), field),
    )


def row_shape(
    row: dict[str, Any], values: tuple[Any, ...], usage: Any
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A row's shape, what its plan is kept by (keys and value types, its usage's, the usage's
    type), and its usage's values (the plan's positions count them after the row's)."""
    used = tuple(usage.values()) if type(usage) is dict else ()
    shape = (
        tuple(row),
        tuple(map(type, values)),
        tuple(usage) if used else (),
        tuple(map(type, used)),
        type(usage),
    )
    return shape, used


def _getter(positions: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``operator.itemgetter`` of the positions, always giving a tuple (C speed)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        (at,) = positions
        return lambda values: (values[at],)
    return lambda values: ()


class _Plan(NamedTuple):
    """Where one shape's record comes from, as positions in its values (the row's, then its
    usage's): the columns (and which hold ints, checked per row against 2**53), the
    ``rollout_infos`` keys (its three key fields and the reward first) and values (``bools``:
    some are bools, written as ints), the reward and the mask."""

    names: tuple[str, ...]
    is_int: tuple[bool, ...]
    column_values: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    ints: bool
    int_values: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    info_keys: tuple[str, ...]
    info_values: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    bools: bool
    reward: int
    mask: int


_PLANS: dict[tuple[Any, ...], _Plan | None] = {}
_UNSEEN = object()
_MAX_PLANS = 4096  # shapes remembered (a collection has a handful; cleared when exceeded)


def _plan(
    keys: tuple[str, ...],
    types: tuple[type, ...],
    usage_keys: tuple[str, ...],
    usage_types: tuple[type, ...],
    usage_type: type,
) -> _Plan | None:
    """The positions :func:`extract_result_reference` reads for rows of this shape, or None
    when its ``response`` or usage takes the reference's own path (not an object, or absent)."""
    at = {k: i for i, k in enumerate(keys)}
    response = types[at["response"]] if "response" in at else type(None)
    if response not in (dict, type(None)) or usage_type not in (dict, type(None)):
        return None
    kinds = types + usage_types
    usage_at = {k: len(keys) + i for i, k in enumerate(usage_keys)}
    row = [(k, at[k]) for k in keys if k != "mask_sample"]
    merged = [(k, usage_at.get(k, i)) for k, i in row]
    merged += [(k, i) for k, i in usage_at.items() if k not in at or k == "mask_sample"]
    names, is_int, columns, ints = [], [], [], []
    for key, i in merged:
        kind = kinds[i]
        if kind not in (float, int, bool) or key[:1] == "_" or key == "agent_name":
            continue
        names.append(key)
        is_int.append(kind is not float)
        columns.append(i)
        if kind is int:
            ints.append(i)
    info_keys, info_at = [], []
    for source, skip_private in ((list(usage_at.items()), False), (row, True)):
        for key, i in source:
            if kinds[i] not in (float, int, bool):
                continue
            if skip_private and (key[:1] == "_" or key == "reward" or key == "response"):
                continue
            info_keys.append(key)
            info_at.append(i)
    reward = at.get("reward", -1)
    head = (
        "rollout_id",
        "_ng_task_index",
        "_ng_rollout_index",
        *(("reward",) if reward >= 0 else ()),
    )
    return _Plan(
        tuple(names),
        tuple(is_int),
        _getter(columns),
        bool(ints),
        _getter(ints),
        (*head, *info_keys),
        _getter(info_at),
        any(kinds[i] is bool for i in info_at),
        reward,
        at.get("mask_sample", -1),
    )


def extract_result_reference(
    result: dict[str, Any], task: int, rollout: int, answer_key: str | None = None
) -> ResultRecord:
    """:func:`extract_result` by its rules, one value at a time (bools are ints in Python:
    ``type(x) is`` keeps them apart)."""
    masked = bool(result.get("mask_sample"))
    if "mask_sample" in result:
        result = {k: v for k, v in result.items() if k != "mask_sample"}
    usage = _usage(result)

    # Stats: usage values win, at the result key's position (docs/nemo-gym-compat.md §Rollout
    # records).
    merged = result | usage if usage else result
    names: list[str] = []
    is_int: list[bool] = []
    values: list[float] = []
    wide = False  # an int beyond 2**53 was seen (rare: the common path makes one comparison)
    for key, raw in merged.items():
        kind = type(raw)
        if kind is float:
            flag = False
        elif kind is int:
            if not -_EXACT <= raw <= _EXACT:
                if not _INT64_MIN <= raw <= _INT64_MAX:
                    continue  # pandas keeps such ints in an object column: never numeric
                wide = True
            flag = True
        elif kind is bool:
            flag = True
        else:
            continue
        if key[:1] == "_" or key == "agent_name":
            continue
        names.append(key)
        is_int.append(flag)
        values.append(float(raw))

    # rollout_infos: top-level values win, at the usage key's position
    # (docs/nemo-gym-compat.md §Profile rows).
    info: dict[str, Any] = {
        "rollout_id": f"{task}:{rollout}",
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }
    if "reward" in result:
        info["reward"] = result["reward"]
    for source, skip_private in ((usage, False), (result, True)):
        for key, raw in source.items():
            kind = type(raw)
            if kind is bool:
                raw = int(raw)
            elif kind is not int and kind is not float:
                continue
            if skip_private and (key[:1] == "_" or key == "reward" or key == "response"):
                continue
            info[key] = raw
    try:
        encoded = orjson.dumps(info)
    except orjson.JSONEncodeError as exc:  # e.g. a reward nested deeper than orjson writes
        raise InvalidRow(f"field 'reward' cannot be written back as JSON: {exc}") from None
    answer = NO_ANSWER if answer_key is None else answer_id(result.get(answer_key), answer_key)
    big: tuple[tuple[int, int], ...] = ()
    if wide:
        exact = [merged[name] for name in names]
        big = tuple(
            (i, v) for i, v in enumerate(exact) if type(v) is int and not -_EXACT <= v <= _EXACT
        )
    return ResultRecord(tuple(names), tuple(is_int), tuple(values), encoded, masked, answer, big)


def agent_of(row: dict[str, Any]) -> str | None:
    """``agent_ref.name`` of a row or result when it is a string (live stats are keyed by it)."""
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None
