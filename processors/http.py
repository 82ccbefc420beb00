"""The processor's HTTP endpoint: health, runs, and consistent partial-profile snapshots.

Binds 127.0.0.1 unless told otherwise. A snapshot is built in a worker thread from a copy of the
run's state, so ingestion keeps running while it is taken; the files come back in the response
body (the server never writes where a client asks).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from processors.pipeline import SNAPSHOT_MEDIA_TYPE, Pipeline

__all__ = ["make_app", "serve"]


def make_app(pipeline: Pipeline, registry: CollectorRegistry | None) -> web.Application:
    """Health, ``/runs``, snapshots of ``pipeline`` and the metrics in ``registry``."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry) if registry is not None else b""
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_: web.Request) -> web.Response:
        units = {name: unit.position for name, unit in sorted(pipeline.units.items())}
        return web.json_response({"status": "ok", "leader": pipeline.leader, "units": units})

    async def runs(_: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "run_id": t.run_id,
                    "rollouts": t.rollouts,
                    "inputs": t.inputs,
                    "expected_rollouts": t.expected,
                    "finished": t.finished,
                    "done": t.done,
                    "duplicates": t.duplicates,
                }
                for t in pipeline.runs.values()
            ]
        )

    async def snapshot(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        try:
            job = pipeline.snapshot_job(run_id)
        except KeyError:
            raise web.HTTPNotFound(text=f"unknown run_id {run_id!r}") from None
        snap = await asyncio.get_running_loop().run_in_executor(None, job)
        return web.Response(body=snap.to_bytes(), content_type=SNAPSHOT_MEDIA_TYPE)

    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/runs", runs)
    app.router.add_post("/runs/{run_id}/snapshot", snapshot)
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving ``app``; stop with ``await runner.cleanup()``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
