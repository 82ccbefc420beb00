"""Error types shared by every stage.

Every error a user can cause is a :class:`RewardstreamError`; the CLIs turn it into one line on
stderr and exit code 2, so no traceback ever reaches a user for bad input.
"""

from __future__ import annotations

__all__ = [
    "InputError",
    "InvalidRow",
    "KafkaUnreachable",
    "LineError",
    "MissingKey",
    "ProfileError",
    "RewardstreamError",
    "UsageError",
]


class RewardstreamError(Exception):
    """Base class of errors caused by input or configuration, not by a bug."""


class UsageError(RewardstreamError):
    """A command line refused as a whole (a required setting missing, one of the wrong type):
    ``gym`` prints the command's usage before the line, as NeMo Gym's argparse does."""


class InputError(RewardstreamError):
    """A file or one of its lines cannot be used; the message names the file and line."""


class KafkaUnreachable(InputError):
    """A Kafka client could not start (the message says why and which setting to check): a
    command stops with that line; a processor that ran already waits for the broker instead."""


class InvalidRow(InputError):
    """A parsed row is unusable; raised by the pure core, which does not know where it came from."""


class MissingKey(InvalidRow):
    """A row or result without ``_ng_task_index`` or ``_ng_rollout_index`` (the stream
    processor files such events under their own dead-letter reason)."""


class LineError(InputError):
    """An unusable line, located: the reader wraps :class:`InvalidRow` and JSON errors in this."""

    def __init__(self, path: str, lineno: int, reason: str, malformed: bool = False) -> None:
        self.path, self.lineno, self.reason, self.malformed = path, lineno, reason, malformed
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.malformed:  # NeMo Gym's wording (docs/nemo-gym-compat.md §Reading JSONL)
            return f"Malformed JSON in '{self.path}' at line {self.lineno}: {self.reason}"
        return f"{self.path} line {self.lineno}: {self.reason}"

    def __reduce__(self) -> tuple[type[LineError], tuple[str, int, str, bool]]:
        return (LineError, (self.path, self.lineno, self.reason, self.malformed))  # for workers

    def shifted(self, lines: int) -> LineError:
        """The same error, renumbered for a reader that started ``lines`` lines into the file."""
        return LineError(self.path, self.lineno + lines, self.reason, self.malformed)


class ProfileError(RewardstreamError, ValueError):
    """Rows and results do not line up (duplicates, extras, missing results).

    ``str(error)`` is exactly NeMo Gym 0.7.0's message, so scripts that matched on it keep
    working; ``kind`` is the exception type NeMo Gym raises (``ValueError`` or ``KeyError``).
    """

    def __init__(self, message: str, kind: str = "ValueError") -> None:
        super().__init__(message)
        self.kind = kind
