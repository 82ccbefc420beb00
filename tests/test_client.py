"""The servers' JSON client against raw HTTP/1.1 replies: lengths, chunks, close, stale sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from rewardstream.gym_servers.client import JsonClient, UpstreamError
from tests.gym import serve

REPLIES = {
    "/length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"
    b'{"a":1}\n',
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4\r\n{"a"\r\n3;ext=1\r\n:2}\r\n0\r\n\r\n',
    "/close": b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"a":3}',
    "/bye": b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"a":4}',  # then the server hangs up
    "/error": b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
}


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[str, list[int]]]:
    """A socket server answering canned bytes by path; counts its connections."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                path = head.split(b" ")[1].decode()
                writer.write(REPLIES[path])
                await writer.drain()
                if path in ("/close", "/bye"):
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()
        await server.wait_closed()


async def test_reply_framings(raw_server: tuple[str, list[int]]) -> None:
    url, connections = raw_server
    client = JsonClient()
    try:
        assert await client.post(f"{url}/length", {}) == {"a": 1}
        assert await client.post(f"{url}/chunked", {}) == {"a": 2}
        assert await client.post(f"{url}/length", {}) == {"a": 1}
        assert len(connections) == 1  # kept alive across replies
        assert await client.post(f"{url}/close", {}) == {"a": 3}
        assert await client.post(f"{url}/length", {}) == {"a": 1}
        assert len(connections) == 2  # a new one after the server closed
        with pytest.raises(UpstreamError, match="HTTP 503: busy"):
            await client.post(f"{url}/error", {})
    finally:
        await client.close()


async def test_a_stale_kept_alive_connection_is_replaced(
    raw_server: tuple[str, list[int]],
) -> None:
    url, connections = raw_server
    client = JsonClient()
    try:
        assert await client.post(f"{url}/bye", {}) == {"a": 4}  # kept, but closed by the server
        await asyncio.sleep(0.05)
        assert await client.post(f"{url}/length", {}) == {"a": 1}
        assert len(connections) == 2
    finally:
        await client.close()


async def test_refused_is_an_os_error() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    runner, url = await serve({"/x": ok})
    await runner.cleanup()
    client = JsonClient()
    with pytest.raises(OSError):
        await client.post(f"{url}/x", {})
    await client.close()
