"""The processor's HTTP endpoint: health, runs, metrics, snapshots, and parts for its peers.

Binds 127.0.0.1 unless told otherwise. A snapshot covers the whole run: the parts of units
owned elsewhere are fetched from their owners (``GET /parts/<run_id>``, found through the
group's member records), then forked children build the profile from the state as it is at
that moment, so ingestion keeps running while it is taken; the response is sent once it is
whole, with its length (the server never writes where a client asks). A snapshot answers
within a bound (else 503 naming what did not answer); requests for a run at the same positions
share one build, and beyond the limits the answer is 429 with ``Retry-After``
(:class:`rewardstream.processors.http.snapshot.Snapshots`).

Beyond loopback it serves only with a bearer token (:mod:`rewardstream.processors.http.auth`), over
TLS when given a certificate (:mod:`rewardstream.infra.http_security`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import tempfile
import zipfile
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rewardstream.errors import InputError, RewardstreamError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.core.difference import Rule
from rewardstream.processors.engine.partwire import PART_LIST_TYPE, encode_answer
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import PartView, Run
from rewardstream.processors.http.auth import require_token
from rewardstream.processors.http.page import LiveView, add_page, page_response, wants_page
from rewardstream.processors.http.snapshot import (
    Busy,
    SnapshotJob,
    SnapshotLimits,
    Snapshots,
    SnapshotUnavailable,
)
from rewardstream.sinks.files import ProfilePaths
from rewardstream.sinks.snapshot_wire import CHUNK, MEDIA_TYPE, SnapshotError, receive

__all__ = ["IDLE_TIMEOUT", "Peers", "make_app", "serve"]

log = logging.getLogger(__name__)


MAX_BODY_BYTES = 1 << 20
# seconds a connection may stay idle; above the 15 s its peers' aiohttp clients keep theirs,
# so that they close first and never send on a connection being closed
IDLE_TIMEOUT = 30.0


class Peers(Protocol):
    """What the endpoint needs of the processor around it (none in process)."""

    def identity(self) -> dict[str, str]: ...

    def gather(
        self, run_id: str, at_least: dict[str, int] | None = None, timeout: float = ...
    ) -> Awaitable[tuple[dict[str, PartView], dict[str, int]]]: ...

    def final_files(self, run_id: str) -> Awaitable[ProfilePaths]: ...


@web.middleware
async def _bounded_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    """No route needs a body, so none reads it and aiohttp's ``client_max_size`` would never
    apply: read (and so bound) any body first; above the limit that is a 413."""
    if request.body_exists:
        await request.read()
    return await handler(request)


def make_app(
    pipeline: Pipeline,
    registry: CollectorRegistry | None,
    peers: Peers | None = None,
    limits: SnapshotLimits | None = None,
    *,
    security: HttpSecurity | None = None,
    rule: Rule | None = None,
) -> web.Application:
    """Health, ``/runs``, snapshots and parts of ``pipeline``, the metrics in ``registry``;
    snapshots bounded by ``limits``; behind ``security``'s token if it has one; comparisons of
    two runs judged by ``rule``."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry) if registry is not None else b""
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_: web.Request) -> web.Response:
        units = {name: unit.position for name, unit in sorted(pipeline.units.items())}
        return web.json_response({"status": "ok", "leader": pipeline.leader, "units": units})

    view = LiveView(pipeline, rule or Rule())

    async def runs(_: web.Request) -> web.Response:
        return web.json_response(view.runs(), dumps=_dumps)

    async def run(request: web.Request) -> web.StreamResponse:
        """One run's summary with per agent its whole-run figures (the page, for a browser)."""
        if wants_page(request):
            return page_response()
        return web.json_response(view.detail(_known(request)), dumps=_dumps)

    async def parts(request: web.Request) -> web.Response:
        """This processor's parts of a run, for a peer's snapshot or final profile, with the
        position of every unit it owns (a unit without a part of the run still counts)."""
        run_id = request.match_info["run_id"]
        mine = peers.identity() if peers is not None else {}
        for key, value in mine.items():
            if request.query.get(key) != value:
                raise web.HTTPConflict(
                    text=f"parts asked for {key} {request.query.get(key)!r}; this processor's "
                    f"{key} is {value!r}"
                )
        run = pipeline.runs.get(run_id)
        held = {} if run is None or run.terminal is not None else run.parts
        positions = {name: unit.position for name, unit in pipeline.units.items()}
        identity = {**mine, "run_id": run_id}
        body = encode_answer(
            positions, [(name, part, identity) for name, part in sorted(held.items())]
        )
        return web.Response(body=body, headers={"Content-Type": PART_LIST_TYPE})

    limits = limits or SnapshotLimits()
    snapshots = Snapshots(limits, pipeline.state_dir, registry)

    async def build(run: Run, path: Path) -> None:
        """The run's snapshot (its final files once done) into ``path``, whole, within the
        bound; errors are :class:`RewardstreamError`, said in one line."""
        received: dict[str, PartView] = {}
        offsets: dict[str, int] = {}
        final = None
        deadline = asyncio.get_running_loop().time() + limits.timeout
        try:
            if run.terminal is not None and peers is not None:
                async with asyncio.timeout_at(deadline):
                    final = await peers.final_files(run.run_id)
            elif peers is not None:
                received, offsets = await peers.gather(run.run_id, timeout=limits.timeout)
            async with asyncio.timeout_at(deadline):
                await SnapshotJob(pipeline, run.run_id, received, offsets, final).spool(path)
        except TimeoutError:
            raise SnapshotUnavailable(
                f"not built within {limits.timeout:g} s (--snapshot-timeout)"
            ) from None

    @contextlib.asynccontextmanager
    async def built(run: Run) -> AsyncIterator[Path]:
        """The run's snapshot wire, shared with the requests for it at the same positions;
        errors are HTTP errors (none sent yet)."""
        key = (run.run_id, run.terminal is not None, tuple(sorted(pipeline.positions().items())))
        try:
            async with snapshots.take(key, functools.partial(build, run)) as path:
                yield path
        except Busy as exc:
            raise web.HTTPTooManyRequests(
                text=f"snapshot of run {run.run_id!r}: {exc}; try again later",
                headers={"Retry-After": str(exc.retry_after)},
            ) from None
        except SnapshotError as exc:
            raise web.HTTPConflict(text=str(exc)) from None
        except RewardstreamError as exc:
            raise web.HTTPServiceUnavailable(
                text=f"snapshot of run {run.run_id!r}: {exc}"
            ) from None

    async def snapshot(request: web.Request) -> web.StreamResponse:
        run = _known(request)
        async with built(run) as path:
            return await _send_file(request, path, MEDIA_TYPE, limits.timeout)

    async def download(request: web.Request) -> web.StreamResponse:
        """The page's download button: the snapshot (the final files once done) as one zip."""
        run = _known(request)
        kind = "final" if run.terminal is not None else "snapshot"
        with tempfile.TemporaryDirectory(dir=pipeline.state_dir, prefix=".download-") as tmp:
            async with built(run) as wire:
                try:
                    archive = await asyncio.to_thread(_zip, wire, Path(tmp), run.run_id)
                except RewardstreamError as exc:
                    raise web.HTTPServiceUnavailable(text=str(exc)) from None
            name = f"{view.summary(run)['stem']}_{kind}.zip"
            disposition = {"Content-Disposition": f'attachment; filename="{name}"'}
            return await _send_file(
                request, archive, "application/zip", limits.timeout, disposition
            )

    def _known(request: web.Request) -> Run:
        run_id = request.match_info["run_id"]
        found = pipeline.runs.get(run_id)
        if found is None:
            raise web.HTTPNotFound(text=f"unknown run_id {run_id!r}")
        return found

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_bounded_body])
    app.router.add_get("/healthz", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/runs", runs)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/parts/{run_id}", parts)
    app.router.add_post("/runs/{run_id}/snapshot", snapshot)
    app.router.add_get("/runs/{run_id}/download", download)
    add_page(app, view)
    if security is not None and security.token is not None:
        require_token(app, security)
    return app


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


