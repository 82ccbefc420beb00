"""The live page every processor serves at ``/`` (and ``/runs/<id>`` for a browser), and the
JSON views behind it, ``watch`` and ``GET /runs``.

Each run's view is the whole run (:meth:`~rewardstream.processors.engine.runs.Run.whole`: this
processor's parts and its peers' member records), so any processor of a group shows the same
figures. A sampler keeps each run's history (per agent the reward moments, and the rollouts) every
:data:`HISTORY_EVERY` seconds, bounded (:class:`~rewardstream.processors.engine.live.History`), so a
page opened mid-run still draws the run from its start (from when this processor started). The page
is static (``static/``: HTML, one script, uPlot 1.6.32 with its MIT license: no internet needed) and
is pushed one JSON event per :data:`PUSH_EVERY` seconds over server-sent events
(``GET /events?run=<id>``) while something changed: summaries only, never per-task rows, so it
costs the same with 100,000 tasks as with ten. ``/?compare=A,B`` shows run B against run A
(:meth:`LiveView.compare`, also ``GET /compare/A/B``): per agent both means
with their intervals and the difference's, with its verdict, pushed as the runs are.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from rewardstream.processors.core.difference import Rule, compare_agents
from rewardstream.processors.engine.live import AgentLive, History, sides
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Run

__all__ = [
    "HISTORY_EVERY",
    "PUSH_EVERY",
    "STATIC",
    "LiveView",
    "add_page",
    "page_response",
    "wants_page",
]

STATIC = Path(__file__).with_name("static")
HISTORY_EVERY = 2.0  # seconds between history points of a run (doubling as it grows)
PUSH_EVERY = 1.0  # seconds between pushes to an open page
KEEPALIVE = 15.0  # seconds of silence after which a comment keeps proxies from closing
RATE_WINDOW = 30.0  # seconds of history the rollout rate is measured over


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class LiveView:
    """The JSON views of the runs a pipeline knows, and their histories."""

    def __init__(self, pipeline: Pipeline, rule: Rule | None = None) -> None:
        self.pipeline = pipeline
        self.rule = rule or Rule()  # what a comparison of two runs is judged by
        self.histories: dict[str, History] = {}

    def summary(self, run: Run) -> dict[str, Any]:
        """A run's counts and state (``GET /runs``), with its rate and ETA from the history (a
        stalled run's rate is 0: it has no ETA)."""
        state = self.pipeline.state(run)
        rate = None if run.done else 0.0 if state == "stalled" else self._rate(run.run_id)
        left = (run.expected or 0) - run.rollouts
        return {
            "run_id": run.run_id,
            "rollouts": run.rollouts,
            "inputs": run.inputs,
            "expected_rollouts": run.expected,
            "finished": run.finished,
            "done": run.done,
            # open, stalled, finished, final, evicted (rewardstream.processors.engine.runs.RunState)
            "state": state,
            # whole seconds since its last event, as this processor knows (None once done)
            "last_event_seconds": None if run.done else int(self.pipeline.idle(run)),
            "rate": rate,
            "eta_seconds": left / rate if rate and left > 0 else None,
            # events seen before (a resumed or re-run collection, a redelivery):
            # each counted once, these copies ignored; not an error
            "duplicates_dropped": run.duplicates,
            # events of a held key with other content (conflict dead letters): an error
            "conflicts": run.conflicts,
            # failed attempts the collector reported (retried or not): never results
            "failed_attempts": run.failed_attempts,
            "failure_rate": _share(run.failed_attempts, run.failed_attempts + run.rollouts),
            # events a final record covers, read again after a restart
            "replays_skipped": run.replays,
            # rows an early stop left out, per reason (None: the run did not end early)
            "skipped": run.skipped,
            "stem": self.pipeline.paths(run).reward_profiling.name.removesuffix(
                "_reward_profiling.jsonl"
            ),
        }

    def detail(self, run: Run) -> dict[str, Any]:
        """A run's summary with per agent its whole-run figures (``GET /runs/<id>``)."""
        level = self.pipeline.level
        agents = {a: s.view(level) for a, s in run.whole(time.monotonic()).items()}
        for agent, classes in run.failures.items():
            failed = sum(classes.values())
            shown = agents.setdefault(agent, AgentLive().view(level))
            rollouts = shown["rollouts"]
            shown |= {"failed_attempts": classes, "failure_rate": _share(failed, failed + rollouts)}
        # partitions whose owner said it holds rollouts of the run but sent no summary of them
        # (its member record was too large to carry them): the figures leave those out, unless
        # they are the final record's
        missing = sorted(
            n for n, c in run.foreign.items() if c.rollouts and n not in run.foreign_live
        )
        if run.terminal is not None and run.terminal.agents is not None:
            missing = []
        return self.summary(run) | {"agents": agents, "partitions_missing": missing}

    def runs(self) -> list[dict[str, Any]]:
        return [self.summary(r) for r in self.pipeline.runs.values()]

    def compare(self, baseline: str, candidate: str) -> dict[str, Any]:
        """Run ``candidate`` against run ``baseline``, whole runs, per agent in both
        (:func:`~rewardstream.processors.core.difference.compare_agents`), with each run's
        summary (None, and its id in ``unknown``, for a run this processor does not know)."""
        ids = {"baseline": baseline, "candidate": candidate}
        runs = {role: self.pipeline.runs.get(run_id) for role, run_id in ids.items()}
        a, b = ({} if r is None else sides(r.whole(time.monotonic(), False)) for r in runs.values())
        shown = {role: None if run is None else self.summary(run) for role, run in runs.items()}
        unknown = [ids[role] for role, run in runs.items() if run is None]
        return compare_agents(a, b, self.rule) | shown | {"unknown": unknown}

    def _rate(self, run_id: str) -> float | None:
        """Rollouts per second over the last :data:`RATE_WINDOW` seconds of history."""
        history = self.histories.get(run_id)
        if history is None or len(history.points) < 2:
            return None
        last = history.points[-1]
        if time.time() - last["at"] > RATE_WINDOW:
            return 0.0  # nothing came for a while: points are only kept when rollouts came
        first = next(
            (p for p in history.points if last["at"] - p["at"] <= RATE_WINDOW), history.points[-2]
        )
        if first is last:
            first = history.points[-2]
        span = last["at"] - first["at"]
        return (last["rollouts"] - first["rollouts"]) / span if span > 0 else None

    def sample(self) -> None:
        """A history point for each run whose rollouts changed since its last one."""
        now, wall = time.monotonic(), time.time()
        for run in self.pipeline.runs.values():
            if run.terminal is not None and run.terminal.evicted:
                continue
            history = self.histories.setdefault(run.run_id, History(HISTORY_EVERY))
            last = history.points[-1] if history.points else {}
            if (last.get("rollouts"), last.get("failed")) == (run.rollouts, run.failed_attempts):
                continue
            agents = {}
            for agent, live in run.whole(now, figures=False).items():
                r, interval = live.reward, live.interval(self.pipeline.level)
                agents[agent] = [
                    live.rollouts,
                    *(v if math.isfinite(v) else None for v in (r.mean, r.std, r.min, r.max)),
                    interval["lower"],
                    interval["upper"],
                ]
            point = {"rollouts": run.rollouts, "failed": run.failed_attempts, "agents": agents}
            history.add(wall, point)
        for gone in set(self.histories) - set(self.pipeline.runs):
            del self.histories[gone]

    def history(self, run_id: str, after: float) -> list[dict[str, Any]]:
        history = self.histories.get(run_id)
        return [] if history is None else [p for p in history.points if p["at"] > after]


