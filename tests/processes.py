"""Real processes and topics for the stream tests: ``rewardstream stream`` as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import RequestTimedOutError, for_code
from aiokafka.structs import OffsetAndMetadata

from rewardstream.contract.events import EventKind, Topics, task_key
from rewardstream.infra.http_security import HttpSecurity, open_url
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.local import free_port
from rewardstream.processors.http.server import serve
from rewardstream.sinks.topics.profiles import ensure_topics

__all__ = [
    "Processor",
    "committed",
    "create_topics",
    "make_topics",
    "read_topic",
    "run_detail",
    "send_events",
    "trickle",
]


async def make_topics(
    bootstrap: str, topics: Topics, partitions: int, replication: int = 1
) -> None:
    """Data topics with ``partitions`` partitions, control with one (its order matters), each
    with ``replication`` replicas (3 on a three-broker cluster, so that one may die), made by
    :func:`create_topics`."""
    shape = {topics.inputs: partitions, topics.rollouts: partitions, topics.control: 1}
    await create_topics(bootstrap, shape, replication)


async def create_topics(bootstrap: str, shape: dict[str, int], replication: int = 1) -> None:
    """Topics by name with their partition counts; returns once the broker lists them so, each
    partition with a leader.

    A refused creation raises, and so does a topic found in another shape: a creation that
    times out on a loaded broker may be overtaken by a client's metadata request, which
    auto-creates the topic with the broker's ``num.partitions``, and a test would then wait for
    partitions that never come."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [
                NewTopic(t, num_partitions=n, replication_factor=replication)
                for t, n in shape.items()
            ]
        )
        for name, code, *_ in response.topic_errors:  # a timeout may still create it: see below
            if code not in (0, RequestTimedOutError.errno):
                raise RuntimeError(f"topic {name!r} not created: {for_code(code).__name__}")
        listed: dict[str, list[dict[str, Any]]] = {}
        try:
            async with asyncio.timeout(120):  # a bound, not a pace: the loop awaits the broker
                while True:
                    listed = {t["topic"]: t["partitions"] for t in await admin.describe_topics()}
                    for name, n in shape.items():
                        if listed.get(name) and len(listed[name]) != n:
                            raise RuntimeError(
                                f"topic {name!r} has {len(listed[name])} partitions, not {n}: "
                                "created by another client first"
                            )
                    if all(
                        len(listed.get(t, ())) == n and all(p["leader"] >= 0 for p in listed[t])
                        for t, n in shape.items()
                    ):
                        return
                    await asyncio.sleep(0.05)
        except TimeoutError:
            mine = {t: listed.get(t) for t in shape}
            raise RuntimeError(f"topics not listed in their shape within 120 s: {mine}") from None
    finally:
        await admin.close()


async def read_topic(
    bootstrap: str, topic: str, at_least: int = 0, timeout: float = 60.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of every partition of ``topic``, up to the end offsets taken before it is
    read (once they hold ``at_least`` records in all); an absent topic holds none.

    The partitions come from a metadata request made here: a consumer's own metadata may not
    know a topic created after it started (``partitions_for_topic`` is None then), and a
    reader trusting it reads nothing and reports an empty topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=10_000
    )
    await admin.start()
    await consumer.start()
    try:
        async with asyncio.timeout(timeout):
            while True:
                tps: list[TopicPartition] = []
                if topic in await admin.list_topics():
                    (desc,) = await admin.describe_topics([topic])
                    tps = [TopicPartition(topic, p["partition"]) for p in desc["partitions"]]
                ends = await consumer.end_offsets(tps) if tps else {}
                if sum(ends.values()) >= at_least:
                    break
                await asyncio.sleep(0.05)
            left = [tp for tp in tps if ends[tp] > 0]
            out: list[ConsumerRecord[bytes, bytes]] = []
            if not left:
                return out
            consumer.assign(left)
            await consumer.seek_to_beginning(*left)
            while left:
                for tp, records in (await consumer.getmany(*left, timeout_ms=500)).items():
                    out += [r for r in records if r.offset < ends[tp]]
                left = [tp for tp in left if await consumer.position(tp) < ends[tp]]
            return out
    finally:
        await consumer.stop()
        await admin.close()


def send_events(
    bootstrap: str,
    topics: Topics,
    events: list[tuple[EventKind, bytes]],
    run_id: str,
    timestamp_ms: int | None = None,
) -> None:
    """Send already encoded events, keyed as the publisher keys them, onto topics shaped as
    the publisher shapes them (control with one partition, not the broker's default); with
    Kafka timestamp ``timestamp_ms`` (ms since the epoch: events sent in the past; default now)."""

    async def go() -> None:
        await ensure_topics(bootstrap, KafkaSecurity(), topics, "publisher")
        topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for kind, raw in events:
                event = orjson.loads(raw)
                task = event.get("task", event.get("row", {}).get("_ng_task_index"))
                key = run_id.encode() if kind == "control" else task_key(int(task))
                await producer.send(topic[kind], raw, key=key, timestamp_ms=timestamp_ms)
        finally:
            await producer.stop()

    asyncio.run(go())


T = TypeVar("T")


def committed(bootstrap: str, group: str, topic: str, timeout: float = 90) -> int:
    """Wait until ``group`` has committed a position past 0 on some partition of ``topic``
    (the processor's commit metadata: its offset is where a replay starts, 0 while the run is
    open); the sum of those positions. An awaited commit, not a pause that hopes for one."""

    def total(offsets: dict[TopicPartition, OffsetAndMetadata]) -> int | None:
        positions = [
            orjson.loads(m.metadata)["position"]
            for tp, m in offsets.items()
            if tp.topic == topic and m.offset >= 0 and m.metadata
        ]
        return sum(positions) or None

    return _commits_until(bootstrap, group, total, timeout)


