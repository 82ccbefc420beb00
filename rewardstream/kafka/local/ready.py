"""When a broker or cluster is ready for clients (docs/kafka-local.md §Readiness): a Metadata
round trip that lists every broker, from the cluster we started, watched alongside the JVM so
a dead one is reported at once, and a cluster's coordinator topics made before any test needs
them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rewardstream.kafka.local.errors import KafkaLocalError

__all__ = ["READY_TIMEOUT_S", "create_coordinator_topics", "run_sync", "wait_ready"]

READY_TIMEOUT_S = 90.0

T = TypeVar("T")


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_ready(
    bootstrap: str,
    timeout: float = READY_TIMEOUT_S,
    *,
    check: Callable[[], None] | None = None,
    cluster_id: str | None = None,
    brokers: int = 1,
) -> dict[str, Any]:
    """Poll until a Metadata round trip lists ``brokers`` brokers; return the describe_cluster dict.

    ``check`` runs every 0.2 s *alongside* the poll and may raise to abort (e.g. the JVM died),
    so a dead broker is reported at once rather than after a hung admin request.
    ``cluster_id`` guards against answering for a different broker on the same port.
    """
    poller = asyncio.ensure_future(_poll_ready(bootstrap, timeout, cluster_id, brokers))
    if check is None:
        return await poller
    watcher = asyncio.ensure_future(_watch(check))
    try:
        await asyncio.wait({poller, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            watcher.result()  # raises why the broker is gone
        return await poller
    finally:
        for task in (poller, watcher):
            task.cancel()
        await asyncio.gather(poller, watcher, return_exceptions=True)


async def _watch(check: Callable[[], None]) -> None:
    while True:
        check()
        await asyncio.sleep(0.2)


async def _poll_ready(
    bootstrap: str, timeout: float, cluster_id: str | None, brokers: int = 1
) -> dict[str, Any]:
    """A fixed-port KRaft broker opens its socket only once ready, so a cheap TCP probe gates
    the (noisier) admin client."""
    from aiokafka.admin import AIOKafkaAdminClient

    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if await _port_open(host, int(port)):
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
            try:
                await asyncio.wait_for(admin.start(), 5)
                meta: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), 5)
                if cluster_id is not None and meta.get("cluster_id") != cluster_id:
                    raise KafkaLocalError(
                        f"{bootstrap} answers for cluster {meta.get('cluster_id')!r}, "
                        f"not ours ({cluster_id!r}); is another broker on that port?"
                    )
                if len(meta.get("brokers") or ()) >= brokers:
                    return meta
            except KafkaLocalError:
                raise
            except Exception as exc:  # keep polling until the deadline
                last = exc
            finally:
                with contextlib.suppress(Exception):
                    await admin.close()
        await asyncio.sleep(0.2)
    raise KafkaLocalError(f"Kafka at {bootstrap} not ready after {timeout:.0f}s: {last!r}")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run that also works when called from inside a running loop (async fixtures)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def create_coordinator_topics(bootstrap: str, timeout: float) -> None:
    """Make the cluster create ``__consumer_offsets`` and ``__transaction_state`` now.

    Why: Kafka creates them on first use with the configured replication (3), which fails while a
    broker is down; a test that kills a broker before its first group or transaction would hang.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(admin.start(), timeout)
    try:
        for kind in (0, 1):  # group, transaction coordinator
            while True:
                try:
                    await admin.find_coordinator("rewardstream-local-cluster", kind)
                    break
                except Exception as exc:  # not available while the topic is being created
                    if time.monotonic() > deadline:
                        raise KafkaLocalError(f"no coordinator at {bootstrap}: {exc!r}") from exc
                    await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
