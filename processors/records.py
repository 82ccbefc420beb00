"""Turn one raw result row into what profiling keeps of it (spec §2.6 and §2.8 step 7).

Pure functions, no I/O: the batch reader, the in-process pipeline and the Kafka processor all
call :func:`extract_result` on the parsed row, so they keep exactly the same values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from rewardstream.errors import InputError

__all__ = ["ResultRecord", "extract_result"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ResultRecord(NamedTuple):
    """The profiled part of one result row.

    ``names``/``is_int``/``values`` are the numeric record in column order (bools as 0/1);
    ``info`` is the serialized ``rollout_infos`` entry; ``masked`` is a truthy ``mask_sample``.
    """

    names: tuple[str, ...]
    is_int: tuple[bool, ...]
    values: tuple[float, ...]
    exact_ints: tuple[tuple[int, int], ...]
    info: bytes
    masked: bool


def _number(value: Any) -> int | float | None:
    kind = type(value)
    if kind is bool:
        return int(value)
    if kind is int or kind is float:
        return value  # type: ignore[no-any-return]
    return None


def _usage(result: dict[str, Any], where: str) -> dict[str, Any]:
    response = result.get("response")
    if isinstance(response, dict):
        usage = response.get("usage")
        if isinstance(usage, dict):
            return usage
        if usage:
            raise InputError(f"{where}: field 'response.usage' must be an object or null")
        return {}
    if response:
        raise InputError(f"{where}: field 'response' must be an object or null")
    return {}


def extract_result(result: dict[str, Any], task: int, rollout: int, where: str) -> ResultRecord:
    """Extract the numeric record and the ``rollout_infos`` entry of one result row.

    ``where`` names the source (``file line N`` or an event id) for error messages.
    """
    masked = bool(result.get("mask_sample"))
    if "mask_sample" in result:
        result = {k: v for k, v in result.items() if k != "mask_sample"}
    usage = _usage(result, where)

    # Stats: usage values win, at the result key's position (spec §2.6).
    merged = result | usage if usage else result
    names: list[str] = []
    is_int: list[bool] = []
    values: list[float] = []
    exact: list[tuple[int, int]] = []
    for key, raw in merged.items():
        if key.startswith("_") or key == "agent_name":
            continue
        num = _number(raw)
        if num is None:
            continue
        if type(num) is int:
            if not _INT64_MIN <= num <= _INT64_MAX:
                continue  # pandas keeps such ints in an object column: never numeric
            if abs(num) > 2**53:
                exact.append((len(values), num))
            is_int.append(True)
            values.append(float(num))
        else:
            is_int.append(False)
            values.append(num)
        names.append(key)

    # rollout_infos: top-level values win, at the usage key's position (spec §2.8).
    info: dict[str, Any] = {
        "rollout_id": f"{task}:{rollout}",
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }
    if "reward" in result:
        info["reward"] = result["reward"]
    for key, raw in usage.items():
        num = _number(raw)
        if num is not None:
            info[key] = num
    for key, raw in result.items():
        if key.startswith("_") or key == "reward" or key == "response":
            continue
        num = _number(raw)
        if num is not None:
            info[key] = num
    return ResultRecord(
        tuple(names), tuple(is_int), tuple(values), tuple(exact), orjson.dumps(info), masked
    )
