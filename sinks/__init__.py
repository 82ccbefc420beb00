"""Where profiles go: NeMo Gym's files (``files``), Prometheus metrics (``metrics``).

Names load on first use (see :mod:`processors`): the snapshot client needs ``sinks.files`` only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinks.files import InputsFile, ProfilePaths, summary_lines, write_profile

__all__ = ["InputsFile", "ProfilePaths", "summary_lines", "write_profile"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'sinks' has no attribute {name!r}")
    return getattr(importlib.import_module("sinks.files"), name)
