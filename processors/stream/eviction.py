"""Eviction: a run that never finishes (no event for ``--evict-after`` seconds) is ended by the
leader with an ``evicted`` record, so that no processor holds it forever."""

from __future__ import annotations

import logging

from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.stream.finals import Finals

__all__ = ["Eviction"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

_EVERY = 1.0  # seconds between two looks for idle runs


class Eviction:
    """Owns the eviction timer: at most once a :data:`_EVERY` seconds, the leader evicts the
    open runs this processor has read no event of for ``after`` seconds (by its own clock:
    :meth:`Pipeline.idle_runs`) and that are not being finished."""

    def __init__(self, pipeline: Pipeline, finals: Finals, after: float) -> None:
        self.pipeline, self.finals, self.after = pipeline, finals, after
        self._last = 0.0  # time.monotonic() of the last look (see start)

    def start(self, now: float) -> None:
        """The timer counts from ``now`` (the consume loop's start)."""
        self._last = now

    async def tick(self, now: float) -> None:
        if now - self._last >= _EVERY:
            await self._evict_idle()
            self._last = now

    async def _evict_idle(self) -> None:
        if not self.pipeline.leader:
            return
        for run in self.pipeline.idle_runs(self.after):
            if run.run_id in self.finals.finishing:
                continue
            log.warning(
                "run %s: no event for %.0fs, evicting it unfinished (%d rollouts held)",
                run.run_id,
                self.after,
                run.rollouts,
            )
            await self.finals.evict(run)
