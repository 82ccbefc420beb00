"""Transport-independent event handling: decode, route to the run's part, finish the run.

The Kafka processor (:mod:`processors.stream`) and the in-process transport both hand raw event
bytes to :meth:`Pipeline.handle`, naming the unit (topic-partition) they came from; everything
after the bytes is shared, so the embedded default and the Kafka deployment write identical
files. With several processors in one consumer group, each pipeline owns some units; the
others' are read from their checkpoints (:class:`processors.checkpoint.CheckpointStore`), so
snapshots and the final profile merge the parts of every unit.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson
from pydantic import ValidationError

from processors.checkpoint import CheckpointStore, Manifest
from processors.profile import build_profile
from processors.runs import (
    Counts,
    Merged,
    Part,
    PartCounts,
    Run,
    Unit,
    merge_parts,
    tasks_by_part,
)
from processors.state import row_key, row_names
from rewardstream.contract import (
    RejectReason,
    Rollout,
    RunFinished,
    RunStarted,
    decode_control,
    decode_input,
    decode_rollout,
    decode_rollouts,
    reject_reason,
)
from rewardstream.errors import RewardstreamError
from sinks.files import ProfilePaths, write_profile
from sinks.metrics import Metrics

__all__ = ["EventKind", "Pipeline", "Rejected", "SnapshotSource"]

log = logging.getLogger(__name__)

# glibc keeps freed heap pages resident (a final profile's build frees hundreds of MB, in
# pieces): malloc_trim hands them back once a run is evicted. None where libc has no such call.
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)

EventKind = Literal["input", "rollout", "control"]


class Rejected(NamedTuple):
    """An event that could not be used: its kind, why (a fixed category, see
    :data:`rewardstream.contract.REJECT_REASONS`), its original bytes, and the error text."""

    kind: EventKind
    reason: RejectReason
    raw: bytes
    detail: str = ""


class SnapshotSource(NamedTuple):
    """What a snapshot is built from: the merged parts, the next offset per unit they cover,
    the run's profile file names, and a folder for scratch files."""

    merged: Merged
    offsets: dict[str, int]
    paths: ProfilePaths
    spool_dir: Path


