"""Smoke tests against a real broker: the client features the profiler relies on.

Each test uses its own topics and groups (``unique_name``), so they can share one broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from rewardstream.contract.events import Topics
from tests.processes import create_topics, make_topics

pytestmark = pytest.mark.kafka

UniqueName = Callable[[str], str]


async def create_single_partition_topics(bootstrap: str, *names: str) -> None:
    """Create single-partition topics up front, so no test races topic auto-creation."""
    await create_topics(bootstrap, dict.fromkeys(names, 1))


async def read(
    consumer: AIOKafkaConsumer, count: int, timeout: float = 30.0
) -> list[ConsumerRecord]:
    """Exactly ``count`` records (fewer means a timeout failure)."""
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        batches = await consumer.getmany(timeout_ms=500, max_records=count - len(records))
        for batch in batches.values():
            records.extend(batch)
    assert len(records) == count, f"got {len(records)} of {count} records in {timeout}s"
    return records


async def read_to_end(
    consumer: AIOKafkaConsumer, tp: TopicPartition, timeout: float = 30.0
) -> list[bytes]:
    """All values up to the current end offset (the last stable offset when read_committed)."""
    end = (await consumer.end_offsets([tp]))[tp]
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while await consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"stuck at {await consumer.position(tp)} < {end}"
        for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
            values.extend(r.value for r in batch)
    return values


async def committed(bootstrap: str, group: str, topic: str) -> int | None:
    """The group's committed offset for partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(TopicPartition(topic, 0))
        return offset
    finally:
        await consumer.stop()


async def test_produce_consume_round_trip(kafka_bootstrap: str, unique_name: UniqueName) -> None:
    topic = unique_name("roundtrip")
    await create_single_partition_topics(kafka_bootstrap, topic)
    sent = [(f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(20)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for key, value in sent:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        records = await read(consumer, len(sent))
    finally:
        await consumer.stop()
    assert [(r.key, r.value) for r in records] == sent
    assert [r.offset for r in records] == list(range(len(sent)))


async def test_idempotent_producer(kafka_bootstrap: str, unique_name: UniqueName) -> None:
    topic = unique_name("idempotent")
    await create_single_partition_topics(kafka_bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        futures = [await producer.send(topic, f"m{i}".encode()) for i in range(200)]
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    assert sorted(m.offset for m in metadata) == list(range(200))

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        values = [r.value for r in await read(consumer, 200)]
    finally:
        await consumer.stop()
    assert values == [f"m{i}".encode() for i in range(200)]  # in order, no duplicates


async def test_manual_commit_resumes_where_it_stopped(
    kafka_bootstrap: str, unique_name: UniqueName
) -> None:
    topic, group = unique_name("resume"), unique_name("group")
    await create_single_partition_topics(kafka_bootstrap, topic)
    values = [f"r{i}".encode() for i in range(10)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()

    tp = TopicPartition(topic, 0)

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )

    first = consumer()
    await first.start()
    try:
        head = await read(first, 4)
        await first.commit({tp: head[-1].offset + 1})
    finally:
        await first.stop()
    assert [r.value for r in head] == values[:4]

    second = consumer()
    await second.start()
    try:
        assert await second.committed(tp) == 4
        rest = await read(second, 6)
    finally:
        await second.stop()
    assert [r.value for r in rest] == values[4:]


async def test_transactions_read_committed(kafka_bootstrap: str, unique_name: UniqueName) -> None:
    topic, source, group = unique_name("txn"), unique_name("txn-src"), unique_name("txn-group")
    await create_single_partition_topics(kafka_bootstrap, topic, source)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=unique_name("txid")
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send(topic, f"c{i}".encode())
            await producer.send_offsets_to_transaction({TopicPartition(source, 0): 3}, group)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"after-abort")
    finally:
        await producer.stop()

    tp = TopicPartition(topic, 0)
    seen: dict[str, list[bytes]] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        reader = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level=isolation)
        await reader.start()
        try:
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            seen[isolation] = await read_to_end(reader, tp)
        finally:
            await reader.stop()
    assert seen["read_committed"] == [b"c0", b"c1", b"c2", b"after-abort"]
    assert b"aborted" in seen["read_uncommitted"]  # it was written, just never committed

    assert await committed(kafka_bootstrap, group, source) == 3  # send_offsets_to_transaction


FAUST_APP = textwrap.dedent(
    """\
    import os

    import faust

    app = faust.App(
        os.environ["RS_APP_ID"],
        broker=f"kafka://{os.environ['RS_BOOTSTRAP']}",
        store="memory://",
        web_enabled=False,
        topic_partitions=1,
    )
    events = app.topic(os.environ["RS_SOURCE"], key_serializer="raw", value_serializer="raw")
    results = app.topic(os.environ["RS_RESULTS"], key_serializer="raw", value_serializer="raw")
    counts = app.Table("counts", default=int, key_type=str, value_type=int, partitions=1)


    @app.agent(events)
    async def count(stream):
        async for key, value in stream.items():
            counts[key.decode()] += 1
            await results.send(key=key, value=b"%s:%d" % (value, counts[key.decode()]))


    if __name__ == "__main__":
        app.main()
    """
)


@pytest.fixture
def faust_worker(tmp_path: Path) -> Iterator[FaustWorkers]:
    workers = FaustWorkers(tmp_path)
    try:
        yield workers
    finally:
        workers.stop()


class FaustWorkers:
    """Runs the table app as a real ``faust worker`` subprocess: a restart is a new process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        (workdir / "rs_faust_app.py").write_text(FAUST_APP)
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self, env: dict[str, str]) -> None:
        self.runs += 1
        with open(self.workdir / f"worker{self.runs}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "rs_faust_app.py", "worker", "-l", "info"],
                cwd=self.workdir,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )

    def stop(self) -> int | None:
        """Graceful stop (faust commits offsets on SIGTERM); SIGKILL its group after 30 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    async def wait_ready(self, timeout: float = 40.0) -> None:
        """Wait for the current worker's ``[^Worker]: Ready`` log line (recovery finished)."""
        log = self.workdir / f"worker{self.runs}.log"
        deadline = time.monotonic() + timeout
        while b"[^Worker]: Ready" not in log.read_bytes():
            if self.proc is None or self.proc.poll() is not None:
                pytest.fail(f"faust worker exited before it was ready\n{self.logs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"faust worker not ready after {timeout:.0f}s\n{self.logs()}")
            await asyncio.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.workdir.glob("worker*.log"))
        )


