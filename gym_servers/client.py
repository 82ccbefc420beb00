"""JSON POSTs over kept-alive HTTP/1.1 connections: the agent's calls and the collector's.

Why not aiohttp's client: one rollout makes four calls (the collector's ``/run``, then the
agent's ``seed_session``, model and ``verify``), and aiohttp's client spends ~110 us of CPU per
call (request objects, cookie jar, timers, tracing), which on two cores kept collection far
below its 2,000 rollouts/s target. This client writes a request in one piece and reads the
reply with one ``readuntil`` for the head and one read for the body: ~25 us. It speaks what any
plain HTTP/1.1 JSON server answers (``Content-Length`` or chunked bodies, ``Connection:
close``), over http:// only; calls to outside endpoints (the proxy model server) use aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import orjson

__all__ = ["JsonClient", "UpstreamError"]

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class UpstreamError(Exception):
    """Another server answered with an error status."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:500]}")
        self.status = status


@lru_cache(maxsize=256)
def _target(url: str) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http:// URLs are supported here, not {url!r}")
    port = parts.port or 80
    head = f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.hostname}:{port}\r\n"
    head += "Content-Type: application/json\r\nContent-Length: "
    return parts.hostname, port, head.encode()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


class JsonClient:
    """A pool of idle connections per (host, port); ``post`` returns the decoded JSON reply."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def post(self, url: str, body: Any) -> Any:
        """POST ``body`` as JSON; the decoded reply, or :class:`UpstreamError` for a 4xx/5xx."""
        return orjson.loads(await self._ok(url, body))

    async def relay(self, url: str, body: Any) -> orjson.Fragment:
        """As :meth:`post`, but the reply is not decoded: for passing it on as it came."""
        return orjson.Fragment(await self._ok(url, body))

    async def _ok(self, url: str, body: Any) -> bytes:
        status, raw = await self.request(url, orjson.dumps(body))
        if status >= 400:
            raise UpstreamError(url, status, raw.decode(errors="replace"))
        return raw

    async def request(self, url: str, payload: bytes) -> tuple[int, bytes]:
        """POST JSON bytes; the reply's status and body. Connection problems raise OSError
        (refused, reset) or :class:`asyncio.IncompleteReadError` (closed mid-reply)."""
        host, port, head = _target(url)
        request = b"%s%d\r\n\r\n%s" % (head, len(payload), payload)
        idle = self._idle.setdefault((host, port), [])
        while idle:  # a kept-alive connection the server may have closed meanwhile
            conn = idle.pop()
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                return await self._exchange(conn, request, idle)
        conn = await asyncio.open_connection(host, port)
        return await self._exchange(conn, request, idle)

    @staticmethod
    async def _exchange(conn: _Conn, request: bytes, idle: list[_Conn]) -> tuple[int, bytes]:
        reader, writer = conn
        keep = False
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            length, chunked, keep = -1, False, True
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif name == b"connection":
                    keep = b"close" not in value.lower()
            if chunked:
                raw = await _read_chunked(reader)
            elif length >= 0:
                raw = await reader.readexactly(length)
            else:
                raw, keep = await reader.read(), False
        except BaseException:
            keep = False
            raise
        finally:
            if keep:
                idle.append(conn)
            else:
                writer.close()
        return status, raw

    async def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()
