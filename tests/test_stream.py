"""The Kafka stream processor against a real broker: final files and snapshots equal batch."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rewardstream.commands.cli import main, ng_reward_profile
from rewardstream.contract.events import EventKind, Topics, task_key
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.local import free_port
from rewardstream.processors.stream import StreamProcessor
from rewardstream.processors.stream import finals as finals_module
from rewardstream.sinks.topics.profiles import ensure_topics, publish_final
from tests.golden import GOLDEN, OUTPUT_SUFFIXES, GoldenCase, golden_cases, golden_events
from tests.processes import read_topic

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(not GOLDEN.exists(), reason="no goldens"),
]

CASES = {c.name: c for c in golden_cases()} if GOLDEN.exists() else {}


class Running:
    """A processor running in the test's event loop, plus a producer onto its topics."""

    def __init__(self, processor: StreamProcessor, producer: AIOKafkaProducer, url: str) -> None:
        self.processor, self.producer, self.url = processor, producer, url

    async def send(self, events: list[tuple[EventKind, bytes]], run_id: str) -> None:
        topics = self.processor.topics
        topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
        for kind, raw in events:
            key = run_id.encode() if kind == "control" else task_key(_task(raw))
            await self.producer.send(topic[kind], raw, key=key)
        await self.producer.flush()

    async def wait(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.05)


def _task(raw: bytes) -> int:
    event = orjson.loads(raw)
    return int(event["task"] if "task" in event else event["row"]["_ng_task_index"])


@pytest.fixture
async def running(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> AsyncIterator[Running]:
    topics = Topics.for_prefix(unique_name("rs"))
    # control as the publisher makes it (a send racing the processor's start would auto-create
    # it with the broker's num.partitions)
    await ensure_topics(kafka_bootstrap, KafkaSecurity(), topics, "publisher")
    processor = StreamProcessor(kafka_bootstrap, tmp_path / "out", topics)
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop, ("127.0.0.1", port)))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        yield Running(processor, producer, f"http://127.0.0.1:{port}")
    finally:
        await producer.stop()
        stop.set()
        await asyncio.wait_for(task, 30)


def _assert_files(folder: Path, case: GoldenCase) -> None:
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (folder / name).read_bytes() == (case.expected / name).read_bytes(), name


async def test_a_run_is_done_only_once_its_files_are_in_the_output_dir(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader reads its own final back from the topic while its publish call is still
    returning (a loaded machine widens that); the run was then done before the files were
    mirrored, and a reader of ``--output-dir`` found none. Planted: the publish call returns
    2 s after the record is committed."""

    async def slow(*args: Any, **kwargs: Any) -> Any:
        standing = await publish_final(*args, **kwargs)
        await asyncio.sleep(2)  # the tail reads the committed record meanwhile
        return standing

    monkeypatch.setattr(finals_module, "publish_final", slow)
    events = golden_events(CASES["blackjack"], "slow-mirror", finish=False)
    await running.send(events, "slow-mirror")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "slow-mirror" in runs and runs["slow-mirror"].done)
    _assert_files(running.processor.pipeline.output_dir / "slow-mirror", CASES["blackjack"])


async def test_a_writer_that_fails_after_its_record_is_committed_reads_it_all_the_same(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record the tail held for its writer is read when the writer stops short (planted:
    the publish call fails 2 s after the record is committed); the run is done, not stuck."""

    async def failing(*args: Any, **kwargs: Any) -> Any:
        await publish_final(*args, **kwargs)
        await asyncio.sleep(2)
        raise KafkaError("planted: the call failed after the commit")

    monkeypatch.setattr(finals_module, "publish_final", failing)
    await running.send(golden_events(CASES["blackjack"], "cut-short", finish=False), "cut-short")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "cut-short" in runs and runs["cut-short"].done)
    assert runs["cut-short"].terminal is not None and not runs["cut-short"].terminal.evicted