def checkpointed(bootstrap: str, group: str, topics: Topics, timeout: float = 90) -> dict[str, Any]:
    """Wait until ``group``'s commits on every partition of both data topics name a
    checkpoint (the processor's commit metadata); those checkpoints, by ``topic:partition``."""

    def named(offsets: dict[TopicPartition, OffsetAndMetadata]) -> dict[str, Any] | None:
        out = {
            f"{tp.topic}:{tp.partition}": orjson.loads(m.metadata).get("checkpoint")
            for tp, m in offsets.items()
            if tp.topic in (topics.inputs, topics.rollouts) and m.metadata
        }
        whole = len({k.rpartition(":")[0] for k in out}) == 2 and all(out.values())
        return out if whole else None

    return _commits_until(bootstrap, group, named, timeout)


def _commits_until(
    bootstrap: str,
    group: str,
    found: Callable[[dict[TopicPartition, OffsetAndMetadata]], T | None],
    timeout: float,
) -> T:
    """Ask ``group``'s committed offsets until ``found`` makes something of them; that."""

    async def go() -> T:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            async with asyncio.timeout(timeout):
                while (got := found(await admin.list_consumer_group_offsets(group))) is None:
                    await asyncio.sleep(0.1)
                return got
        finally:
            await admin.close()

    return asyncio.run(go())


@contextlib.contextmanager
def trickle(
    bootstrap: str, topics: Topics, events: list[tuple[EventKind, bytes]], run_id: str
) -> Iterator[None]:
    """Send ``events`` one at a time, in a thread, while the block runs: a collection that is
    alive however slowly the machine goes (every event starts its own producer)."""
    stop = threading.Event()

    def feed() -> None:
        for event in events:
            if stop.is_set():
                return
            send_events(bootstrap, topics, [event], run_id)
            stop.wait(0.3)

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


Runs = dict[str, dict[str, object]]


def run_detail(url: str, run_id: str) -> dict[str, Any]:
    """A processor's ``GET /runs/<run_id>``: the run's whole-run view."""
    with urllib.request.urlopen(f"{url}/runs/{run_id}", timeout=10) as r:
        detail: dict[str, Any] = orjson.loads(r.read())
    return detail


class Processor:
    """``rewardstream stream`` as a real child process, with its HTTP endpoint."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        out: Path,
        log: Path,
        checkpoint_every: float = 0.2,
        extra: Sequence[str] = (),
        private_disk: Path | None = None,
        host_disk: Path | None = None,
        client: HttpSecurity | None = None,
    ) -> None:
        """``private_disk``: run as a separate host would, in a mount namespace of its own
        with a private tmpfs at that folder (its ``--state-dir``, and ``out`` inside it):
        invisible to every other process, gone with it (root only). ``host_disk`` (with
        ``private_disk``): that folder bind-mounted there instead of a tmpfs, a host's own disk
        that outlives the process (a restart on the same host finds it again). ``client``:
        the token and CA this test asks its endpoint with (https with a CA)."""
        self.log = log
        self.port = free_port()
        self.client = client or HttpSecurity()
        scheme = "https" if self.client.cafile else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.disk = private_disk
        if private_disk is not None:
            out = private_disk / "out"
            extra = [*extra, "--state-dir", str(private_disk / "state")]
        cmd = [
            sys.executable,
            "-m",
            "rewardstream.commands.cli",
            "stream",
            "--bootstrap",
            bootstrap,
            "--output-dir",
            str(out),
            "--topic-prefix",
            prefix,
            "--http",
            f"127.0.0.1:{self.port}",
            "--checkpoint-every",
            str(checkpoint_every),
            *extra,
        ]
        if private_disk is not None:
            private_disk.mkdir(parents=True, exist_ok=True)
            script = f'mount -t tmpfs -o size=512m tmpfs "{private_disk}" && exec "$@"'
            if host_disk is not None:
                host_disk.mkdir(parents=True, exist_ok=True)
                script = f'mount --bind "{host_disk}" "{private_disk}" && exec "$@"'
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]
        with log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def seen(self, path: Path) -> Path:
        """``path`` as this processor sees it (inside its own mount namespace, if any)."""
        if self.disk is None:
            return path
        return Path(f"/proc/{self.proc.pid}/root") / path.relative_to("/")

    def _get(self, path: str) -> object:
        """A JSON answer of the endpoint, or None while it is not serving (starting, killed)."""
        try:
            with open_url(self.client, f"{self.url}{path}", timeout=2) as r:
                return orjson.loads(r.read())
        except OSError:
            return None

    def runs(self) -> Runs:
        body = self._get("/runs")
        return {x["run_id"]: x for x in body} if isinstance(body, list) else {}

    def units(self) -> dict[str, int]:
        """The units (partitions) it owns and their positions, from ``/healthz``; {} while
        starting or before its first assignment."""
        body = self._get("/healthz")
        return dict(body.get("units") or {}) if isinstance(body, dict) else {}

    def wait(self, done: Callable[[Runs], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.runs()):
            assert self.proc.poll() is None, f"processor exited: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out; runs={self.runs()}"
            time.sleep(0.1)

    def kill(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(30)


@contextlib.contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """``app`` served on a free loopback port by an event loop in a thread of its own, for tests
    whose clients block (a browser, a command); yields its ``http://127.0.0.1:PORT``."""
    loop = asyncio.new_event_loop()
    runner, port = loop.run_until_complete(serve(app, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