_SLOWEST = 1 << 20  # bytes/s: a client reading slower than this (or not at all) is cut off


async def _send_file(
    request: web.Request,
    path: Path,
    content_type: str,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """``path`` as the response, with its length: a client that gets fewer bytes knows the
    body was cut short. A client too slow to read it within ``timeout`` plus a second per MiB
    is cut off, so that it holds no request slot for ever."""
    size = path.stat().st_size
    response = web.StreamResponse(
        headers={"Content-Type": content_type, "Content-Length": str(size), **(headers or {})}
    )
    try:
        async with asyncio.timeout(timeout + size / _SLOWEST):
            await response.prepare(request)
            with path.open("rb") as fh:
                while chunk := await asyncio.to_thread(fh.read, CHUNK):
                    await response.write(chunk)
            await response.write_eof()
    except (ConnectionResetError, TimeoutError) as exc:  # aiohttp's ClientConnectionResetError
        log.info("%s: the client went away or read too slowly (%r)", request.path, exc)
        if request.transport is not None:
            request.transport.close()
    return response


def _zip(wire: Path, folder: Path, run_id: str) -> Path:
    """The files of a snapshot stream saved in ``wire``, as ``folder/files.zip``."""
    files = folder / "files"
    with wire.open("rb") as fh:
        head = receive(fh, files, f"snapshot of run {run_id!r}")
    archive = folder / "files.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for name in head.files:
            out.write(files / name, name)
    return archive


class _ClientFaults(logging.Filter):
    """aiohttp logs a traceback at ERROR for every request a client botches (malformed, cut
    off): one INFO line says as much, and the log keeps its tracebacks for real faults."""

    def filter(self, record: logging.LogRecord) -> bool:
        fault = record.exc_info[1] if record.exc_info else None
        if isinstance(fault, HttpProcessingError | ConnectionResetError):
            detail = " ".join(str(fault).split())
            record.msg, record.args = f"{record.getMessage()}: {type(fault).__name__} {detail}", ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_CLIENT_FAULTS = _ClientFaults()


async def serve(
    app: web.Application,
    host: str,
    port: int,
    idle_timeout: float = IDLE_TIMEOUT,
    *,
    security: HttpSecurity | None = None,
) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` (port 0: a free one), over TLS if ``security`` has a certificate;
    beyond loopback only with a token (or ``--insecure-public``). Returns the runner (stop it
    with ``await runner.cleanup()``) and the port bound. A connection idle for
    ``idle_timeout`` seconds (none sent yet, or between two requests) is closed: idle sockets
    cannot pile up."""
    security = security or HttpSecurity()
    security.check_bind(host, port)
    context = security.server_context()
    logging.getLogger("aiohttp.server").addFilter(_CLIENT_FAULTS)  # once: the same filter
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    try:
        await site.start()
    except OSError as exc:  # a busy port, an address not on this host
        await runner.cleanup()
        raise InputError(f"--http {host}:{port}: {exc.strerror or exc}") from None
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
