"""A command's configuration refused, as one line in the user's words.

pydantic names a union member's type in the error's location (``'num_repeats.int'``) and says
``Extra inputs are not permitted`` for a mistyped key; users wrote ``+num_repeats=four`` or
``+num_repeat=4``, so the line names the key they wrote, what it takes, what they gave, and the
closest known key (:func:`difflib.get_close_matches`, as argparse and Hydra suggest).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["config_error"]

_TAKES = {  # pydantic error type -> what the key takes
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text",
    "dict_type": "a mapping ({key: value})",
    "list_type": "a list ([a, b])",
}


def _path(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)


def config_error(errors: Sequence[Mapping[str, Any]], known: Iterable[str]) -> str:
    """The first problem of ``errors`` (``ValidationError.errors()``) as one line; ``known``:
    the configuration's top-level keys, for suggestions."""
    first = errors[0]
    loc = tuple(first["loc"])
    kind = first["type"]
    # A union's members fail together, at the same key plus the member's type name.
    members = [e for e in errors if len(e["loc"]) == len(loc) and tuple(e["loc"])[:-1] == loc[:-1]]
    union = len(loc) > 1 and len(members) > 1
    key = _path(loc[:-1] if union else loc)
    if not key:  # a rule across fields: its message says which
        return str(first.get("ctx", {}).get("error", first["msg"]))
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), list(known), n=1) if len(loc) == 1 else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"invalid configuration {key!r}: no such key{hint}"
    if kind == "missing":
        return f"missing required configuration: +{key}=<value>"
    got = f", got {first['input']!r}"
    if kind == "value_error":
        return f"invalid configuration {key!r}: {first['msg'].removeprefix('Value error, ')}"
    failed = members if union else [first]
    takes = [_TAKES[e["type"]] for e in failed if e["type"] in _TAKES]
    if len(takes) == len(failed):
        return f"invalid configuration {key!r}: expected {' or '.join(dict.fromkeys(takes))}{got}"
    msg = first["msg"]
    return f"invalid configuration {key!r}: {msg[:1].lower()}{msg[1:]}{got}"
