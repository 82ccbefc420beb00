"""Transport-independent event handling: decode, route to the run's part, finish the run.

The Kafka processor (:mod:`processors.stream`) and the in-process transport both hand raw event
bytes to :meth:`Pipeline.handle`, naming the unit (topic-partition) they came from; everything
after the bytes is shared, so the embedded default and the Kafka deployment write identical
files. With several processors in one consumer group, each pipeline owns some units; the
others' are read from their checkpoints (:class:`processors.checkpoint.CheckpointStore`), so
snapshots and the final profile merge the parts of every unit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, NamedTuple

import orjson
from pydantic import ValidationError

from processors.checkpoint import CheckpointStore, Manifest
from processors.profile import build_profile
from processors.runs import Part, Run, Unit, merge_parts
from rewardstream.contract import (
    RunFinished,
    RunStarted,
    decode_control,
    decode_input,
    decode_rollout,
)
from rewardstream.errors import RewardstreamError
from sinks.files import ProfilePaths, render_files, write_profile
from sinks.metrics import Metrics

__all__ = ["SNAPSHOT_MEDIA_TYPE", "EventKind", "Pipeline", "Rejected", "Snapshot"]

log = logging.getLogger(__name__)

EventKind = Literal["input", "rollout", "control"]


class Rejected(NamedTuple):
    """An event that could not be used: its kind, why, and its original bytes."""

    kind: EventKind
    reason: str
    raw: bytes


SNAPSHOT_MEDIA_TYPE = "application/vnd.rewardstream.snapshot"


class Snapshot(NamedTuple):
    """A partial profile: what ``ng_reward_profile ++allow_partial_rollouts=True`` would write
    for exactly the ``rollouts`` results (and ``inputs`` rows) it covers, and the next offset
    per unit that they cover (``offsets``)."""

    run_id: str
    rollouts: int
    inputs: int
    offsets: dict[str, int]
    files: dict[str, bytes]

    def to_bytes(self) -> bytes:
        """The wire form: one JSON line of metadata (files as [name, size]), then the files'
        bytes back to back. The files are large (~3 KB per task): framing them raw avoids
        escaping and parsing hundreds of MB of JSON strings."""
        head = self._asdict() | {"files": [[n, len(d)] for n, d in self.files.items()]}
        return b"".join(
            [orjson.dumps(head, option=orjson.OPT_APPEND_NEWLINE), *self.files.values()]
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        end = data.index(b"\n")
        head = orjson.loads(data[:end])
        files, at = {}, end + 1
        for name, size in head.pop("files"):
            files[name], at = data[at : at + size], at + size
        if at != len(data):
            raise ValueError(f"snapshot body has {len(data) - at} bytes past its files")
        return cls(**head, files=files)


class Pipeline:
    """All runs seen on the topics; the leader writes each run's final profile.

    ``peers``: the shared checkpoint folder of a consumer group, where the units this pipeline
    does not own are found; None when it owns every unit (in process, or a lone processor that
    is told so by :meth:`set_peer_units`).
    """

    def __init__(
        self,
        output_dir: Path,
        on_reject: Callable[[Rejected], None] | None = None,
        metrics: Metrics | None = None,
        peers: CheckpointStore | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.runs: dict[str, Run] = {}
        self.units: dict[str, Unit] = {}  # the units this pipeline owns
        self.peers = peers
        self.peer_units: dict[str, Manifest] = {}  # units owned elsewhere, as last seen
        self.leader = True  # writes final profiles (the owner of rollout-0 in a group)
        self.metrics = metrics
        self.on_reject = on_reject or (
            lambda r: log.warning("rejected %s event: %s", r.kind, r.reason)
        )

    def close(self) -> None:
        for unit in self.units.values():
            unit.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- units --------------------------------------------------------------------------------
    def run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = Run(run_id)
            run.done = self._final_mark(run_id).exists()
        return run

    def _final_mark(self, run_id: str) -> Path:
        """Present once the run's final profile is written (by whichever processor)."""
        return self.output_dir / run_id / ".state" / "final"

    def unit(self, name: str) -> Unit:
        """The owned unit ``name``, created empty if new."""
        unit = self.units.get(name)
        if unit is None:
            unit = self.adopt(Unit(name, self.output_dir))
        return unit

    def adopt(self, unit: Unit) -> Unit:
        """Own ``unit`` (new, or loaded from its checkpoint after an assignment)."""
        unit.claim()
        self.units[unit.name] = unit
        self.peer_units.pop(unit.name, None)
        for run_id, part in unit.parts.items():
            run = self.run(run_id)
            run.parts[unit.name] = part
            run.foreign.pop(unit.name, None)
        return unit

    def release(self, name: str) -> None:
        """Stop owning a unit (revoked): its parts leave their runs."""
        unit = self.units.pop(name, None)
        if unit is not None:
            for run_id in unit.parts:
                self.runs[run_id].parts.pop(name, None)
            unit.close()

    def set_peer_units(self, names: set[str]) -> None:
        """The units other processors own (all the topics' partitions but this one's)."""
        self.peer_units = {n: self.peer_units.get(n, Manifest(0, {})) for n in names}
        self.refresh_peers()

    def refresh_peers(self) -> None:
        """Re-read the peers' manifests (cheap JSON) and the final-profile marks."""
        if self.peers is None or not self.peer_units:
            return
        self.peer_units.update(self.peers.manifests(self.peer_units))
        for run in self.runs.values():
            run.foreign = {
                name: m.runs[run.run_id]
                for name, m in self.peer_units.items()
                if run.run_id in m.runs
            }
            if not run.done:
                run.done = self._final_mark(run.run_id).exists()

    def positions(self) -> dict[str, int]:
        """The next offset to consume per unit, owned or (as checkpointed) a peer's."""
        return {n: m.position for n, m in self.peer_units.items()} | {
            n: u.position for n, u in self.units.items()
        }

    # -- events -------------------------------------------------------------------------------
    def handle(self, kind: EventKind, raw: bytes, unit: str | None = None) -> Run | None:
        """Apply one event from ``unit`` (default ``<kind>-0``); returns its run (None when
        rejected). Control events belong to no unit: every processor reads all of them."""
        try:
            if kind == "input":
                ev_in = decode_input(raw)
                part = self._part(unit or "input-0", ev_in.run_id)
                if not part.add_input(ev_in) and self.metrics:
                    self.metrics.duplicates.labels(kind).inc()
                run_id = ev_in.run_id
            elif kind == "rollout":
                ev_out = decode_rollout(raw)
                part = self._part(unit or "rollout-0", ev_out.run_id)
                if part.add_rollout(ev_out):
                    if self.metrics:
                        self.metrics.rollout(ev_out.agent, ev_out.published_at)
                elif self.metrics:
                    self.metrics.duplicates.labels(kind).inc()
                run_id = ev_out.run_id
            else:
                control = decode_control(raw)
                run_id = control.run_id
                if isinstance(control, RunStarted):
                    self.run(run_id).started = control
                elif isinstance(control, RunFinished):
                    self.run(run_id).finished = True
        except (ValidationError, RewardstreamError, ValueError) as exc:
            if self.metrics:
                self.metrics.rejected.labels(kind).inc()
            self.on_reject(Rejected(kind, " ".join(str(exc).split())[:500], raw))
            return None
        return self.run(run_id)

    def _part(self, unit_name: str, run_id: str) -> Part:
        unit = self.unit(unit_name)  # the transport marks it dirty for checkpoints
        part = unit.parts.get(run_id)
        if part is None:
            part = self.run(run_id).parts[unit_name] = unit.part(run_id)
        return part

    # -- profiles -----------------------------------------------------------------------------
    def _all_parts(self, run: Run, own: list[Part]) -> Iterator[Part]:
        """The run's parts: ``own`` (this pipeline's) then the peers', from their checkpoints."""
        yield from own
        if self.peers is not None:
            for name in run.foreign:
                unit = self.peers.load(name)
                if unit is not None and run.run_id in unit.parts:
                    yield unit.parts[run.run_id]

    def snapshot_job(self, run_id: str) -> Callable[[], Snapshot]:
        """Copy the run's own parts now (cheap) and return the expensive build, to run elsewhere.

        The copy makes the snapshot consistent while ingestion continues on the live state;
        peers' parts are read from their checkpoints in the build. Raises KeyError for an
        unknown run.
        """
        run = self.runs[run_id]
        own = [p.copy() for p in run.parts.values()]
        offsets, paths = self.positions(), self.paths(run)

        def build() -> Snapshot:
            merged = merge_parts(self._all_parts(run, own))
            profile = build_profile(merged.state, allow_partial=True)
            chunks = render_files(profile, merged.sample)
            files = {p.name: b"".join(c) for p, c in zip(paths, chunks, strict=True)}
            state = merged.state
            return Snapshot(run_id, state.num_results, state.num_inputs, offsets, files)

        return build

    def paths(self, run: Run) -> ProfilePaths:
        stem = run.started.output_stem if run.started else "rollouts"
        return ProfilePaths.next_to(self.output_dir / run.run_id / f"{stem}.jsonl")

    def ready(self, run: Run) -> bool:
        """Complete, or finished and every unit consumed to where the log ended then."""
        if run.complete:
            return True
        if not run.finished:
            return False
        positions = self.positions()
        return all(positions.get(u, 0) >= end for u, end in run.finish_at.items())

    def maybe_finish(self, run: Run) -> ProfilePaths | None:
        """Write the final profile once the run is complete or finished (leader only)."""
        if run.done or not self.leader or not self.ready(run):
            return None
        partial = not run.complete
        if partial:
            log.warning(
                "run %s finished incomplete (%d of %s rollouts): writing a partial profile",
                run.run_id,
                run.rollouts,
                run.expected if run.expected is not None else "?",
            )
        paths = self.paths(run)
        paths.reward_profiling.parent.mkdir(parents=True, exist_ok=True)
        run.done = True
        merged = merge_parts(self._all_parts(run, list(run.parts.values())))
        try:
            write_profile(build_profile(merged.state, partial), paths, merged.sample)
        except RewardstreamError as exc:  # e.g. rollouts without input rows: say so, keep serving
            run.error = str(exc)
            log.error("run %s: no final profile: %s", run.run_id, exc)
            return None
        mark = self._final_mark(run.run_id)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(paths.reward_profiling.name)
        log.info("run %s: final profile written to %s", run.run_id, paths.reward_profiling)
        return paths
