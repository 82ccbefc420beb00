"""The processor's HTTP face wired in: its endpoints (:mod:`rewardstream.processors.http`)
served for peers, snapshots, the page and metrics, and the URL peers are told to use."""

from __future__ import annotations

import contextlib
import logging

from prometheus_client import CollectorRegistry

from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.core.difference import Rule
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import Peers, make_app, serve
from rewardstream.processors.http.snapshot import SnapshotLimits

__all__ = ["open_endpoint"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name


async def open_endpoint(
    stack: contextlib.AsyncExitStack,
    pipeline: Pipeline,
    registry: CollectorRegistry,
    peers: Peers,
    limits: SnapshotLimits | None,
    security: HttpSecurity,
    http: tuple[str, int] | None,
    idle_timeout: float,
    advertise: str | None,
    rule: Rule,
) -> str:
    """Serve the endpoints on ``http`` (host, port; default 127.0.0.1 on a free port: peers ask
    every processor for parts) until ``stack`` closes; returns the URL peers fetch parts from
    (``advertise``, or the address bound); the page compares runs by ``rule``."""
    app = make_app(pipeline, registry, peers, limits, security=security, rule=rule)
    host, port = http or ("127.0.0.1", 0)
    runner, bound = await serve(app, host, port, idle_timeout, security=security)
    stack.push_async_callback(runner.cleanup)
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    scheme = security.scheme
    log.info("serving snapshots, parts and metrics on %s://%s:%d", scheme, _url_host(host), bound)
    return advertise or f"{scheme}://{_url_host(shown)}:{bound}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