async def test_faust_table_survives_worker_restart(
    kafka_bootstrap: str, unique_name: UniqueName, faust_worker: FaustWorkers
) -> None:
    source, results = unique_name("faust-src"), unique_name("faust-out")
    await create_single_partition_topics(kafka_bootstrap, source, results)
    env = {
        "RS_APP_ID": unique_name("faust-app"),
        "RS_BOOTSTRAP": kafka_bootstrap,
        "RS_SOURCE": source,
        "RS_RESULTS": results,
    }
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    reader = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await reader.start()
    try:
        reader.assign([TopicPartition(results, 0)])
        await reader.seek_to_beginning(TopicPartition(results, 0))
        for i in (1, 2, 3):
            await producer.send_and_wait(source, f"e{i}".encode(), key=b"k")
        faust_worker.start(env)
        try:
            first = [r.value for r in await read(reader, 3, timeout=40)]
        except AssertionError:
            pytest.fail(f"first worker produced no results\n{faust_worker.logs()}")
        assert first == [b"e1:1", b"e2:2", b"e3:3"]
        assert faust_worker.stop() == 0, faust_worker.logs()
        assert await committed(kafka_bootstrap, env["RS_APP_ID"], source) == 3

        # Produce e4/e5 only once the restarted worker is ready. faust 0.15.3 can drop records
        # fetched while it ends changelog recovery (stream partitions are resumed before the
        # seek, and flow-control resume then clears the stream queue); they stay uncommitted and
        # are only processed after the next restart. Seen in 2 of ~50 runs with a backlog.
        faust_worker.start(env)
        await faust_worker.wait_ready()
        for i in (4, 5):
            await producer.send_and_wait(source, f"e{i}".encode(), key=b"k")
        try:
            second = [r.value for r in await read(reader, 2, timeout=40)]
        except AssertionError:
            state = (
                f"committed={await committed(kafka_bootstrap, env['RS_APP_ID'], source)} "
                f"results_end={await reader.end_offsets([TopicPartition(results, 0)])}"
            )
            pytest.fail(f"restarted worker produced no results ({state})\n{faust_worker.logs()}")
        # 4 and 5, not 1 and 2: the count was recovered from the changelog topic, and the
        # committed source offset kept e1..e3 from being processed twice.
        assert second == [b"e4:4", b"e5:5"], faust_worker.logs()
    finally:
        await reader.stop()
        await producer.stop()


def test_the_tests_topics_are_made_in_their_shape_or_refused(
    kafka_bootstrap: str, unique_name: UniqueName
) -> None:
    """``tests.processes.make_topics`` returns once the broker lists them as asked, and raises
    when one is there in another shape (as a client's auto-creation makes it): a trial must not
    wait for partitions that never come."""
    made = Topics.for_prefix(unique_name("made"))
    asyncio.run(make_topics(kafka_bootstrap, made, 4))
    taken = Topics.for_prefix(unique_name("taken"))
    asyncio.run(create_single_partition_topics(kafka_bootstrap, taken.inputs))  # as auto-created
    with pytest.raises(RuntimeError, match="inputs"):
        asyncio.run(make_topics(kafka_bootstrap, taken, 4))
