"""The errors of a local broker, and the two helpers that word them: every failure says what to
do, in one message a command prints as one line."""

from __future__ import annotations

import shutil

__all__ = ["BrokerUnavailable", "EarlyExit", "KafkaLocalError", "require", "tail"]


class KafkaLocalError(RuntimeError):
    """A broker could not be fetched, started or stopped; the message says what to do."""


class BrokerUnavailable(KafkaLocalError):
    """No way to get a broker on this machine (no env broker, no java/jars, no Docker)."""


class EarlyExit(KafkaLocalError):
    """The broker JVM exited before it was ready."""


def require(tool: str, hint: str) -> str:
    """The path of ``tool`` on PATH; its absence is a :class:`KafkaLocalError` with ``hint``."""
    path = shutil.which(tool)
    if path is None:
        raise KafkaLocalError(f"'{tool}' not found on PATH; {hint}")
    return path


def tail(text: str, lines: int = 40) -> str:
    """The last ``lines`` of a tool's output, for the message of its failure."""
    return "\n".join(text.rstrip().splitlines()[-lines:])
