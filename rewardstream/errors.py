"""Error types shared by every stage.

Every error a user can cause is a :class:`RewardstreamError`; the CLIs turn it into one line on
stderr and exit code 2, so no traceback ever reaches a user for bad input.
"""

from __future__ import annotations

__all__ = ["InputError", "ProfileError", "RewardstreamError"]


class RewardstreamError(Exception):
    """Base class of errors caused by input or configuration, not by a bug."""


class InputError(RewardstreamError):
    """A file or one of its lines cannot be used; the message names the file and line."""


class ProfileError(RewardstreamError, ValueError):
    """Rows and results do not line up (duplicates, extras, missing results).

    ``str(error)`` is exactly NeMo Gym 0.7.0's message, so scripts that matched on it keep
    working; ``kind`` is the exception type NeMo Gym raises (``ValueError`` or ``KeyError``).
    """

    def __init__(self, message: str, kind: str = "ValueError") -> None:
        super().__init__(message)
        self.kind = kind
