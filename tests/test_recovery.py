"""``kill -9`` of a real processor process mid-run, then a restart: same files as no fault."""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from prometheus_client.parser import text_string_to_metric_families

from bench.generate import generate
from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import Topics
from tests.golden import OUTPUT_SUFFIXES, file_events
from tests.processes import Processor, Runs, checkpointed, committed, send_events

pytestmark = pytest.mark.kafka


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
    send_events(kafka_bootstrap, topics, body[: n_in + 600], "run")
    first.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)
    committed(kafka_bootstrap, f"{prefix}-profiler", topics.rollouts)  # a commit covers some
    send_events(kafka_bootstrap, topics, body[n_in + 600 :], "run")
    first.kill(signal.SIGKILL)  # mid-consumption of the last 400

    second = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(second)
    send_events(kafka_bootstrap, topics, events[n_in + 1000 :], "run")
    second.wait(lambda runs: runs.get("run", {}).get("done") is True)
    second.kill(signal.SIGTERM)
    assert second.proc.returncode == 0, log.read_text()[-2000:]

    _as_nemo_gym_writes(inputs, rollouts, out / "run", data)


@pytest.mark.parametrize("fault", [None, "checkpoints deleted"])
def test_a_new_owner_holds_the_named_checkpoint_again_or_replays(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    fault: str | None,
) -> None:
    """After ``kill -9``, the next processor restores each unit from the checkpoint its
    commit names and reads only what follows; with the checkpoints' records gone (retention),
    it says so and replays the units instead. Either way the files are NeMo Gym's."""
    data = tmp_path / "data"
    generate(tasks=250, repeats=4, out=data / "r", text_bytes=200, seed=4)
    inputs, rollouts = data / "r_materialized_inputs.jsonl", data / "r.jsonl"
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)

    first = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(first)
    send_events(kafka_bootstrap, topics, events[: n_in + 600], "run")
    first.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)
    named: dict[str, Any] = checkpointed(kafka_bootstrap, f"{prefix}-profiler", topics)
    send_events(kafka_bootstrap, topics, events[n_in + 600 : n_in + 800], "run")
    first.wait(lambda runs: runs.get("run", {}).get("rollouts") == 800)
    first.kill(signal.SIGKILL)
    if fault is not None:
        asyncio.run(_delete_all(kafka_bootstrap, f"{prefix}.checkpoints"))

    second = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(second)
    send_events(kafka_bootstrap, topics, events[n_in + 800 :], "run")
    second.wait(lambda runs: runs.get("run", {}).get("done") is True)
    second.kill(signal.SIGTERM)
    text = log.read_text()
    assert second.proc.returncode == 0, text[-2000:]
    for unit in ("input-0", "rollout-0"):
        restored = f"{unit}: held again from checkpoint" in text
        refused = f"{unit}: checkpoint " in text and "unusable" in text
        assert (restored, refused) == ((True, False) if fault is None else (False, True)), named
    _as_nemo_gym_writes(inputs, rollouts, out / "run", data)


def _as_nemo_gym_writes(inputs: Path, rollouts: Path, written: Path, data: Path) -> None:
    """The files in ``written`` are those the batch profile writes beside the inputs."""
    assert (
        ng_reward_profile(
            [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
        )
        == 0
    )
    for suffix in OUTPUT_SUFFIXES:
        assert (written / f"r{suffix}").read_bytes() == (data / f"r{suffix}").read_bytes(), suffix


async def _delete_all(bootstrap: str, topic: str) -> None:
    """Every record of the one-partition ``topic`` deleted, as retention would."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(-1)})
    finally:
        await admin.close()


def test_a_restarted_processor_dates_runs_by_their_events(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A processor killed and restarted reads every open run again; one whose events Kafka
    dates an hour back is stalled at once, its last event an hour ago (on /runs and /metrics),
    not heard of anew (``--stall-after`` 300: nothing here waits that long); one whose events
    are a second old is open."""
    data = tmp_path / "data"
    generate(tasks=20, repeats=2, out=data / "r", text_bytes=50, seed=5)
    inputs, rollouts = data / "r_materialized_inputs.jsonl", data / "r.jsonl"
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)
    hour_ago = int((time.time() - 3600) * 1000)
    dead = file_events(inputs, rollouts, "dead", "r", finish=False)
    send_events(kafka_bootstrap, topics, [*dead[:-5], dead[-1]], "dead", timestamp_ms=hour_ago)
    extra = ["--stall-after", "300"]

    def shown(p: Processor) -> Callable[[Runs], bool]:
        return lambda runs: runs.get("dead", {}).get("rollouts") == 36 and "alive" in runs

    first = Processor(kafka_bootstrap, prefix, out, log, extra=extra)
    processors.append(first)
    alive = file_events(inputs, rollouts, "alive", "r", finish=False)
    send_events(kafka_bootstrap, topics, alive[:10], "alive")
    first.wait(shown(first))
    first.kill(signal.SIGKILL)

    second = Processor(kafka_bootstrap, prefix, out, log, extra=extra)
    processors.append(second)
    send_events(kafka_bootstrap, topics, alive[10:20], "alive")
    began = time.time()
    second.wait(shown(second))
    runs = second.runs()
    assert runs["dead"]["state"] == "stalled", runs["dead"]
    assert runs["dead"]["rate"] == 0 and runs["dead"]["eta_seconds"] is None
    age = runs["dead"]["last_event_seconds"]
    assert isinstance(age, int) and 3600 <= age <= 3600 + time.time() - began + 120, age
    assert runs["alive"]["state"] == "open", runs["alive"]
    with urllib.request.urlopen(f"{second.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    ages = {
        s.labels["run_id"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rewardstream_run_last_event_age_seconds"
    }
    assert ages["dead"] >= 3600 and ages["alive"] < 300, ages
