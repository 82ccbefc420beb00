"""Checkpoints of the stream processor: one per unit (topic-partition), in a shared folder.

A unit's checkpoint is its parts of every run and the offset they cover, so whichever processor
of the consumer group is assigned the partition next (after a rebalance, a restart, or a
``kill -9``) resumes it there instead of replaying the topic, and deduplication drops whatever
the replay after the checkpoint delivers again. Beside each pickle, a small JSON *manifest*
says the unit's position and how many inputs and rollouts of each run it holds: processors
read their peers' manifests to know when a run is complete without loading their state.

Files are written atomically (temp file, fsync, rename): a kill leaves the previous one intact.
The pickle is renamed before the manifest, so a manifest never promises more than its pickle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, NamedTuple

import orjson

from processors.runs import Counts, Unit

__all__ = ["CheckpointStore", "Manifest"]

log = logging.getLogger(__name__)


class Manifest(NamedTuple):
    """What a unit's checkpoint covers: the next offset to consume and per-run counts."""

    position: int
    runs: dict[str, Counts]


def _atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class CheckpointStore:
    """The checkpoint folder that the processors of one group share."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def save(self, unit: Unit) -> bool:
        """Checkpoint ``unit``; False, writing nothing, when its checkpoint is already past
        ``unit.position``. Positions only move forward for the unit's owner, so then another
        processor has taken it over and moved on while this one was stopped past its session
        timeout (a long pause, a frozen VM) and has not heard yet: writing would roll the new
        owner's checkpoint back (bench/chaos.py ``pause-member``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        saved = self.manifests([unit.name]).get(unit.name)
        if saved is not None and saved.position > unit.position:
            log.warning(
                "not checkpointing %s at offset %d: its checkpoint is at %d (another processor "
                "owns it now)",
                unit.name,
                unit.position,
                saved.position,
            )
            unit.dirty = False
            return False
        _atomic_write(
            self.folder / f"{unit.name}.pickle",
            lambda fh: pickle.dump(unit, fh, protocol=pickle.HIGHEST_PROTOCOL),
        )
        manifest = {
            "position": unit.position,
            "runs": {r: [p.inputs, p.rollouts] for r, p in unit.parts.items()},
        }
        data = orjson.dumps(manifest)
        _atomic_write(self.folder / f"{unit.name}.json", lambda fh: fh.write(data))
        unit.dirty = False
        return True

    def load(self, name: str) -> Unit | None:
        """The unit as last checkpointed (its spills read-only), or None when there is none."""
        try:
            with open(self.folder / f"{name}.pickle", "rb") as fh:
                unit = pickle.load(fh)
        except FileNotFoundError:
            return None
        assert isinstance(unit, Unit)
        return unit

    def manifests(self, names: Iterable[str]) -> dict[str, Manifest]:
        """The manifests of the named units that have one."""
        out = {}
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                raw = orjson.loads((self.folder / f"{name}.json").read_bytes())
                runs = {r: Counts(*c) for r, c in raw["runs"].items()}
                out[name] = Manifest(raw["position"], runs)
        return out
