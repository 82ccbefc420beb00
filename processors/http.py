"""The processor's HTTP endpoint: health, runs, and consistent partial-profile snapshots.

Binds 127.0.0.1 unless told otherwise. A snapshot is built by forked children from the run's
state as it is at the request, so ingestion keeps running while it is taken; the files stream
back in the response body as they render (the server never writes where a client asks).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from processors.pipeline import Pipeline
from processors.snapshot import SnapshotJob
from sinks.snapshot_wire import MEDIA_TYPE, SnapshotError

__all__ = ["make_app", "serve"]


MAX_BODY_BYTES = 1 << 20


@web.middleware
async def _bounded_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    """No route needs a body, so none reads it and aiohttp's ``client_max_size`` would never
    apply: read (and so bound) any body first; above the limit that is a 413."""
    if request.body_exists:
        await request.read()
    return await handler(request)


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

    async def snapshot(request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        try:
            stream = SnapshotJob(pipeline, run_id).stream()
        except KeyError:
            raise web.HTTPNotFound(text=f"unknown run_id {run_id!r}") from None
        try:
            try:
                head = await anext(stream)
            except SnapshotError as exc:
                raise web.HTTPConflict(text=str(exc)) from None
            response = web.StreamResponse(headers={"Content-Type": MEDIA_TYPE})
            await response.prepare(request)
            await response.write(head)
            async for chunk in stream:
                await response.write(chunk)
            await response.write_eof()
        finally:
            await stream.aclose()  # a client gone mid-stream: stop the children now
        return response

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_bounded_body])
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
