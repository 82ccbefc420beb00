"""Real processes and topics for the stream tests: ``rewardstream stream`` as a child process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from processors.pipeline import EventKind
from rewardstream.contract import Topics, task_key
from rewardstream.kafka_local import free_port

__all__ = ["Processor", "make_topics", "send_events"]


async def make_topics(bootstrap: str, topics: Topics, partitions: int) -> None:
    """Data topics with ``partitions`` partitions, control with one (its order matters)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(topics.inputs, num_partitions=partitions, replication_factor=1),
                NewTopic(topics.rollouts, num_partitions=partitions, replication_factor=1),
                NewTopic(topics.control, num_partitions=1, replication_factor=1),
            ]
        )
    finally:
        await admin.close()


def send_events(
    bootstrap: str, topics: Topics, events: list[tuple[EventKind, bytes]], run_id: str
) -> None:
    """Send already encoded events, keyed as the publisher keys them."""

    async def go() -> None:
        topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for kind, raw in events:
                event = orjson.loads(raw)
                task = event.get("task", event.get("row", {}).get("_ng_task_index"))
                key = run_id.encode() if kind == "control" else task_key(int(task))
                await producer.send(topic[kind], raw, key=key)
        finally:
            await producer.stop()

    asyncio.run(go())


Runs = dict[str, dict[str, object]]


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
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "rewardstream.cli",
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
        with log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def _get(self, path: str) -> object:
        """A JSON answer of the endpoint, or None while it is not serving (starting, killed)."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=2) as r:
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
            assert self.proc.poll() is None, "processor exited"
            assert time.monotonic() < deadline, f"timed out; runs={self.runs()}"
            time.sleep(0.1)

    def kill(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(30)
