"""What every server shares: NeMo Gym's config layout, health routes, JSON I/O and start-up.

NeMo Gym starts each server as ``NEMO_GYM_CONFIG_DICT=<yaml> NEMO_GYM_CONFIG_PATH=<name>
python <entrypoint>`` (docs/nemo-gym-compat.md §Head server); :func:`serve_from_env` is the
receiving end. A server finds the others by name in that config
(``<name>.<type>.<impl>.{host,port}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar

import orjson
import uvloop
import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

__all__ = [
    "DEFAULT_HOST",
    "MAX_REQUEST_BYTES",
    "SERVER_TYPES",
    "Handler",
    "ServerSpec",
    "base_app",
    "client_session",
    "json_body",
    "json_response",
    "redacted",
    "request_limit",
    "resolve_url",
    "serve_from_env",
    "server_specs",
    "with_closing",
]

SERVER_TYPES = (
    "responses_api_models",
    "resources_servers",
    "responses_api_agents",
    "environment_servers",
)
HEALTH_PATHS = ("/", "/livez", "/readyz", "/healthz", "/health")
_SECRET_SUFFIXES = ("api_key", "apikey", "secret", "password", "token")  # not "max_tokens"
DEFAULT_HOST = "127.0.0.1"  # a server listens beyond loopback only when its config says so
# Bodies are read whole into memory: 64 MiB is far above any text context (1M tokens is ~4 MB)
# and bounds what one request can take; ``max_request_bytes`` in a server's config raises it.
MAX_REQUEST_BYTES = 64 << 20

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger(__name__)


class ServerSpec(NamedTuple):
    """One server instance of a config: ``<name>: {<server_type>: {<impl>: config}}``."""

    name: str
    server_type: str
    impl: str
    config: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://{self.config['host']}:{self.config['port']}"


def server_specs(config: Mapping[str, Any]) -> list[ServerSpec]:
    """Every server instance in a merged config, in config order."""
    specs = []
    for name, value in config.items():
        if isinstance(value, dict) and len(value) == 1:
            ((server_type, impls),) = value.items()
            if server_type in SERVER_TYPES and isinstance(impls, dict) and len(impls) == 1:
                ((impl, cfg),) = impls.items()
                specs.append(ServerSpec(name, server_type, impl, cfg))
    return specs


def resolve_url(config: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """The base URL of the server a ``{type, name}`` reference points to."""
    for spec in server_specs(config):
        if spec.name == ref.get("name") and spec.server_type == ref.get("type"):
            return spec.url
    raise KeyError(f"no server {ref.get('name')!r} of type {ref.get('type')!r} in the config")


def redacted(value: Any) -> Any:
    """``value`` with every secret-looking key's value replaced, for anything printed or served."""
    if isinstance(value, dict):
        return {
            k: "***" if v and str(k).lower().endswith(_SECRET_SUFFIXES) else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or a 422 like FastAPI's validation errors."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise web.HTTPUnprocessableEntity(
            body=orjson.dumps({"detail": f"invalid JSON: {exc}"}), content_type="application/json"
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPUnprocessableEntity(
            body=orjson.dumps({"detail": "the body must be a JSON object"}),
            content_type="application/json",
        )
    return body


def client_session() -> ClientSession:
    """A pooled session for calls to outside endpoints (no per-host connection cap)."""
    return ClientSession(
        connector=TCPConnector(limit=0),
        timeout=ClientTimeout(total=None),
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
    )


def request_limit(spec: ServerSpec) -> int:
    """The largest request body ``spec``'s server reads (larger ones get a 413)."""
    return int(spec.config.get("max_request_bytes") or MAX_REQUEST_BYTES)


def base_app(
    posts: Mapping[str, Handler] | None = None, max_request_bytes: int = MAX_REQUEST_BYTES
) -> web.Application:
    """An app answering NeMo Gym's health paths with ``{"status":"ok"}``, and ``posts``; a body
    above ``max_request_bytes`` is refused with a 413 (every handler reads through
    :func:`json_body`, which enforces it)."""
    app = web.Application(client_max_size=max_request_bytes)

    async def health(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    for path in HEALTH_PATHS:
        app.router.add_get(path, health)
    for path, handler in (posts or {}).items():
        app.router.add_post(path, handler)
    return app


class _Closable(Protocol):
    async def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closable)


def with_closing(app: web.Application, key: web.AppKey[_C], make: Callable[[], _C]) -> None:
    """Give ``app`` a ``make()`` client under ``key``, made on start-up and closed on clean-up."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[key] = make()
        yield
        await app[key].close()

    app.cleanup_ctx.append(ctx)


def serve_from_env(build: Callable[[ServerSpec, dict[str, Any]], web.Application]) -> None:
    """Run the server named by ``NEMO_GYM_CONFIG_PATH`` from ``NEMO_GYM_CONFIG_DICT``.

    It also exits when its parent dies, so a killed ``ng_run`` never leaves servers behind.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    spec = next((s for s in server_specs(config) if s.name == name), None)
    if spec is None:
        raise SystemExit(f"no server named {name!r} in NEMO_GYM_CONFIG_DICT")
    uvloop.run(_serve(build(spec, config), spec))


async def _serve(app: web.Application, spec: ServerSpec) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        host = spec.config.get("host") or DEFAULT_HOST  # None or "" would mean every interface
        await web.TCPSite(runner, host, int(spec.config["port"])).start()
        log.info("%s (%s/%s) serving on %s", spec.name, spec.server_type, spec.impl, spec.url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        parent = os.getppid()
        while parent == os.getppid():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                break
    finally:
        await runner.cleanup()