def wants_page(request: web.Request) -> bool:
    """A browser navigating (to ``/runs/<id>``) rather than a client asking for JSON."""
    return "text/html" in request.headers.get("Accept", "")


def page_response() -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def _pair(text: str) -> tuple[str, str] | None:
    """``A,B`` of ``?compare=A,B`` (run ids have no comma); anything else, no comparison."""
    baseline, comma, candidate = text.partition(",")
    return (baseline, candidate) if comma and baseline and candidate else None


async def _sampling(view: LiveView) -> None:
    while True:
        view.sample()
        await asyncio.sleep(HISTORY_EVERY)


def add_page(app: web.Application, view: LiveView) -> None:
    """Serve the page, its assets and its events on ``app``, and sample histories while it
    runs. Event streams end when the app shuts down: an open page never holds a stop back
    (aiohttp would wait for the handler, a minute and more)."""
    closing = asyncio.Event()

    async def close_streams(_: web.Application) -> None:
        closing.set()

    async def page(_: web.Request) -> web.FileResponse:
        return page_response()

    async def events(request: web.Request) -> web.StreamResponse:
        """Server-sent events: one ``data:`` JSON per push while it changed, a comment when
        idle. The first push carries the selected run's whole history, later ones what came
        since."""
        run_id = request.query.get("run") or None
        pair = _pair(request.query.get("compare", ""))
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: do not hold the events back
            }
        )
        await response.prepare(request)
        last, quiet, after = b"", 0.0, -math.inf
        with contextlib.suppress(ConnectionResetError):
            while not closing.is_set():
                run = view.pipeline.runs.get(run_id) if run_id else None
                points = view.history(run_id, after) if run_id else []
                body = orjson.dumps(
                    {
                        "runs": view.runs(),
                        "level": view.pipeline.level,  # of the agents' intervals
                        "run": view.detail(run) if run is not None else None,
                        "history": points,
                        "compare": None if pair is None else view.compare(*pair),
                    }
                )
                if body != last or points:
                    await response.write(b"data: " + body + b"\n\n")
                    last, quiet = body, 0.0
                    if points:
                        after = points[-1]["at"]
                elif quiet >= KEEPALIVE:
                    await response.write(b": idle\n\n")
                    quiet = 0.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closing.wait(), PUSH_EVERY)
                quiet += PUSH_EVERY
        return response

    async def compare(request: web.Request) -> web.Response:
        """The comparison as JSON (404 naming an unknown run)."""
        shown = view.compare(request.match_info["baseline"], request.match_info["candidate"])
        if shown["unknown"]:
            raise web.HTTPNotFound(text=f"unknown run_id {shown['unknown'][0]!r}")
        return web.json_response(shown, dumps=lambda v: orjson.dumps(v).decode())

    async def sampler(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_sampling(view))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.router.add_get("/", page)
    app.router.add_get("/events", events)
    app.router.add_get("/compare/{baseline}/{candidate}", compare)
    app.router.add_static("/static", STATIC)
    app.cleanup_ctx.append(sampler)
    app.on_shutdown.append(close_streams)
