"""Topic shapes the processor and its readers rely on are checked, never assumed.

The control and engine topics are read as one partition, and the inputs and rollouts topics
must have as many partitions each; a topic made otherwise (by an admin, or auto-created with
the broker's ``num.partitions`` because a producer wrote to it first) would leave records
unseen and runs silently unfinished. Every command that reads or writes these topics refuses
it at its start with one line, exit 2, nothing written; a fresh prefix gets the right shapes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from rewardstream.commands.cli import main
from rewardstream.contract.decisions import decisions_topic
from rewardstream.contract.events import Topics
from rewardstream.errors import InputError
from rewardstream.kafka import local as kafka_local
from rewardstream.producers.publisher.live import KafkaSink
from tests.golden import assert_batch_files, generated_collection
from tests.processes import Processor, read_topic

pytestmark = pytest.mark.kafka

WIDE = 4  # `rewardstream kafka start`'s num.partitions

ONE_PARTITION = (
    "rewardstream: error: topic '{}' has 4 partitions; rewardstream reads it as one partition "
    "and would miss records on the others: recreate it with one partition or use another "
    "topic prefix"
)

UNEQUAL = (
    "rewardstream: error: topic '{}' has 4 partitions but '{}' has 2 partitions: they need as "
    "many (a task's input and its rollouts meet in the partition of the same number, or its "
    "run never completes): recreate one with the other's count or use another topic prefix"
)


async def _create(bootstrap: str, shapes: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, n, 1) for t, n in shapes.items()])
    finally:
        await admin.close()


async def _partitions(bootstrap: str) -> dict[str, int]:
    """Every topic's partition count, from a metadata request made now."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()}
    finally:
        await admin.close()


async def _default_partitions(bootstrap: str) -> int:
    """The broker's ``num.partitions``: what an auto-created topic gets."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        node = (await admin.describe_cluster())["brokers"][0]["node_id"]
        wanted = ConfigResource(ConfigResourceType.BROKER, str(node), {"num.partitions": None})
        (response,) = await admin.describe_configs([wanted])
        ((_, _, _, _, entries),) = response.resources
        return int(next(value for name, value, *_ in entries if name == "num.partitions"))
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def wide_broker(kafka_bootstrap: str) -> Iterator[str]:
    """A broker whose auto-created topics get several partitions: the session's when it is one
    (the shared one, a ``kafka start``), else one started here."""
    if asyncio.run(_default_partitions(kafka_bootstrap)) == WIDE:
        yield kafka_bootstrap
        return
    with kafka_local.LocalBroker(partitions=WIDE) as broker:
        yield broker.bootstrap


def _processor_refuses(bootstrap: str, prefix: str, tmp_path: Path, pool: list[Processor]) -> str:
    """``rewardstream stream``'s one error line; it exits 2 and writes nothing."""
    log, out = tmp_path / "processor.log", tmp_path / "out"
    p = Processor(bootstrap, prefix, out, log)
    pool.append(p)
    assert p.proc.wait(90) == 2, log.read_text()[-2000:]
    assert not out.exists()
    assert asyncio.run(read_topic(bootstrap, f"{prefix}.members")) == []  # never announced
    (line,) = [line for line in log.read_text().splitlines() if "error:" in line]
    return line


def _publish(bootstrap: str, prefix: str, folder: Path, *extra: str) -> int:
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    argv = ["publish", "--inputs", str(inputs), "--rollouts", str(rollouts), "--quiet"]
    return main([*argv, "--bootstrap", bootstrap, "--topic-prefix", prefix, *extra])


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("collection")
    generated_collection(folder, tasks=40, repeats=2, seed=5)
    return folder


