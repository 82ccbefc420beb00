"""The engine's decisions: decode, route to the run's part, know when a run can be finished.

The Kafka processor (:mod:`rewardstream.processors.stream`) and the in-process transport both hand
raw event bytes to the pipeline (:meth:`Pipeline.apply` a slice, :meth:`Pipeline.handle` one),
naming the unit (topic-partition) they came from and, from Kafka, the offsets; everything after
the bytes is shared, so the embedded default and the Kafka deployment write identical files. The
pipeline returns what the transport must act on, never calling back: the events it rejects
(:attr:`Pipeline.rejected`, each with its offset) and the foreign rollouts to read again
(:attr:`Pipeline.strays`). With several processors in one consumer group each pipeline
owns some units; what the others hold is known from their member records
(:meth:`Pipeline.set_remote`), and their parts travel as versioned bytes
(:mod:`rewardstream.processors.engine.partwire`), never through a shared disk.

A rollout counts toward its run only once its materialized row is here (:class:`Part`). Inputs
and rollouts travel on different topics, read at their own pace, so a rollout may come before
its row; it is *foreign* (a dead letter, ``unknown-key``, never counted) only once every row of
the run is known (:attr:`Run.rows_known`: as many as its ``run_started`` says) and its key is
none of them, or once the run's final is written without it (:meth:`judge`). A foreign rollout
is parked once: its offset is kept in its unit (:attr:`Unit.parked`, which the transport keeps
in the committed offset's metadata), so a replay of the unit, here or by a new owner, parks
none again.

State is rebuilt from the data topics themselves: the fold is deterministic and deduplication
is per unit, so replaying a unit from :meth:`Pipeline.replay_start` (the first offset of any run
still open in it) gives the same parts. A run whose final record is known
(:meth:`Pipeline.mark_final`) is not folded again: its events before the record's cut are
skipped as replays, those after it are rejected (``run-final``), never silently dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
from pydantic import ValidationError

from rewardstream.contract.events import (
    AttemptFailed,
    EventKind,
    Input,
    RejectReason,
    Rollout,
    RolloutBatch,
    RunFinished,
    RunStarted,
    decode_control,
    decode_input,
    decode_inputs,
    decode_rollout,
    decode_rollout_batch,
    decode_rollouts,
    reject_reason,
)
from rewardstream.contract.names import Aggregates, ProfilePaths
from rewardstream.errors import RewardstreamError
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.state import ProfileState, keys_in, row_key, row_names
from rewardstream.processors.core.stopping import Verdict
from rewardstream.processors.engine.checkpoints import Checkpoint
from rewardstream.processors.engine.live import AgentLive
from rewardstream.processors.engine.runs import (
    Counts,
    Done,
    Merged,
    Part,
    PartCounts,
    PartView,
    Run,
    RunState,
    Unit,
    checked_row,
    merge_parts,
    tasks_by_part,
)
from rewardstream.processors.engine.stops import RunStops

__all__ = [
    "STALL_AFTER",
    "Counters",
    "Late",
    "Pipeline",
    "Rejected",
    "RemoteUnit",
    "SnapshotSource",
    "Stray",
    "log_level",
]

log = logging.getLogger(__name__)

STALL_AFTER = 60.0  # seconds without an event after which an open run is stalled (default)


class Counters(Protocol):
    """What the engine counts as it decides (:class:`rewardstream.sinks.metrics.Metrics` is one)."""

    def rollouts(self, agents: Sequence[str | None], published_at: Sequence[float]) -> None: ...

    def duplicate(self, kind: EventKind, n: int = 1) -> None: ...

    def reject(self, kind: EventKind, reason: RejectReason, n: int = 1) -> None: ...


class Rejected(NamedTuple):
    """An event that could not be used: its kind, why (a fixed category, see
    :data:`rewardstream.contract.events.REJECT_REASONS`), its original bytes, the error text,
    and its offset in the unit (or topic) it was handed from (None: given without one), by
    which the transport names its dead letter."""

    kind: EventKind
    reason: RejectReason
    raw: bytes
    detail: str = ""
    offset: int | None = None


class SnapshotSource(NamedTuple):
    """What a snapshot is built from: the merged parts, the next offset per unit they cover,
    the run's profile file names, and a folder for scratch files."""

    merged: Merged
    offsets: dict[str, int]
    paths: ProfilePaths
    spool_dir: Path


class Late(NamedTuple):
    """Events of a finished run that a unit folded past the final's cut: ``events`` of them,
    somewhere in offsets [``cut``, ``position``)."""

    unit: str
    run_id: str
    cut: int
    position: int
    events: int


class Stray(NamedTuple):
    """A foreign rollout (see the module docstring) at ``offset`` of ``unit``: the transport
    reads its bytes there and parks them (:meth:`Pipeline.reject_stray`)."""

    unit: str
    run_id: str
    offset: int
    detail: str


