"""Turn one raw result row into what profiling keeps of it (spec §2.6 and §2.8 step 7).

Pure functions, no I/O: the batch reader and every producer of rollout events (publisher,
collector, the embedded pipeline's reader) call :func:`extract_result` on the parsed row, and
the stream processor receives its record on the wire, so all keep exactly the same values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InvalidRow

__all__ = ["ResultRecord", "extract_result"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ResultRecord(NamedTuple):
    """The profiled part of one result row.

    ``names``/``is_int``/``values`` are the numeric record in column order (bools as 0/1; ints
    as float64, so ints beyond 2**53 lose precision, as NeMo Gym's means do, though its max/min
    of an all-int frame would keep them); ``info`` is the serialized ``rollout_infos`` entry;
    ``masked`` is a truthy ``mask_sample``.
    """

    names: tuple[str, ...]
    is_int: tuple[bool, ...]
    values: tuple[float, ...]
    info: bytes
    masked: bool


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


def extract_result(result: dict[str, Any], task: int, rollout: int) -> ResultRecord:
    """Extract the numeric record and the ``rollout_infos`` entry of one result row.

    This runs once per rollout on the hot path, so type checks are inlined (bools are ints in
    Python: ``type(x) is`` keeps them apart).
    """
    masked = bool(result.get("mask_sample"))
    if "mask_sample" in result:
        result = {k: v for k, v in result.items() if k != "mask_sample"}
    usage = _usage(result)

    # Stats: usage values win, at the result key's position (spec §2.6).
    merged = result | usage if usage else result
    names: list[str] = []
    is_int: list[bool] = []
    values: list[float] = []
    for key, raw in merged.items():
        kind = type(raw)
        if kind is float:
            flag = False
        elif kind is int:
            if not _INT64_MIN <= raw <= _INT64_MAX:
                continue  # pandas keeps such ints in an object column: never numeric
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

    # rollout_infos: top-level values win, at the usage key's position (spec §2.8).
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
    return ResultRecord(tuple(names), tuple(is_int), tuple(values), encoded, masked)


def agent_of(row: dict[str, Any]) -> str | None:
    """``agent_ref.name`` of a row or result when it is a string (live stats are keyed by it)."""
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None