async def test_final_profiles_equal_batch_and_republish_changes_nothing(running: Running) -> None:
    names = ["blackjack", "multi_agent", "mask_sample", "partial+allow_partial"]
    run_ids = {name: name.replace("+", "-") for name in names}  # run ids are path components
    for name, run_id in run_ids.items():
        events = golden_events(CASES[name], run_id, finish=name.endswith("allow_partial"))
        await running.send(events, run_id)
        await running.send(events[:4], run_id)  # republished events are deduplicated
    runs = running.processor.pipeline.runs
    await running.wait(lambda: all(r in runs and runs[r].done for r in run_ids.values()))
    for name, run_id in run_ids.items():
        _assert_files(running.processor.pipeline.output_dir / run_id, CASES[name])
    assert runs["blackjack"].duplicates == 4


async def test_snapshot_mid_stream_equals_partial_batch_profile(
    running: Running, tmp_path: Path
) -> None:
    case = CASES["ints_only"]
    events = golden_events(case, "snap", finish=False)
    inputs = [e for e in events if e[0] == "input"]
    rollouts = [e for e in events if e[0] == "rollout"]
    await running.send(inputs + rollouts[:4], "snap")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "snap" in runs and runs["snap"].rollouts == 4)

    out = tmp_path / "snapshot"
    code = await asyncio.to_thread(
        main, ["snapshot", "--url", running.url, "--run-id", "snap", "--out", str(out)]
    )
    assert code == 0

    # batch profile of exactly the consumed prefix, with allow_partial
    batch = tmp_path / "batch"
    batch.mkdir()
    shutil.copy(case.source / f"{case.stem}_materialized_inputs.jsonl", batch)
    prefix = (case.source / f"{case.stem}.jsonl").read_bytes().splitlines(keepends=True)[:4]
    (batch / f"{case.stem}.jsonl").write_bytes(b"".join(prefix))
    inputs_path = batch / f"{case.stem}_materialized_inputs.jsonl"
    rollouts_path = batch / f"{case.stem}.jsonl"
    argv = [
        f"+materialized_inputs_jsonl_fpath={inputs_path}",
        f"+rollouts_jsonl_fpath={rollouts_path}",
        "++allow_partial_rollouts=True",
    ]
    assert ng_reward_profile(argv) == 0
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (out / name).read_bytes() == (batch / name).read_bytes(), name

    # the run then completes with the same bytes as the golden
    await running.send(rollouts[4:] + [e for e in events if e[0] == "control"], "snap")
    await running.wait(lambda: runs["snap"].done)
    _assert_files(running.processor.pipeline.output_dir / "snap", case)


async def test_snapshot_of_unknown_run_is_a_clear_error(
    running: Running, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = await asyncio.to_thread(
        main, ["snapshot", "--url", running.url, "--run-id", "nope", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "HTTP 404 unknown run_id 'nope'" in capsys.readouterr().err


async def test_poison_events_go_to_dead_letters_and_processing_continues(
    running: Running, kafka_bootstrap: str
) -> None:
    topics = running.processor.topics
    await running.producer.send(topics.rollouts, b"not json", key=b"0")
    await running.producer.send(topics.rollouts, b'{"v":1,"run_id":"x","type":"rollout"}', key=b"0")
    case = CASES["blackjack"]
    await running.send(golden_events(case, "ok", finish=False), "ok")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "ok" in runs and runs["ok"].done)
    _assert_files(running.processor.pipeline.output_dir / "ok", case)

    # every partition of the (auto-created) topic, in the order the events were consumed
    records = await read_topic(kafka_bootstrap, topics.dead_letters, at_least=2)
    records.sort(key=lambda r: int(dict(r.headers)["source"].rsplit(b":", 1)[1]))
    assert [r.value for r in records] == [b"not json", b'{"v":1,"run_id":"x","type":"rollout"}']
    headers = [dict(r.headers) for r in records]
    assert all(h["kind"] == b"rollout" for h in headers)
    assert headers[0]["source"].startswith(f"{topics.rollouts}:0:".encode())
    assert [h["reason"] for h in headers] == [b"not-json", b"schema-version"]
    assert headers[1]["detail"] == b"Expected schema version 2, got 1 - at `$.v`"  # the field
    registry = running.processor.metrics.registry
    for reason in ("not-json", "schema-version"):
        labels = {"kind": "rollout", "reason": reason}
        assert registry.get_sample_value("rewardstream_events_rejected_total", labels) == 1