class RemoteUnit(NamedTuple):
    """A unit another processor owns, as its member record last said: the next offset it will
    consume, per run the (inputs, rollouts) it holds and per run and agent its live summary."""

    position: int
    runs: dict[str, Counts]
    live: dict[str, dict[str, AgentLive]]


class Pipeline:
    """All runs seen on the topics and the units this process owns (see the module docstring).

    Rejected events are returned, not sent: they wait in :attr:`rejected` for the transport to
    take (:meth:`take_rejected`) after each call, as foreign rollouts wait in :attr:`strays`.

    ``output_dir``: where the in-process transport writes final profiles; ``state_dir``: private
    scratch for the parts' spill files (default: ``output_dir``). ``max_event_bytes``: larger
    events are rejected unparsed (reason "oversized"); None: no limit. ``stall_after``: seconds
    without an event after which an open run is ``stalled``; ``clock``: what times events and
    states (monotonic seconds; a test gives its own, so nothing waits for real time). Events
    may come with their Kafka timestamps, which date those read again (see :meth:`_when`).
    ``level``: the level of the mean reward's interval the processor shows (the page,
    ``/runs/<id>``, ``/metrics``) and writes in ``_intervals.json``.
    """

    def __init__(
        self,
        output_dir: Path,
        metrics: Counters | None = None,
        max_event_bytes: int | None = None,
        state_dir: Path | None = None,
        aggregate_metrics: bool = False,
        stall_after: float = STALL_AFTER,
        clock: Callable[[], float] = time.monotonic,
        level: float = DEFAULT_LEVEL,
        fast: bool = True,
    ) -> None:
        self.output_dir = output_dir
        self.fast = fast  # rollout batches take the fast path first (see handle_rollouts)
        self.level = level
        self.stall_after, self.clock = stall_after, clock
        self.started = clock()  # control events are read from the topic's start from here
        self.aggregate_metrics = aggregate_metrics  # for every run, not only those asking
        self.state_dir = state_dir or output_dir
        self.max_event_bytes = max_event_bytes
        self.runs: dict[str, Run] = {}
        self.units: dict[str, Unit] = {}  # the units this pipeline owns
        self.remote: dict[str, RemoteUnit] = {}  # units owned elsewhere, as last heard
        self.leader = True  # finishes runs (the owner of rollout-0 in a group)
        self.strays: list[Stray] = []  # foreign rollouts for the transport to park
        self.rejected: list[Rejected] = []  # events for the transport to park, in order
        self.stops: dict[str, RunStops] = {}  # the open runs that asked for an early stop
        self.metrics = metrics
        # every input unit of the topics (``input-p``) when other processors may hold some:
        # a live cut needs a bound from each (empty: not known yet); None: this pipeline
        # reads every event (see :func:`~rewardstream.processors.engine.live.bounds`)
        self.input_units: frozenset[str] | None = None

    def close(self) -> None:
        for unit in self.units.values():
            unit.drop()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- units --------------------------------------------------------------------------------
    def run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = Run(run_id, self.clock())
            run.input_units = self.input_units
            run.positions = self.positions
            run.foreign = self._foreign(run_id)
            run.foreign_live = self._foreign_live(run_id)
        return run

    def _foreign(self, run_id: str) -> dict[str, Counts]:
        """The run's counts in the units other processors own, as last heard. Kept per run and
        renewed with every member record: a run first seen after them must still count its
        peers' parts, or it could finish without merging them."""
        return {n: u.runs[run_id] for n, u in self.remote.items() if run_id in u.runs}

    def _foreign_live(self, run_id: str) -> dict[str, dict[str, AgentLive]]:
        return {n: u.live[run_id] for n, u in self.remote.items() if run_id in u.live}

    def unit(self, name: str) -> Unit:
        """The owned unit ``name``, created empty if new (assigned, or first event in process)."""
        unit = self.units.get(name)
        if unit is None:
            unit = self.units[name] = Unit(name, self.state_dir, self.clock())
            self.remote.pop(name, None)
            for run in self.runs.values():
                run.foreign.pop(name, None)
                run.foreign_live.pop(name, None)
        return unit

    def release(self, name: str) -> None:
        """Stop owning a unit (revoked): its parts leave their runs and their spills go."""
        unit = self.units.pop(name, None)
        if unit is not None:
            for run_id in unit.parts:
                self.runs[run_id].parts.pop(name, None)
            unit.drop()

    def restore(self, name: str, checkpoint: Checkpoint, parts: dict[str, Part]) -> list[str]:
        """Hold the new unit ``name`` again as ``checkpoint`` holds it, with ``parts`` built
        from it (:meth:`Unit.held`): its open parts, at its position (the transport reads on
        from there). A run whose terminal record is known meanwhile is left out (its events up
        to the cut are replays), unless the checkpoint is past that cut: the late events
        between would be missed, so that refuses it. The held rollouts whose rows the unit's
        pair holds now count, as they would have when the rows came; returns the runs held
        again. Raises ``ValueError`` when the checkpoint cannot be used: every part deleted,
        the unit left new and empty (to be replayed)."""
        unit = self.units.get(name)
        try:
            if unit is None or unit.parts or unit.position:
                raise ValueError(f"unit {name} is not a new one of this processor")
            for run_id in checkpoint.parts:
                terminal = self.runs[run_id].terminal if run_id in self.runs else None
                cut = terminal.cuts.get(name, 0) if terminal is not None else None
                if cut is not None and checkpoint.position > cut:
                    raise ValueError(
                        f"it is past where the terminal record of run {run_id} covers the "
                        f"unit to ({checkpoint.position} > {cut})"
                    )
            for run_id, (seen, _) in checkpoint.parts.items():
                run, part = self.run(run_id), parts.pop(run_id)
                if run.terminal is not None:
                    part.delete()
                    continue
                unit.parts[run_id] = run.parts[name] = part
                run.heard(self._when(seen, unit.since), self.clock())
        except BaseException:
            for part in parts.values():
                part.delete()
            if unit is not None and self.units.get(name) is unit:
                self.release(name)
                self.unit(name)  # new again, to be replayed
            raise
        unit.position = checkpoint.position
        pairs = (
            (self.units.get(_rollouts_unit(name)), unit)
            if name.startswith("input-")
            else (unit, self.units.get(_rows_unit(name)))
        )
        for run_id in unit.parts:
            waiting, rows = (u.parts.get(run_id) if u else None for u in pairs)
            if waiting is not None and rows is not None and waiting.unmatched:
                for key in [k for k in waiting.unmatched if k in rows.keys]:
                    waiting.row_came(key)
            self.judge(self.runs[run_id])
        return list(unit.parts)

    def set_input_units(self, names: frozenset[str]) -> None:
        """Every input unit of the topics, as the transport knows them (see
        :attr:`input_units`)."""
        self.input_units = names
        for run in self.runs.values():
            run.input_units = names

    def set_remote(self, units: dict[str, RemoteUnit]) -> None:
        """What the other processors of the group hold, from their member records."""
        self.remote = {n: u for n, u in units.items() if n not in self.units}
        now = self.clock()
        for run in self.runs.values():
            foreign = self._foreign(run.run_id)
            if foreign != run.foreign:  # a peer consumed some: the run is alive
                run.foreign = foreign
                run.heard(now, now)
                self.judge(run)  # the peers' rows may complete the run's
            run.foreign_live = self._foreign_live(run.run_id)

    def positions(self) -> dict[str, int]:
        """The next offset to consume per unit, owned or (as last heard) a peer's."""
        return {n: u.position for n, u in self.remote.items()} | {
            n: u.position for n, u in self.units.items()
        }

    def replay_start(self, name: str) -> int:
        """Where a new owner of the unit must start reading to rebuild it: the first offset of
        any run still open in it (its position when none is). This is the offset committed."""
        unit = self.units[name]
        firsts = [p.first_offset for p in unit.parts.values() if p.final is None]
        return min(firsts, default=unit.position)

    # -- events -------------------------------------------------------------------------------
    def handle(
        self,
        kind: EventKind,
        raw: bytes,
        unit: str | None = None,
        offset: int | None = None,
        timestamp: int | None = None,
    ) -> Run | None:
        """Apply one event from ``unit`` (default ``<kind>-0``) at ``offset`` (None in process),
        Kafka ``timestamp`` (:meth:`_when`); returns its run (None when rejected). Control
        events belong to no unit: every processor reads all of them.

        Data of a run not announced yet is kept: the publisher sends ``run_started`` after the
        inputs, and topics are not ordered with each other. A ``run_finished`` whose run never
        started is rejected: both are keyed by run id, so ``run_started`` would have come first.
        """
        limit = self.max_event_bytes
        if limit is not None and len(raw) > limit:
            detail = f"{len(raw)} bytes, above the {limit}-byte limit (--max-event-bytes)"
            self._reject(kind, "oversized", raw, detail, offset)
            return None
        try:
            if kind == "input":
                ev_in = decode_input(raw)
                row_key(ev_in.row)  # a bad row must not create its run or part
                row_names(ev_in.row)
                run_id = ev_in.run_id
                name = unit or "input-0"
                if self._after_final(run_id, kind, raw, name, offset):
                    return None
                part = self._part(name, run_id, offset)
                before = part.duplicates
                if part.add_input(ev_in):
                    self._rows_came(name, run_id, [row_key(ev_in.row)])
                elif self.metrics and part.duplicates > before:
                    self.metrics.duplicate(kind)
                self._conflicts(kind, run_id, part, [ev_in], [raw], [offset])
            elif kind == "rollout":
                ev_out = decode_rollout(raw)
                run_id = ev_out.run_id
                name = unit or "rollout-0"
                key = (ev_out.task, ev_out.rollout)
                if self._after_final(run_id, kind, raw, name, offset, key):
                    return None
                sent = ([ev_out], [raw], [offset])
                self._fold(name, {run_id: [ev_out]}, offset, sent, one=True)
            else:
                control = decode_control(raw)
                run_id = control.run_id
                if isinstance(control, RunStarted):
                    self._started(self.run(run_id), control, offset)
                elif isinstance(control, RunFinished):
                    if not self._announced(run_id):
                        detail = f"run_finished for run {run_id!r}, which never started"
                        self._reject(kind, "unknown-run", raw, detail, offset)
                        return None
                    self.run(run_id).finish(control.skipped)
                elif isinstance(control, AttemptFailed):
                    self.run(run_id).attempt_failed(control)
                else:
                    self.run(run_id).row_skipped(control)
        except (ValidationError, RewardstreamError, ValueError) as exc:
            detail = " ".join(str(exc).split())[:500]
            self._reject(kind, reject_reason(exc), raw, detail, offset)
            return None
        run = self.run(run_id)
        since = self.units[unit].since if unit in self.units else self.started
        run.heard(self._when(timestamp, since), self.clock())
        self.judge(run)
        return run

    def _started(self, run: Run, started: RunStarted, offset: int | None) -> None:
        run.start(started, offset)
        early = started.early_stop
        if early is not None and run.terminal is None and run.run_id not in self.stops:
            self.stops[run.run_id] = RunStops(early.rule())

    def decide(self) -> list[tuple[str, Verdict]]:
        """The early-stop decisions (run id, verdict) not made before
        (:mod:`rewardstream.processors.engine.stops`): the task rule on the parts owned here,
        the agent rule on the whole run when this processor leads. Nothing to do, and nothing
        paid, when no open run asked for an early stop."""
        made = []
        for run_id, stops in self.stops.items():
            run = self.runs[run_id]
            states = {n: p.state for n, p in run.parts.items() if n.startswith("rollout-")}
            tasks = stops.tasks(states)
            made += [(run_id, v) for v in tasks]
            if self.leader and stops.rule.half_width is not None:
                whole = run.whole(self.clock(), figures=False)
                made += [(run_id, v) for v in stops.agents({a: s.tally for a, s in whole.items()})]
        return made

    def handle_inputs(
        self,
        raws: Sequence[bytes],
        unit: str,
        offsets: Sequence[int] | None = None,
        timestamps: Sequence[int] | None = None,
    ) -> list[Run] | None:
        """Apply a batch of input events from ``unit`` as :meth:`handle_rollouts` applies
        rollouts (at their ``offsets``, with their Kafka ``timestamps``): decoded in one go,
        every row checked (:func:`checked_row`) before any is applied; None, having applied
        nothing, when an event needs :meth:`handle` (one to reject, or of a run that has its
        terminal record)."""
        if self._oversized(raws):
            return None
        events = decode_inputs(raws)
        if events is None:
            return None
        try:
            checked = [checked_row(event.row) for event in events]
        except RewardstreamError:
            return None
        run_ids = {event.run_id for event in events}
        if self._any_terminal(run_ids):
            return None
        parts: dict[str, Part] = {}
        duplicates = 0
        first = offsets[0] if offsets else None
        todo = zip(events, checked, raws, strict=True)
        if self.fast and len(run_ids) == 1:  # every key new: the rows go in as columns
            run_id = events[0].run_id
            one = self._part(unit, run_id, first)
            if one.add_inputs(events, checked):
                self._rows_came(unit, run_id, [row.key for row in checked])
                parts[run_id], todo = one, zip()
        for i, (event, row, raw) in enumerate(todo):
            part = parts.get(event.run_id)
            if part is None:
                part = parts[event.run_id] = self._part(unit, event.run_id, first)
            if part.add_input(event, row):
                self._rows_came(unit, event.run_id, [row.key])
            else:
                at = [None if offsets is None else offsets[i]]
                duplicates += not self._conflicts("input", event.run_id, part, [event], [raw], at)
        if duplicates and self.metrics:
            self.metrics.duplicate("input", duplicates)
        runs = self._touched(parts, unit, _newest(events, timestamps))
        for run in runs:
            self.judge(run)
        return runs

    def _after_final(
        self,
        run_id: str,
        kind: EventKind,
        raw: bytes,
        unit: str,
        offset: int | None,
        key: tuple[int, int] | None = None,
    ) -> bool:
        """True when the event's run has its final (or evicted) record: an event the record
        covers (before its cut of the unit: read again after a restart) is a replay, counted
        and skipped; a later one is rejected (``run-final``/``run-evicted``), never dropped
        silently, for it cannot change a profile that is written.

        A late rollout is ``unknown-key`` only where that is proved: its ``key`` lies outside
        the ranges of the rows the final held here (their keys are dropped with the part;
        the ranges stay). Otherwise it is ``run-final``, which is true of it whatever its key
        (too late for a written profile: publishing it again changes nothing), and its detail
        says whether its key is a row: yes when the rows filled their ranges, unknown when they
        did not or when this processor never held them (a restart, or another partition)."""
        run = self.runs.get(run_id)
        if run is None or run.terminal is None:
            return False
        cut = run.terminal.cuts.get(unit, 0)
        if offset is not None and offset < cut:
            run.replays += 1
            return True
        reason: RejectReason = "run-evicted" if run.terminal.evicted else "run-final"
        what = "was evicted unfinished" if run.terminal.evicted else "has its final profile"
        detail = f"run {run_id!r} {what}; this event came after it"
        rows = self.units.get(_rows_unit(unit))
        held = rows.parts[run_id] if rows is not None and run_id in rows.parts else None
        span = held.span if held is not None else None
        if key is not None and reason == "run-final":
            task, rollout = key
            if span is None:
                detail += "; its key was not checked: the run's rows are not held here"
            elif span[0] <= task <= span[1] and span[2] <= rollout <= span[3]:
                known = "is one of its rows" if held and held.dense else "may be no row of it"
                detail += f"; its key (task {task}, rollout {rollout}) {known}"
            else:
                reason = "unknown-key"
                detail = (
                    f"run {run_id!r}: rollout key (task {task}, rollout {rollout}) has no "
                    f"matching materialized input row (the final's rows: tasks {span[0]}..{span[1]}"
                    f", rollouts {span[2]}..{span[3]} in {rows.name if rows else unit})"
                )
        self._reject(kind, reason, raw, detail, offset)
        return True

    def handle_rollouts(
        self,
        raws: Sequence[bytes],
        unit: str,
        offsets: Sequence[int] | None = None,
        timestamps: Sequence[int] | None = None,
    ) -> list[Run] | None:
        """Apply a batch of rollout events from ``unit`` (at their ``offsets``; a part starts at
        the batch's first offset, which a replay start may take; Kafka ``timestamps`` as
        :meth:`handle`'s), in order: the Kafka processor's hot path (about half the cost per
        event of :meth:`handle`). Returns the runs
        touched, or None, having applied nothing, when any event needs :meth:`handle`'s
        one-by-one path (one that is rejected, or whose ``info`` is not written as orjson
        writes it, or one of a run that has its final record, or one whose materialized row
        is not here: its offset is kept)."""
        if self._oversized(raws):
            return None
        if self.fast:
            fast = decode_rollout_batch(raws)
            if fast is not None and self._fold_batch(unit, fast, raws, offsets):
                newest = None if timestamps is None else {fast.run_id: max(timestamps)}
                touched = self._touched([fast.run_id], unit, newest)
                self.judge(touched[0])  # as handle() judges: rows may all be known
                return touched
        events = decode_rollouts(raws)
        if events is None:
            return None
        by_run = _by_run(events)
        if self._any_terminal(by_run) or not self._rows_here(unit, by_run):
            return None
        first = offsets[0] if offsets else None
        sent = (events, raws, [None] * len(raws) if offsets is None else offsets)
        runs = self._fold(unit, by_run, first, sent)
        return self._touched(runs, unit, _newest(events, timestamps))

    def _fold_batch(
        self, unit: str, batch: RolloutBatch, raws: Sequence[bytes], offsets: Sequence[int] | None
    ) -> bool:
        """Fold a fast-path batch as :meth:`handle` folds its events one by one when that
        needs no decision per event: its run open, every key new (a rollout whose row is not
        here is held, as :meth:`_fold` holds one); else fold nothing and return False."""
        run_id = batch.run_id
        if self._any_terminal((run_id,)):
            return False
        rows = self.units.get(_rows_unit(unit))
        held = rows.parts.get(run_id) if rows is not None else None
        tasks, rollouts = batch.tasks, batch.rollouts
        missing = held.keys.missing(tasks, rollouts) if held else range(len(tasks))
        waiting = {at: raws[at] if offsets is None else offsets[at] for at in missing}
        part = self._part(unit, run_id, offsets[0] if offsets else None)
        if not part.add_batch(batch, waiting):
            return False
        if self.metrics:
            self.metrics.rollouts(batch.agents, batch.published_at)
        return True

    def apply(
        self,
        kind: EventKind,
        raws: Sequence[bytes],
        unit: str,
        offsets: Sequence[int],
        timestamps: Sequence[int] | None = None,
    ) -> None:
        """Apply a slice of data events from ``unit`` at ``offsets`` (with their Kafka
        ``timestamps``): in one batch (:meth:`handle_rollouts`, :meth:`handle_inputs`) when the
        batch path takes all of them, else one by one (:meth:`handle`), which rejects, holds or
        rewrites what the batch path hands over. Either way the rejected wait in
        :attr:`rejected`, each with its offset."""
        batch = self.handle_rollouts if kind == "rollout" else self.handle_inputs
        if batch(raws, unit, offsets, timestamps) is not None:
            return
        stamps: Sequence[int | None] = timestamps or [None] * len(raws)
        for raw, offset, stamp in zip(raws, offsets, stamps, strict=True):
            self.handle(kind, raw, unit, offset, stamp)

    def _rows_here(self, unit: str, by_run: dict[str, list[Rollout]]) -> bool:
        """Every rollout's materialized row is in the input part of its run and partition."""
        rows = self.units.get(_rows_unit(unit))
        for run_id, events in by_run.items():
            part = rows.parts.get(run_id) if rows is not None else None
            if part is None or not part.keys.has_all(events):
                return False
        return True

    def _rows_came(self, unit: str, run_id: str, keys: Iterable[tuple[int, int]]) -> None:
        """New materialized rows: the rollout of each key, if it came first, now counts."""
        rollouts = self.units.get(_rollouts_unit(unit))
        part = rollouts.parts.get(run_id) if rollouts is not None else None
        if part is not None and part.unmatched:
            for key in keys:
                part.row_came(key)

    def judge(self, run: Run, final: Done | None = None) -> None:
        """Park the run's rollouts held here whose key is no materialized row's, now that every
        row is known (:attr:`Run.rows_known`) or the run's ``final`` is written: their
        bytes go to :attr:`rejected` (``unknown-key``), or, when they came from a topic, their
        offsets to :attr:`strays` for the transport to read them again (a held rollout keeps
        its offset only); one parked before (:attr:`Unit.parked`) is not parked again.
        Undecided (kept, uncounted) while some row may still come, and for a unit whose input
        partition is not owned here (the topics must have as many partitions).

        A part whose unit the final counts more matched rollouts of than it does is not the
        final's copy of the unit (a member paused while the unit moved, or rows on another
        partition): its held rollouts had their rows where the final was made, and are the
        final's; none is parked here."""
        if run.terminal is not None or (final is None and not run.rows_known):
            return
        for name, part in run.parts.items():
            if not part.unmatched or _rows_unit(name) not in self.units:
                continue
            if final is not None and final.units.get(name, _NO_COUNTS).rollouts > part.rollouts:
                log.info(
                    "run %s: the final holds more rollouts of %s than this processor matched; "
                    "its %d held here are the final's",
                    run.run_id,
                    name,
                    len(part.unmatched),
                )
                continue
            unit, held = self.units[name], part.unmatched
            part.unmatched = {}
            part.foreign += len(held)
            for (task, rollout), at in held.items():
                known = "all its" if run.rows_known else "the final's"
                detail = (
                    f"run {run.run_id!r}: rollout key (task {task}, rollout {rollout}) has no "
                    f"matching materialized input row ({known} {run.inputs} rows have come)"
                )
                if isinstance(at, bytes):
                    self._reject("rollout", "unknown-key", at, detail, None)
                elif at in unit.parked:
                    log.info("%s (parked before, at %s offset %d)", detail, name, at)
                else:
                    unit.parked.add(at)
                    self.strays.append(Stray(name, run.run_id, at, detail))

    def reject_stray(self, stray: Stray, raw: bytes) -> None:
        """Park a foreign rollout (see :meth:`judge`) with its bytes read again."""
        self._reject("rollout", "unknown-key", raw, stray.detail, stray.offset)

    def _oversized(self, raws: Sequence[bytes]) -> bool:
        """A batch holds an event over ``max_event_bytes`` (:meth:`handle` rejects it)."""
        limit = self.max_event_bytes
        return limit is not None and max(map(len, raws), default=0) > limit

    def _any_terminal(self, run_ids: Iterable[str]) -> bool:
        """One of the runs has its terminal record: its events need :meth:`_after_final`."""
        return any((r := self.runs.get(run_id)) is not None and r.terminal for run_id in run_ids)

    def _touched(
        self, run_ids: Iterable[str], unit: str, newest: Mapping[str, int] | None
    ) -> list[Run]:
        """The runs a batch from ``unit`` added to, heard of (stalls count from the events'
        time, eviction from now): ``newest`` is per run its newest event's Kafka timestamp
        (None: now)."""
        since, now = self.units[unit].since, self.clock()
        runs = [self.run(run_id) for run_id in run_ids]
        for run in runs:
            run.heard(self._when(None if newest is None else newest[run.run_id], since), now)
        return runs

    def _when(self, timestamp: int | None, since: float) -> float:
        """When an event happened, by the engine's clock, from its Kafka ``timestamp`` (ms
        since the epoch; None: now), read from a unit (or the control topic) consumed here
        since ``since``: one from before that, read again after a restart or a rebalance, is
        as old as Kafka says (a run dead for an hour is stalled at once); a later one is heard
        now (a processor behind its log is late, its runs are not idle). A publisher's clock
        behind this host's dates its events that much earlier, for that long after a start."""
        now = self.clock()
        if timestamp is None or timestamp < 0:
            return now
        at = now - max(0.0, time.time() - timestamp / 1000)
        return at if at < since else now

    def _fold(
        self,
        unit: str,
        by_run: dict[str, list[Rollout]],
        first: int | None,
        sent: tuple[Sequence[Rollout], Sequence[bytes], Sequence[int | None]],
        one: bool = False,
    ) -> list[str]:
        """Add decoded rollouts, by run, to their runs' parts (dropping those seen before); the
        runs' ids. ``sent``: the events as they came, their bytes and offsets (for a conflict's
        dead letter); ``one``: a single event (at offset ``first``) whose row may not be here: held
        unmatched (its offset, or its bytes when it has none)."""
        for run_id, mine in by_run.items():
            part = self._part(unit, run_id, first)
            before = part.duplicates
            new = part.add_rollouts(mine)
            if one and new and not self._rows_here(unit, {run_id: new}):
                at = sent[1][0] if first is None else first
                part.hold((new[0].task, new[0].rollout), at)
            if self.metrics:
                self.metrics.rollouts([e.agent for e in new], [e.published_at for e in new])
                if part.duplicates > before:
                    self.metrics.duplicate("rollout", part.duplicates - before)
            if part.clashes:
                came = {id(event): (raw, at) for event, raw, at in zip(*sent, strict=True)}
                raws = [came[id(event)][0] for event in mine]
                self._conflicts("rollout", run_id, part, mine, raws, [came[id(e)][1] for e in mine])
        return list(by_run)

    def _conflicts(
        self,
        kind: EventKind,
        run_id: str,
        part: Part,
        events: Sequence[Input | Rollout],
        raws: Sequence[bytes],
        offsets: Sequence[int | None],
    ) -> int:
        """Reject (``conflict``) the events the part's last call found with a folded key and
        other content (:attr:`Part.clashes`), ``raws`` and ``offsets`` theirs; returns how
        many."""
        clashes, part.clashes = part.clashes, []
        for at in clashes:
            event = events[at]
            task, rollout = (
                (event.task, event.rollout) if isinstance(event, Rollout) else row_key(event.row)
            )
            detail = (
                f"run {run_id!r} task {task} rollout {rollout}: this {kind} event has the key of "
                "one already folded, with other content; the first stands (a new collection "
                "needs its own run id: publish it with a new --run-id)"
            )
            self._reject(kind, "conflict", raws[at], detail, offsets[at])
        return len(clashes)

    def _announced(self, run_id: str) -> bool:
        """A run_started was seen, or the run has its terminal record (its run_started may have
        aged out of the control topic)."""
        run = self.runs.get(run_id)
        return run is not None and (run.started is not None or run.terminal is not None)

    def _reject(
        self, kind: EventKind, reason: RejectReason, raw: bytes, detail: str, offset: int | None
    ) -> None:
        if self.metrics:
            self.metrics.reject(kind, reason)
        self.rejected.append(Rejected(kind, reason, raw, detail, offset))

    def take_rejected(self) -> list[Rejected]:
        """The events rejected since the last call, in order, for the transport to park (the
        Kafka processor) or to refuse (in process); each names its offset."""
        rejected, self.rejected = self.rejected, []
        return rejected

    def _part(self, unit_name: str, run_id: str, offset: int | None) -> Part:
        unit = self.unit(unit_name)  # the transport moves its position
        part = unit.parts.get(run_id)
        if part is None:
            run = self.run(run_id)
            part = run.parts[unit_name] = unit.part(run_id)
            part.first_offset = unit.position if offset is None else offset
        elif offset is not None and offset < part.first_offset:  # a replay start must cover it
            part.first_offset = offset
        return part

    # -- lifecycle ----------------------------------------------------------------------------
    def ready(self, run: Run) -> bool:
        """Complete, or finished and every unit consumed to where the log ended then (and not
        failed on the very events it holds now)."""
        if run.terminal is not None or not run.retry:
            return False
        if run.complete:
            return True
        if not run.finished or run.finish_at is None:
            return False
        positions = self.positions()
        return all(positions.get(u, 0) >= end for u, end in run.finish_at.items())

    def mark_final(self, run_id: str, terminal: Done) -> list[Late]:
        """The run has its terminal record (written here or by another processor): retire its
        parts (memory and spill files go, the counts stay; see
        :mod:`rewardstream.processors.engine.runs`).

        Returns the owned units that had consumed events of the run past the record's cut
        (folded before this processor heard of the record): they are in no profile, and the
        transport must read them again from the topic and park them (``run-final``)."""
        run = self.run(run_id)
        if run.terminal is not None:
            return []
        if not terminal.evicted:  # a rollout its final left out has no row: park it
            self.judge(run, terminal)
        run.terminal = terminal
        self.stops.pop(run_id, None)
        late = []
        for name, part in run.parts.items():
            held = terminal.units.get(name, _NO_COUNTS)
            after = part.inputs + part.rollouts + part.duplicates - held.events
            cut = terminal.cuts.get(name, 0)
            if after > 0 and not terminal.evicted and name in self.units:
                late.append(Late(name, run_id, cut, self.units[name].position, after))
        tasks = tasks_by_part({n: p for n, p in run.parts.items() if p.final is None})
        run.task_figures()  # as the parts hold them, before their states go
        for name, part in run.parts.items():
            part.retire(tasks.get(name, terminal.units.get(name, _NO_COUNTS).tasks))
        return late

    def reject_late(self, kind: EventKind, raw: bytes, run_id: str, offset: int) -> None:
        """Reject an event of a finished run that a unit had folded (at ``offset``) before it
        heard of the run's final record (see :meth:`mark_final`)."""
        detail = f"run {run_id!r} has its final profile; this event came after it"
        self._reject(kind, "run-final", raw, detail, offset)

    def idle_runs(self, after: float) -> list[Run]:
        """Open runs this process has read no event of for ``after`` seconds (by its own
        clock, never the events' timestamps: the oldest events of a live run come first when a
        restarted processor replays it, and must not get it evicted)."""
        now = self.clock()
        return [r for r in self.runs.values() if r.terminal is None and now - r.read_at > after]

    def state(self, run: Run) -> RunState:
        """The run's state now (``stalled`` after :attr:`stall_after` seconds without an event)."""
        return run.state(self.clock(), self.stall_after)

    def idle(self, run: Run) -> float:
        """Seconds since this process last heard of an event of the run."""
        return self.clock() - run.seen

    @staticmethod
    def counts_by_unit(parts: dict[str, PartView]) -> dict[str, PartCounts]:
        """What a profile merged from ``parts`` holds of each unit (for its terminal record):
        of its rollouts, those with a row (see :func:`merge_parts`)."""
        tasks = tasks_by_part(parts)
        column, states = ProfileState.column, [p.state for p in parts.values()]
        empty = np.zeros(0, dtype=np.int64)
        rows = [
            np.concatenate([empty, *(column(s.in_task) for s in states)]),
            np.concatenate([empty, *(column(s.in_rollout) for s in states)]),
        ]
        return {
            name: PartCounts(
                part.state.num_inputs,
                int(
                    keys_in(
                        column(part.state.res_task), column(part.state.res_rollout), *rows
                    ).sum()
                ),
                part.duplicates,
                tasks.get(name, 0),
            )
            for name, part in parts.items()
        }

    # -- profiles -----------------------------------------------------------------------------
    def snapshot_source(
        self, run_id: str, received: dict[str, PartView], offsets: dict[str, int]
    ) -> SnapshotSource:
        """The run's parts merged, own and ``received`` from their owners, with the offsets
        they cover; of their rollouts, those whose row is there (as the live figures count
        them: one waiting for its row, or foreign, is left out). Reads the live state: call it
        where the state cannot change under it, i.e. in a forked child
        (:class:`rewardstream.processors.http.snapshot.SnapshotJob`). KeyError: unknown run."""
        run = self.runs[run_id]
        parts: dict[str, PartView] = {**received, **run.parts}
        merged = merge_parts((parts[n] for n in sorted(parts)), known_only=True)
        covered = {**offsets, **{n: u.position for n, u in self.units.items()}}
        return SnapshotSource(
            merged, dict(sorted(covered.items())), self.paths(run), self.state_dir
        )

    def aggregates(self, run: Run) -> Aggregates | None:
        """The extra files a run's snapshots and final carry: asked for by its RunStarted, or
        by this processor for every run; None for NeMo Gym's three files only."""
        started = run.started
        if not (self.aggregate_metrics or (started is not None and started.aggregate_metrics)):
            return None
        return Aggregates(started is not None and started.answer_key is not None, self.level)

    def paths(self, run: Run) -> ProfilePaths:
        stem = run.started.output_stem if run.started else "rollouts"
        if run.terminal is not None:
            stem = run.terminal.stem
        return ProfilePaths.next_to(self.output_dir / run.run_id / f"{stem}.jsonl")


