"""Poison events against a real ``rewardstream stream`` process (issue 6).

Every kind of unusable event (not JSON, a wrong schema version or type, missing ids,
NaN/Infinity, a run_finished of a run that never started, an oversized message) goes to the
dead-letter topic with its original bytes and a ``reason`` from a small fixed set, is counted in
``/metrics`` by kind and reason, and processing goes on: the good run sent around the poison
still ends with the batch profile, byte for byte. Data of a run whose run_started has not come
yet is held, and profiled once it comes.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from rewardstream.contract.events import (
    REJECT_REASONS,
    EventKind,
    RunFinished,
    RunStarted,
    Topics,
    encode,
    encode_input,
    encode_rollout,
    task_key,
)
from rewardstream.processors.core.records import ResultRecord
from rewardstream.processors.stream import DEAD_LETTER_CUT
from tests.golden import assert_batch_files, file_events, generated_collection
from tests.processes import Processor

pytestmark = pytest.mark.kafka

PARTITIONS = 2
MAX_EVENT_BYTES = 20_000  # --max-event-bytes for the processor under test
BIG = 1_500_000  # above the processor producer's 1 MiB request limit: parked cut short
TOPIC_LIMIT = str(4 << 20)  # max.message.bytes of the data topics, so BIG can be sent at all


class Poison(NamedTuple):
    kind: EventKind
    key: bytes
    raw: bytes
    reason: str


def _rollout(run_id: str = "other", task: int = 1, agent: str | None = "a") -> dict[str, Any]:
    record = ResultRecord(("reward",), (False,), (1.0,), b'{"reward":1.0}', False)
    event: dict[str, Any] = orjson.loads(encode_rollout(run_id, task, 0, agent, record, 1.5))
    return event


def _edited(event: dict[str, Any], **changes: Any) -> bytes:
    return orjson.dumps({k: v for k, v in (event | changes).items() if v is not KeyError})


def poison_events() -> list[Poison]:
    """One or more events of every reason; none of them belongs to the good run."""
    good = orjson.dumps(_rollout())
    row = {"q": "x", "agent_ref": {"name": "a"}, "_ng_task_index": 1, "_ng_rollout_index": 0}
    key = task_key(1)
    return [
        Poison("rollout", key, b"not json", "not-json"),
        Poison("rollout", key, good[: len(good) // 2], "not-json"),
        Poison("rollout", key, good.replace(b'"a"', b'"\xff"'), "not-json"),
        Poison("input", key, b"\x00\x01\x02binary", "not-json"),
        Poison("control", b"x", b"{oops", "not-json"),
        Poison("rollout", key, good.replace(b"[1.0]", b"[NaN]"), "non-finite-number"),
        Poison("rollout", key, good.replace(b":1.0}", b":-Infinity}"), "non-finite-number"),
        Poison("rollout", key, good.replace(b":1.5", b":1e400"), "non-finite-number"),
        Poison("rollout", key, _edited(_rollout(), v=99), "schema-version"),
        Poison("control", b"x", b'{"v":99,"type":"run_finished","run_id":"x"}', "schema-version"),
        Poison("rollout", key, _edited(_rollout(), run_id=KeyError), "missing-id"),
        Poison("rollout", key, _edited(_rollout(), task=KeyError), "missing-id"),
        Poison("rollout", key, _edited(_rollout(), rollout=KeyError), "missing-id"),
        Poison("input", key, encode_input("other", 0, {"_ng_task_index": 1}), "missing-id"),
        Poison("control", b"x", b'{"v":2,"type":"run_finished"}', "missing-id"),
        Poison("rollout", key, _edited(_rollout(), task="1"), "invalid-event"),
        Poison("rollout", key, _edited(_rollout(), run_id="../x"), "invalid-event"),
        Poison("rollout", key, _edited(_rollout(), agent=["a"]), "invalid-event"),
        Poison("input", key, encode_input("other", 0, row | {"agent_ref": 5}), "invalid-event"),
        Poison(
            "input", key, encode_input("other", 0, row | {"_ng_task_index": -1.0}), "invalid-event"
        ),
        Poison("control", b"ghost", encode(RunFinished(run_id="ghost")), "unknown-run"),
        Poison("rollout", key, orjson.dumps(_rollout(agent="a" * MAX_EVENT_BYTES)), "oversized"),
        Poison("rollout", key, b"x" * BIG, "oversized"),
    ]


class Stream(NamedTuple):
    topics: Topics
    processor: Processor
    log: Path


async def _create_topics(bootstrap: str, topics: Topics) -> None:
    """Data topics that take BIG messages, control, and the dead-letter topic (one partition,
    so it is read in order and never raced by auto-creation)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"max.message.bytes": TOPIC_LIMIT}
        await admin.create_topics(
            [
                NewTopic(topics.inputs, PARTITIONS, 1, topic_configs=config),
                NewTopic(topics.rollouts, PARTITIONS, 1, topic_configs=config),
                NewTopic(topics.control, 1, 1),
                NewTopic(topics.dead_letters, 1, 1),
            ]
        )
    finally:
        await admin.close()


