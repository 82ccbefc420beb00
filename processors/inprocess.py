"""The embedded default: the streaming pipeline in one process, with no broker.

Events go from the file readers straight into the same :class:`Pipeline` the Kafka processor
uses, in the order a single-partition topic would deliver them, so the files it writes are the
ones the Kafka deployment writes (and ``ng_reward_profile`` writes). This transport owns every
unit, so it finishes runs by writing their files itself (:func:`finish`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rewardstream.contract.events import EventKind, RunFinished, RunStarted, checked, encode
from rewardstream.errors import InputError
from rewardstream.processors.engine.live import of_state
from rewardstream.processors.engine.pipeline import Pipeline, Rejected
from rewardstream.processors.engine.runs import Done, PartView, Run, merge_parts
from rewardstream.producers.events import input_events, rollout_events
from rewardstream.sinks.files import ProfilePaths, write_final

__all__ = ["PipelineSink", "finish", "stream_files"]

log = logging.getLogger(__name__)


def finish(pipeline: Pipeline, run: Run) -> ProfilePaths | None:
    """Write the run's final profile if the engine says it is ready; None otherwise (or when
    it cannot be profiled: the reason is kept in ``run.error``)."""
    if not pipeline.leader or pipeline.remote or not pipeline.ready(run):
        return None
    paths = pipeline.paths(run)
    parts: dict[str, PartView] = dict(run.parts)
    merged = merge_parts((parts[n] for n in sorted(parts)), known_only=True)
    aggregates = pipeline.aggregates(run)
    run.failed(write_final(run.run_id, merged, paths, not run.complete, run.expected, aggregates))
    if run.error is not None:  # say so, keep serving
        return None
    cuts = {n: u.position for n, u in pipeline.units.items()}
    stem = paths.reward_profiling.name.removesuffix("_reward_profiling.jsonl")
    counts = Pipeline.counts_by_unit(parts)
    done = Done(
        run.inputs,
        run.rollouts,
        counts,
        cuts,
        stem,
        agents=of_state(merged.state, run.repeat_major),
        skipped=run.skipped,
    )
    pipeline.mark_final(run.run_id, done)
    log.info("run %s: final profile written to %s", run.run_id, paths.reward_profiling)
    return paths


def stream_files(
    inputs: Path,
    rollouts: Path,
    output_dir: Path,
    run_id: str,
    aggregate_metrics: bool = False,
    answer_key: str | None = None,
) -> ProfilePaths:
    """Stream a collection's files through the pipeline; returns where the profile went
    (with the aggregate and difficulty files when ``aggregate_metrics``)."""
    with Pipeline(output_dir) as pipeline:
        n_inputs = 0
        for event in input_events(inputs, run_id):
            pipeline.handle(event.kind, event.value)
            n_inputs += 1
        started = RunStarted(
            run_id=run_id,
            expected_rollouts=n_inputs,
            output_stem=rollouts.stem,
            aggregate_metrics=aggregate_metrics,
            answer_key=answer_key,
        )
        checked(started)  # a bad run id or stem: BadEvent, which names it
        pipeline.handle("control", encode(started))
        for event in rollout_events(rollouts, run_id, answer_key):
            pipeline.handle(event.kind, event.value)
        run = pipeline.handle("control", encode(RunFinished(run_id=run_id)))
        if rejected := pipeline.take_rejected():
            raise InputError(f"event rejected ({rejected[0].reason}): {rejected[0].detail}")
        assert run is not None
        paths = finish(pipeline, run)
        if paths is None:
            why = run.error or f"{run.rollouts} of {run.expected} rollouts, not finished"
            raise InputError(f"run {run_id}: no profile written: {why}")
        return paths


class PipelineSink:
    """Feeds the in-process :class:`Pipeline` (the embedded transport: no broker): the
    collector's :class:`~rewardstream.producers.publisher.live.EventSink` without Kafka."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.error: str | None = None  # never set: a failure here is raised
        self.run: Run | None = None
        self.paths: ProfilePaths | None = None
        self.rejected: list[Rejected] = []  # every send from the first refuses

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        self.run = self.pipeline.handle(kind, value) or self.run
        self.rejected += self.pipeline.take_rejected()
        if self.rejected:
            first = self.rejected[0]
            raise InputError(f"event rejected by the pipeline ({first.reason}): {first.detail}")
        return True

    async def close(self, finished: bool) -> None:
        if finished and self.run is not None:
            self.paths = finish(self.pipeline, self.run)
            if self.paths is None:
                raise InputError(f"run {self.run.run_id}: no profile written: {self.run.error}")