_NO_COUNTS = PartCounts(0, 0, 0, 0)


def _rows_unit(rollouts_unit: str) -> str:
    """The input unit holding the rows of a rollout unit's tasks (``rollout-3``: ``input-3``):
    both topics are keyed by task, with as many partitions."""
    return "input-" + rollouts_unit.rpartition("-")[2]


def _rollouts_unit(rows_unit: str) -> str:
    return "rollout-" + rows_unit.rpartition("-")[2]


def _newest(
    events: Sequence[Input | Rollout], timestamps: Sequence[int] | None
) -> dict[str, int] | None:
    """Per run, the newest Kafka timestamp of its events (``events[i]``'s is
    ``timestamps[i]``); None without timestamps."""
    if timestamps is None:
        return None
    if events and all(e.run_id == events[0].run_id for e in events):  # the usual batch
        return {events[0].run_id: max(timestamps)}
    newest: dict[str, int] = {}
    for event, stamp in zip(events, timestamps, strict=True):
        newest[event.run_id] = max(stamp, newest.get(event.run_id, stamp))
    return newest


def log_level(reason: RejectReason) -> int:
    """How loud a dead letter is logged: a conflict (a run id given to other content) is an
    error, never routine; the others are warnings."""
    return logging.ERROR if reason == "conflict" else logging.WARNING


def _by_run(events: list[Rollout]) -> dict[str, list[Rollout]]:
    """Events grouped by run, in order (a batch is mostly one run's, but topics are shared)."""
    if events and all(e.run_id == events[0].run_id for e in events):
        return {events[0].run_id: events}
    by_run: dict[str, list[Rollout]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return by_run