class Pipeline:
    """All runs seen on the topics; the leader writes each run's final profile.

    ``peers``: the shared checkpoint folder of a consumer group, where the units this pipeline
    does not own are found; None when it owns every unit (in process, or a lone processor that
    is told so by :meth:`set_peer_units`). ``max_event_bytes``: larger events are rejected
    unparsed (reason "oversized"); None: no limit.
    """

    def __init__(
        self,
        output_dir: Path,
        on_reject: Callable[[Rejected], None] | None = None,
        metrics: Metrics | None = None,
        peers: CheckpointStore | None = None,
        max_event_bytes: int | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.max_event_bytes = max_event_bytes
        self.runs: dict[str, Run] = {}
        self.units: dict[str, Unit] = {}  # the units this pipeline owns
        self.peers = peers
        self.peer_units: dict[str, Manifest] = {}  # units owned elsewhere, as last seen
        self.leader = True  # writes final profiles (the owner of rollout-0 in a group)
        self.metrics = metrics
        self.on_reject = on_reject or (
            lambda r: log.warning("rejected %s event (%s): %s", r.kind, r.reason, r.detail)
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
            self._read_mark(run)
            run.foreign = self._foreign(run_id)  # peers' manifests may already list it
        return run

    def _foreign(self, run_id: str) -> dict[str, Counts]:
        """The run's counts in the units other processors own, as last checkpointed.

        Kept per run and renewed on every refresh: a run first seen after the last refresh
        must still know its peers' parts, or it could finish (its peers' positions say their
        data is consumed) without merging them."""
        return {n: m.runs[run_id] for n, m in self.peer_units.items() if run_id in m.runs}

    def _final_mark(self, run_id: str) -> Path:
        """Present once the run's final profile is written (by whichever processor): its file
        name and the counts it was written with (JSON)."""
        return self.output_dir / run_id / ".state" / "final"

    def _mark(self, run_id: str) -> dict[str, Any] | None:
        try:
            mark: dict[str, Any] = orjson.loads(self._final_mark(run_id).read_bytes())
        except FileNotFoundError:
            return None
        return mark

    def _read_mark(self, run: Run) -> None:
        """A final mark makes the run done, with the counts its profile was written with, in
        all and per unit: a processor that restarts from a checkpoint older than the final
        profile re-reads events the profile holds, and must count them neither as missing nor
        as duplicates (:meth:`Part.retire`)."""
        mark = self._mark(run.run_id)
        if mark is not None:
            run.done, run.written = True, Counts(mark["inputs"], mark["rollouts"])
            units = mark.get("units", {})  # absent from the marks of versions before it
            run.written_units = {name: PartCounts(*counts) for name, counts in units.items()}

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
            run.done = run.done or part.final is not None  # the checkpoint knows it too
        for run_id in unit.parts:
            self.evict(self.runs[run_id])  # e.g. checkpointed before its final profile
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
            run.foreign = self._foreign(run.run_id)
            if not run.done:
                self._read_mark(run)
                self.evict(run)

    def positions(self) -> dict[str, int]:
        """The next offset to consume per unit, owned or (as checkpointed) a peer's."""
        return {n: m.position for n, m in self.peer_units.items()} | {
            n: u.position for n, u in self.units.items()
        }

    # -- events -------------------------------------------------------------------------------
    def handle(self, kind: EventKind, raw: bytes, unit: str | None = None) -> Run | None:
        """Apply one event from ``unit`` (default ``<kind>-0``); returns its run (None when
        rejected). Control events belong to no unit: every processor reads all of them.

        Data of a run not announced yet is kept: the publisher sends ``run_started`` after the
        inputs, and topics are not ordered with each other. A ``run_finished`` whose run never
        started is rejected: both are keyed by run id, so ``run_started`` would have come first.
        """
        limit = self.max_event_bytes
        if limit is not None and len(raw) > limit:
            detail = f"{len(raw)} bytes, above the {limit}-byte limit (--max-event-bytes)"
            self._reject(kind, "oversized", raw, detail)
            return None
        try:
            if kind == "input":
                ev_in = decode_input(raw)
                row_key(ev_in.row)  # a bad row must not create its run or part
                row_names(ev_in.row)
                part = self._part(unit or "input-0", ev_in.run_id)
                before = part.duplicates
                if not part.add_input(ev_in) and self.metrics and part.duplicates > before:
                    self.metrics.duplicates.labels(kind).inc()
                run_id = ev_in.run_id
            elif kind == "rollout":
                ev_out = decode_rollout(raw)
                self._fold(unit or "rollout-0", [ev_out])
                run_id = ev_out.run_id
            else:
                control = decode_control(raw)
                run_id = control.run_id
                if isinstance(control, RunStarted):
                    self.run(run_id).started = control
                elif isinstance(control, RunFinished):
                    if not self._announced(run_id):
                        detail = f"run_finished for run {run_id!r}, which never started"
                        self._reject(kind, "unknown-run", raw, detail)
                        return None
                    self.run(run_id).finished = True
        except (ValidationError, RewardstreamError, ValueError) as exc:
            self._reject(kind, reject_reason(exc), raw, " ".join(str(exc).split())[:500])
            return None
        return self.run(run_id)

    def handle_rollouts(self, raws: Sequence[bytes], unit: str) -> list[Run] | None:
        """Apply a batch of rollout events from ``unit``, in order: the Kafka processor's hot
        path (about half the cost per event of :meth:`handle`). Returns the runs touched, or
        None, having applied nothing, when any event needs :meth:`handle`'s one-by-one path
        (one that is rejected, or whose ``info`` is not written as orjson writes it)."""
        limit = self.max_event_bytes
        if limit is not None and max(map(len, raws), default=0) > limit:
            return None
        events = decode_rollouts(raws)
        return None if events is None else self._fold(unit, events)

    def _fold(self, unit: str, events: list[Rollout]) -> list[Run]:
        """Add decoded rollouts to their runs' parts (dropping those seen before)."""
        by_run: dict[str, list[Rollout]] = {}
        for event in events:  # a batch is one run's, but topics are shared
            by_run.setdefault(event.run_id, []).append(event)
        for run_id, mine in by_run.items():
            part = self._part(unit, run_id)
            before = part.duplicates
            new = part.add_rollouts(mine)
            if self.metrics:
                self.metrics.rollouts(new)
                if part.duplicates > before:  # replays (Part.retire) are not duplicates
                    self.metrics.duplicates.labels("rollout").inc(part.duplicates - before)
        return [self.run(run_id) for run_id in by_run]

    def _announced(self, run_id: str) -> bool:
        """A run_started was seen, or the run's final profile exists (its run_started may have
        aged out of the control topic)."""
        run = self.runs.get(run_id)
        return (run is not None and (run.started is not None or run.done)) or (
            self._final_mark(run_id).exists()
        )

    def _reject(self, kind: EventKind, reason: RejectReason, raw: bytes, detail: str) -> None:
        if self.metrics:
            self.metrics.rejected.labels(kind, reason).inc()
        self.on_reject(Rejected(kind, reason, raw, detail))

    def _part(self, unit_name: str, run_id: str) -> Part:
        unit = self.unit(unit_name)  # the transport marks it dirty for checkpoints
        part = unit.parts.get(run_id)
        if part is None:
            run = self.run(run_id)
            part = run.parts[unit_name] = unit.part(run_id)
            self.evict(run)  # a done run's new part only counts its events as duplicates
        return part

    def evict(self, run: Run) -> None:
        """Retire the run's parts once its final profile is written (see
        :mod:`processors.runs`): memory and spill files go, the counts stay. Their units are
        marked for a checkpoint, so a restart does not load the dropped state again."""
        if run.done and run.error is None:
            retired = run.retire()
            for name in retired:
                self.units[name].dirty = True
            if retired and _malloc_trim is not None:
                _malloc_trim(0)

    # -- profiles -----------------------------------------------------------------------------
    def _all_parts(self, run: Run) -> dict[str, Part]:
        """The run's parts by unit: this pipeline's, then the peers', from their checkpoints."""
        parts = dict(run.parts)
        if self.peers is not None:
            for name in run.foreign:
                unit = self.peers.load(name)
                if unit is not None and run.run_id in unit.parts:
                    parts[name] = unit.parts[run.run_id]
        return parts

    def snapshot_source(self, run_id: str) -> SnapshotSource:
        """The run's parts merged (own and peers'), with the offsets they cover.

        Reads the live state: call it where the state cannot change under it, i.e. in a forked
        child (:class:`processors.snapshot.SnapshotJob`). Raises KeyError for an unknown run.
        """
        run = self.runs[run_id]
        merged = merge_parts(self._all_parts(run).values())
        return SnapshotSource(merged, self.positions(), self.paths(run), self.output_dir)

    def paths(self, run: Run) -> ProfilePaths:
        stem = run.started.output_stem if run.started else "rollouts"
        return ProfilePaths.next_to(self.output_dir / run.run_id / f"{stem}.jsonl")

    def ready(self, run: Run) -> bool:
        """Complete, or finished and every unit consumed to where the log ended then."""
        if run.complete:
            return True
        if not run.finished or run.finish_at is None:
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
        try:
            run.written_units = self._write_final(run, paths, partial)
        except RewardstreamError as exc:  # e.g. rollouts without input rows: say so, keep serving
            run.error = str(exc)
            log.error("run %s: no final profile: %s", run.run_id, exc)
            return None
        run.written = Counts(run.inputs, run.rollouts)
        mark = self._final_mark(run.run_id)
        mark.parent.mkdir(parents=True, exist_ok=True)
        units = {name: list(counts) for name, counts in run.written_units.items()}
        fields = {"file": paths.reward_profiling.name} | run.written._asdict() | {"units": units}
        mark.write_bytes(orjson.dumps(fields))
        log.info("run %s: final profile written to %s", run.run_id, paths.reward_profiling)
        self.evict(run)
        return paths

    def _write_final(self, run: Run, paths: ProfilePaths, partial: bool) -> dict[str, PartCounts]:
        """Merge the run's parts and write the profile (the merged copy is freed on return);
        returns what it holds of each unit."""
        parts = self._all_parts(run)
        merged = merge_parts(parts.values())
        write_profile(build_profile(merged.state, partial), paths, merged.sample)
        tasks = tasks_by_part(parts)
        return {
            name: PartCounts(part.inputs, part.rollouts, part.duplicates, tasks.get(name, 0))
            for name, part in parts.items()
        }

    def final_paths(self, run_id: str) -> ProfilePaths | None:
        """The run's final profile files (named by its final mark), None until written."""
        mark = self._mark(run_id)
        if mark is None:
            return None
        stem = str(mark["file"]).removesuffix("_reward_profiling.jsonl")
        return ProfilePaths.next_to(self.output_dir / run_id / f"{stem}.jsonl")
