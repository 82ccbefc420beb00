"""Transport-independent event handling: decode, route to the run, finish the run.

The Kafka processor (:mod:`processors.stream`) and the in-process transport both hand raw
event bytes to :meth:`Pipeline.handle`; everything after the bytes is shared, so the embedded
default and the Kafka deployment write identical files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import ValidationError

from processors.profile import build_profile
from processors.runs import RunTracker
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

__all__ = ["EventKind", "Pipeline", "Rejected", "Snapshot"]

log = logging.getLogger(__name__)

EventKind = Literal["input", "rollout", "control"]


class Rejected(NamedTuple):
    """An event that could not be used: its kind, why, and its original bytes."""

    kind: EventKind
    reason: str
    raw: bytes


class Snapshot(NamedTuple):
    """A partial profile: what ``ng_reward_profile ++allow_partial_rollouts=True`` would write
    for exactly the ``rollouts`` results (and ``inputs`` rows) consumed when it was taken."""

    run_id: str
    rollouts: int
    inputs: int
    files: dict[str, bytes]


class Pipeline:
    """All runs seen on the topics; writes each run's final profile under ``output_dir``."""

    def __init__(
        self,
        output_dir: Path,
        on_reject: Callable[[Rejected], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.runs: dict[str, RunTracker] = {}
        self.metrics = metrics
        self.on_reject = on_reject or (
            lambda r: log.warning("rejected %s event: %s", r.kind, r.reason)
        )

    def close(self) -> None:
        for tracker in self.runs.values():
            tracker.spill.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tracker(self, run_id: str) -> RunTracker:
        tracker = self.runs.get(run_id)
        if tracker is None:
            tracker = self.runs[run_id] = RunTracker(run_id, self.output_dir / run_id / ".state")
        return tracker

    def handle(self, kind: EventKind, raw: bytes) -> RunTracker | None:
        """Apply one event; returns the run it touched (None when rejected)."""
        try:
            if kind == "input":
                ev_in = decode_input(raw)
                tracker = self.tracker(ev_in.run_id)
                if not tracker.add_input(ev_in) and self.metrics:
                    self.metrics.duplicates.labels(kind).inc()
            elif kind == "rollout":
                ev_out = decode_rollout(raw)
                tracker = self.tracker(ev_out.run_id)
                if tracker.add_rollout(ev_out):
                    if self.metrics:
                        self.metrics.rollout(ev_out.agent, ev_out.published_at)
                elif self.metrics:
                    self.metrics.duplicates.labels(kind).inc()
            else:
                control = decode_control(raw)
                tracker = self.tracker(control.run_id)
                if isinstance(control, RunStarted):
                    tracker.started = control
                elif isinstance(control, RunFinished):
                    tracker.finished = True
        except (ValidationError, RewardstreamError, ValueError) as exc:
            if self.metrics:
                self.metrics.rejected.labels(kind).inc()
            self.on_reject(Rejected(kind, " ".join(str(exc).split())[:500], raw))
            return None
        return tracker

    def snapshot_job(self, run_id: str) -> Callable[[], Snapshot]:
        """Copy the run's state now (cheap) and return the expensive build, to run elsewhere.

        The copy makes the snapshot consistent while ingestion continues on the live state.
        Raises KeyError for an unknown run.
        """
        tracker = self.runs[run_id]
        state, spill, paths = tracker.state.copy(), tracker.spill, self.paths(tracker)

        def build() -> Snapshot:
            profile = build_profile(state, allow_partial=True)
            chunks = render_files(profile, spill.sample)
            files = {p.name: b"".join(c) for p, c in zip(paths, chunks, strict=True)}
            return Snapshot(run_id, state.num_results, state.num_inputs, files)

        return build

    def paths(self, tracker: RunTracker) -> ProfilePaths:
        stem = tracker.started.output_stem if tracker.started else "rollouts"
        return ProfilePaths.next_to(self.output_dir / tracker.run_id / f"{stem}.jsonl")

    def maybe_finish(self, tracker: RunTracker) -> ProfilePaths | None:
        """Write the final profile once the run is complete or declared finished."""
        if tracker.done or not (tracker.complete or tracker.finished):
            return None
        partial = not tracker.complete
        if partial:
            log.warning(
                "run %s finished incomplete (%d of %s rollouts): writing a partial profile",
                tracker.run_id,
                tracker.rollouts,
                tracker.started.expected_rollouts if tracker.started else "?",
            )
        paths = self.paths(tracker)
        paths.reward_profiling.parent.mkdir(parents=True, exist_ok=True)
        tracker.done = True
        try:
            write_profile(tracker.profile(allow_partial=partial), paths, tracker.spill.sample)
        except RewardstreamError as exc:  # e.g. rollouts without input rows: say so, keep serving
            tracker.error = str(exc)
            log.error("run %s: no final profile: %s", tracker.run_id, exc)
            return None
        log.info("run %s: final profile written to %s", tracker.run_id, paths.reward_profiling)
        return paths
