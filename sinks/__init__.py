"""Where profiles go: NeMo Gym's files (``files``), Prometheus metrics (``metrics``).

Names load on first use (see :mod:`rewardstream.processors`): the snapshot client needs
``files`` only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewardstream.sinks.files import InputsFile, ProfilePaths, summary_lines, write_profile

__all__ = ["InputsFile", "ProfilePaths", "summary_lines", "write_profile"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.files"), name)
