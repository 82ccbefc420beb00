"""NeMo Gym / Hydra command-line overrides: ``+key=value``, ``++key=value`` and ``key=value``.

Values are parsed the way Hydra's grammar reads the common cases: ``true``/``false``/``null``
(any case), integers, floats, quoted strings, ``[a, b]`` lists, ``{k: v}`` dicts; anything else
is a string, but an unquoted top-level comma (``a,b``: a sweep to Hydra, which NeMo Gym's
commands refuse) is refused too. Dotted keys (``responses_create_params.temperature=0.5``)
become nested dicts. ``tests/test_nemo_interop.py`` checks values against Hydra's own parser:
this module exists because importing that parser costs each command ~150 ms (measured).
"""

from __future__ import annotations

import re
from typing import Any

from rewardstream.errors import InputError

__all__ = ["parse_overrides", "parse_value"]

_KEY = re.compile(r"^\+{0,2}([A-Za-z_][\w.-]*)=(.*)$", re.DOTALL)
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def _split_list(body: str) -> list[str]:
    parts, depth, quote, cur = [], 0, "", ""
    for ch in body:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_value(text: str) -> Any:
    """One override value, typed like Hydra's grammar types it."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if s == "~":
        raise ValueError("'~' is no value (null is written null, as in Hydra)")
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if s.startswith("[") and s.endswith("]"):
        return [parse_value(p) for p in _split_list(s[1:-1])]
    if s.startswith("{") and s.endswith("}"):
        pairs = [p.partition(":") for p in _split_list(s[1:-1])]
        if all(colon and key.strip() for key, colon, _ in pairs):
            return {key.strip(): parse_value(value) for key, _, value in pairs}
    if len(_split_list(s)) > 1:
        raise ValueError(
            "a comma outside brackets and quotes is ambiguous (as in Hydra): write [a,b] for "
            "a list, or quote the value, 'a,b', for a string"
        )
    return s


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """Merge override tokens into one nested dict; later tokens win."""
    config: dict[str, Any] = {}
    for token in tokens:
        match = _KEY.match(token)
        if match is None:
            raise InputError(f"not an override (expected +key=value): {token!r}")
        key, value = match.groups()
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"override {token!r} nests under non-mapping key {part!r}")
            node = child
        try:
            node[leaf] = parse_value(value)
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise InputError(f"invalid value for override {key!r}: {exc}") from None
        except RecursionError:
            raise InputError(f"invalid value for override {key!r}: nested too deeply") from None
    return config