@pytest.fixture
def stream(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> Stream:
    prefix = unique_name("poison")
    topics = Topics.for_prefix(prefix)
    asyncio.run(_create_topics(kafka_bootstrap, topics))
    log = tmp_path / "processor.log"
    extra = ["--max-event-bytes", str(MAX_EVENT_BYTES)]
    processor = Processor(kafka_bootstrap, prefix, tmp_path / "out", log, extra=extra)
    processors.append(processor)
    return Stream(topics, processor, log)


def send(bootstrap: str, topics: Topics, messages: list[tuple[EventKind, bytes, bytes]]) -> None:
    """(kind, key, raw) messages, in order, on the kind's topic."""
    topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20)
        await producer.start()
        try:
            for kind, key, raw in messages:
                await producer.send(topic[kind], raw, key=key)
        finally:
            await producer.stop()

    asyncio.run(go())


def keyed(
    events: list[tuple[EventKind, bytes]], run_id: str
) -> list[tuple[EventKind, bytes, bytes]]:
    """Good events keyed as the publisher keys them."""
    out: list[tuple[EventKind, bytes, bytes]] = []
    for kind, raw in events:
        event = orjson.loads(raw)
        task = event["task"] if kind == "rollout" else event.get("row", {}).get("_ng_task_index")
        out.append((kind, run_id.encode() if kind == "control" else task_key(task), raw))
    return out


