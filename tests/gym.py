"""Test helpers for the gym servers: ``ng_run`` as a real child process, and tiny data sets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from rewardstream.contract.events import Topics
from rewardstream.gym_servers.base import Handler
from rewardstream.gym_servers.math_env import generate
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.kafka.local import free_port
from rewardstream.processors.stream import StreamProcessor

POLICY = "+policy_model.responses_api_models.simulated_model.simulated_policy"


class NgRun:
    """``ng_run`` with the bundled config (plus ``overrides``), started as a child process."""

    def __init__(self, *overrides: str) -> None:
        self.port = free_port()
        self.head_url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "rewardstream.gym_servers.ng_run",
            f"+config_paths=[{BUNDLED_CONFIG}]",
        ]
        cmd += [f"+head_server.port={self.port}", *overrides]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any(line.startswith("All ") for line in self.lines):
            line = self.proc.stdout.readline().decode()
            assert line or self.proc.poll() is None, f"ng_run exited: {self.lines}"
            assert time.monotonic() < deadline, f"ng_run not ready: {self.lines}"
            self.lines.append(line)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.head_url}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    def url(self, name: str) -> str:
        instances = self.get("/server_instances")  # 0.7.0: process_name is the instance
        return str(next(i["url"] for i in instances if i["process_name"] == name))

    def pids(self) -> list[int]:
        return [int(i["pid"]) for i in self.get("/server_instances")]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


@contextlib.contextmanager
def ng_run(*overrides: str) -> Iterator[NgRun]:
    run = NgRun(*overrides)
    try:
        yield run
    finally:
        run.stop()


def fast(*extra: str) -> tuple[str, ...]:
    """Overrides for a simulated policy that answers at once."""
    return (f"{POLICY}.latency_s=0", f"{POLICY}.seconds_per_token=0", *extra)


def write_problems(path: Path, count: int, seed: int = 7) -> Path:
    """``count`` generated problems in NeMo Gym's input format."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in generate(count, seed)))
    return path


async def serve(routes: dict[str, Handler]) -> tuple[web.AppRunner, str]:
    """A real tiny aiohttp server on a free loopback port, POST ``routes``; returns its URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def keys(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]


@contextlib.asynccontextmanager
async def streaming(
    bootstrap: str, out: Path, prefix: str, wait_s: float = 60
) -> AsyncIterator[tuple[StreamProcessor, dict[str, Any]]]:
    """A stream processor in this event loop on the topics of ``prefix``, and the collector
    keys that stream a collection to it and wait (``wait_s``) for its final profile."""
    processor = StreamProcessor(bootstrap, out, Topics.for_prefix(prefix))
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    try:
        yield (
            processor,
            {
                "kafka_bootstrap_servers": bootstrap,
                "kafka_topic_prefix": prefix,
                "kafka_wait_profile": True,
                "kafka_wait_profile_timeout_s": wait_s,
            },
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