@pytest.mark.parametrize("engine", ["members", "finals"])
def test_an_engine_topic_of_several_partitions_stops_the_processor(
    engine: str,
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    prefix = unique_name("rs")
    asyncio.run(_create(kafka_bootstrap, {f"{prefix}.{engine}": 4}))
    line = _processor_refuses(kafka_bootstrap, prefix, tmp_path, processors)
    assert line == ONE_PARTITION.format(f"{prefix}.{engine}")


@pytest.mark.parametrize("misfit", ["control", "data"])
def test_a_misshapen_topic_stops_publish_and_the_processor(
    misfit: str,
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    collection: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """control of several partitions, or inputs and rollouts of unequal counts: publish sends
    and creates nothing, the processor stops, each with the same one line."""
    prefix = unique_name("rs")
    t = Topics.for_prefix(prefix)
    planted, untouched, expected = {
        "control": ({t.control: 4}, {t.inputs, t.rollouts}, ONE_PARTITION.format(t.control)),
        "data": ({t.inputs: 4, t.rollouts: 2}, {t.control}, UNEQUAL.format(t.inputs, t.rollouts)),
    }[misfit]
    asyncio.run(_create(kafka_bootstrap, planted))
    assert _publish(kafka_bootstrap, prefix, collection) == 2
    assert capsys.readouterr().err.splitlines() == [expected]
    assert not untouched & set(asyncio.run(_partitions(kafka_bootstrap)))
    for topic in planted:
        assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []
    assert _processor_refuses(kafka_bootstrap, prefix, tmp_path, processors) == expected


async def test_the_collectors_live_sink_refuses_a_control_topic_of_several_partitions(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """The collection goes on without its live view (the sink's refusal says why)."""
    topics = Topics.for_prefix(unique_name("rs"))
    await _create(kafka_bootstrap, {topics.control: 4})
    with pytest.raises(InputError) as refused:
        await KafkaSink(kafka_bootstrap, topics).start()
    assert f"rewardstream: error: {refused.value}" == ONE_PARTITION.format(topics.control)
    assert topics.inputs not in await _partitions(kafka_bootstrap)


def test_profile_readers_refuse_a_finals_topic_of_several_partitions(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Else ``profiles get`` and ``--wait-profile`` would wait on partition 0 for a final on
    another, and ``profiles list`` would list a part of the runs."""
    prefix = unique_name("rs")
    asyncio.run(_create(kafka_bootstrap, {f"{prefix}.finals": 4}))
    where = ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    out = tmp_path / "get"
    assert main(["profiles", "get", *where, "--run-id", "r", "--out", str(out)]) == 2
    assert main(["profiles", "list", *where]) == 2
    curate = ["curate", *where, "--run-id", "r", "--min-std", "0.1"]
    assert main([*curate, "--out", str(tmp_path / "c.jsonl")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [ONE_PARTITION.format(f"{prefix}.finals")] * 3
    assert not out.exists() and not (tmp_path / "c.jsonl").exists()


def test_publish_into_a_fresh_prefix_gives_control_one_partition_and_the_run_completes(
    wide_broker: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    collection: Path,
) -> None:
    """On a broker whose auto-created topics get several partitions, the publisher creates
    control and decisions with one (a first send or read would have auto-created them wide)."""
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    assert _publish(wide_broker, prefix, collection, "--run-id", "run") == 0
    shapes = asyncio.run(_partitions(wide_broker))
    assert (shapes[topics.inputs], shapes[topics.rollouts], shapes[topics.control]) == (4, 4, 1)
    assert shapes[decisions_topic(topics)] == 1
    p = Processor(wide_broker, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    p.wait(lambda runs: runs.get("run", {}).get("done") is True)
    argv = ["profiles", "get", "--bootstrap", wide_broker, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", "run", "--out", str(tmp_path / "get"), "--timeout", "60"]) == 0
    assert_batch_files(tmp_path / "get", collection)
    shapes = asyncio.run(_partitions(wide_broker))
    assert [shapes[f"{prefix}.{t}"] for t in ("members", "finals", "profiles")] == [1, 1, 1]


def test_a_waiter_started_before_the_topics_exist_gets_the_final(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    collection: Path,
) -> None:
    """``profiles get`` (what ``--wait-profile`` runs) on a prefix that has no topic yet: it
    waits for the finals topic to be made, then for the final, never on a partition its
    client's metadata does not know (that waited out its whole timeout)."""
    prefix = unique_name("rs")
    out = tmp_path / "get"
    argv = [sys.executable, "-m", "rewardstream.commands.cli", "profiles", "get", "--bootstrap"]
    argv += [kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "run", "--out", str(out)]
    waiter = subprocess.Popen([*argv, "--timeout", "120"], stderr=subprocess.PIPE, text=True)
    try:
        assert _publish(kafka_bootstrap, prefix, collection, "--run-id", "run") == 0
        p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
        processors.append(p)
        p.wait(lambda runs: runs.get("run", {}).get("done") is True)
        _, err = waiter.communicate(timeout=150)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 0, err
    assert_batch_files(out, collection)