async def dead_letters(bootstrap: str, topic: str, count: int) -> list[ConsumerRecord]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list[ConsumerRecord] = []
        async with asyncio.timeout(60):
            while len(records) < count:
                for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                    records += batch
        await asyncio.sleep(1.0)  # nothing more may come
        for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
            records += batch
        return records
    finally:
        await consumer.stop()


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_poison_is_parked_counted_and_skipped(
    kafka_bootstrap: str, stream: Stream, tmp_path: Path
) -> None:
    topics, processor, log = stream
    inputs, rollouts = generated_collection(
        tmp_path / "good", tasks=40, repeats=3, seed=11, text_bytes=80
    )
    good = keyed(file_events(inputs, rollouts, "good", "r", finish=False), "good")
    poison = poison_events()
    # poison between the good events, on every topic and partition, good events after each
    third = len(good) // 3
    mixed = good[:third] + [(p.kind, p.key, p.raw) for p in poison[::2]] + good[third : 2 * third]
    mixed += [(p.kind, p.key, p.raw) for p in poison[1::2]] + good[2 * third :]
    send(kafka_bootstrap, topics, mixed)

    try:
        processor.wait(lambda runs: runs.get("good", {}).get("done") is True)
        records = asyncio.run(dead_letters(kafka_bootstrap, topics.dead_letters, len(poison)))
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None

    # the good run: every rollout once, and the batch profile
    assert_batch_files(tmp_path / "out" / "good", inputs.parent)
    run = processor.runs()["good"]
    assert (run["rollouts"], run["inputs"], run["duplicates_dropped"]) == (120, 120, 0)

    # each poison event parked once, with its bytes and reason
    assert len(records) == len(poison)
    got = sorted((h["kind"].decode(), h["reason"].decode(), r.value) for r, h in _headers(records))
    cut = [p.raw if len(p.raw) < BIG else p.raw[:DEAD_LETTER_CUT] for p in poison]
    assert got == sorted((p.kind, p.reason, raw) for p, raw in zip(poison, cut, strict=True))
    topic_of = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
    for record, headers in _headers(records):
        kind = headers["kind"].decode()
        assert headers["source"].startswith(f"{topic_of[kind]}:".encode())
        assert headers["detail"], headers
        assert ("size" in headers) == (len(record.value) == DEAD_LETTER_CUT)
        if "size" in headers:
            assert int(headers["size"]) == BIG
    details = {h["reason"]: h["detail"] for _, h in _headers(records)}
    assert details[b"unknown-run"] == b"run_finished for run 'ghost', which never started"
    assert b"above the 20000-byte limit (--max-event-bytes)" in details[b"oversized"]

    # /metrics: the rejected counter by kind and reason, a bounded set of series
    scraped = metrics(processor.url)
    counted = Counter((p.kind, p.reason) for p in poison)
    kinds: tuple[EventKind, ...] = ("input", "rollout", "control")
    for kind in kinds:
        for reason in REJECT_REASONS:
            labels = (("kind", kind), ("reason", reason))
            want_count = counted[kind, reason]
            assert scraped[("rewardstream_events_rejected_total", labels)] == want_count, labels
    series = sum(1 for name, _ in scraped if name == "rewardstream_events_rejected_total")
    assert series == len(kinds) * len(REJECT_REASONS)
    consumed = sum(
        v for (n, _), v in scraped.items() if n == "rewardstream_rollouts_consumed_total"
    )
    assert consumed == 120
    assert sorted(processor.runs()) == ["good"]  # a rejected event creates no run


def _headers(records: list[ConsumerRecord]) -> list[tuple[ConsumerRecord, dict[str, bytes]]]:
    return [(r, dict(r.headers)) for r in records]


def test_data_of_a_run_not_yet_started_is_held_until_it_starts(
    kafka_bootstrap: str, stream: Stream, tmp_path: Path
) -> None:
    """The publisher sends run_started after the inputs and topics are not ordered with each
    other, so data of an unannounced run is not poison: it is kept (and shown in /runs), and
    the run is profiled once its run_started arrives."""
    topics, processor, log = stream
    inputs, rollouts = generated_collection(
        tmp_path / "early", tasks=20, repeats=3, seed=12, text_bytes=80
    )
    events = keyed(file_events(inputs, rollouts, "early", "r", finish=False), "early")
    data, control = events[:-1], events[-1:]
    assert orjson.loads(control[0][2])["type"] == "run_started"
    send(kafka_bootstrap, topics, data)
    try:
        processor.wait(lambda runs: runs.get("early", {}).get("rollouts") == 60)
        run = processor.runs()["early"]
        assert (run["expected_rollouts"], run["done"]) == (None, False)
        send(kafka_bootstrap, topics, control)
        processor.wait(lambda runs: runs["early"]["done"] is True)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    assert_batch_files(tmp_path / "out" / "early", inputs.parent)
    scraped = metrics(processor.url)
    assert sum(v for (n, _), v in scraped.items() if n == "rewardstream_events_rejected_total") == 0
    started = RunStarted(run_id="early", expected_rollouts=60, output_stem="r")
    assert orjson.loads(control[0][2]) == orjson.loads(encode(started))
