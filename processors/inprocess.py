"""The embedded default: the streaming pipeline in one process, with no broker.

Events go from the file readers straight into the same :class:`Pipeline` the Kafka processor
uses, in the order a single-partition topic would deliver them, so the files it writes are the
ones the Kafka deployment writes (and ``ng_reward_profile`` writes).
"""

from __future__ import annotations

from pathlib import Path

from processors.pipeline import Pipeline, Rejected
from producers.events import input_events, rollout_events
from rewardstream.contract import RunFinished, RunStarted, encode
from rewardstream.errors import InputError
from sinks.files import ProfilePaths

__all__ = ["stream_files"]


def stream_files(inputs: Path, rollouts: Path, output_dir: Path, run_id: str) -> ProfilePaths:
    """Stream a collection's files through the pipeline; returns where the profile went."""
    rejected: list[Rejected] = []
    with Pipeline(output_dir, on_reject=rejected.append) as pipeline:
        n_inputs = 0
        for event in input_events(inputs, run_id):
            pipeline.handle(event.kind, event.value)
            n_inputs += 1
        started = RunStarted(run_id=run_id, expected_rollouts=n_inputs, output_stem=rollouts.stem)
        pipeline.handle("control", encode(started))
        for event in rollout_events(rollouts, run_id):
            pipeline.handle(event.kind, event.value)
        run = pipeline.handle("control", encode(RunFinished(run_id=run_id)))
        if rejected:
            raise InputError(f"event rejected ({rejected[0].reason}): {rejected[0].detail}")
        assert run is not None
        paths = pipeline.maybe_finish(run)
        if paths is None:
            raise InputError(f"run {run_id}: no profile written: {run.error}")
        return paths
