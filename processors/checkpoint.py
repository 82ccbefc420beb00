"""Checkpoints of the stream processor: its runs and the offsets they cover, saved atomically.

A restarted processor loads the newest checkpoint and resumes at its offsets instead of
replaying the topics from the start; events after the checkpoint are consumed again and the
runs' key sets drop whatever had already been applied, so nothing counts twice. The sample
spill files are cut back to the length the checkpoint recorded.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import NamedTuple

from processors.runs import RunTracker

__all__ = ["Checkpoint", "load", "save"]

_NAME = "checkpoint.pickle"


class Checkpoint(NamedTuple):
    """The runs and the next offset to consume per ``topic:partition`` when it was taken."""

    runs: dict[str, RunTracker]
    positions: dict[str, int]


def save(folder: Path, checkpoint: Checkpoint) -> None:
    """Write atomically (temp file, fsync, rename): a kill leaves the previous one intact."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(checkpoint, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / _NAME)
    except BaseException:
        os.unlink(tmp)
        raise


def load(folder: Path) -> Checkpoint | None:
    """The saved checkpoint, or None when there is none yet."""
    try:
        with open(folder / _NAME, "rb") as fh:
            checkpoint = pickle.load(fh)
    except FileNotFoundError:
        return None
    assert isinstance(checkpoint, Checkpoint)
    return checkpoint
