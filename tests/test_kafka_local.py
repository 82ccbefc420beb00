"""The local-broker launcher itself: real JVMs and real CLI processes, no mocks."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from rewardstream.kafka import local as kafka_local

pytestmark = pytest.mark.kafka

ALREADY = (
    "a broker is already running at {bootstrap} (pid {pid}); run 'rewardstream kafka stop' first"
)


@pytest.fixture(scope="session")
def kafka_libs() -> Path:
    """The shared jar dir (downloaded at most once per machine, not per test)."""
    try:
        if shutil.which("java") is None:
            raise kafka_local.KafkaLocalError("'java' not found on PATH")
        return kafka_local.fetch_jars()
    except kafka_local.KafkaLocalError as exc:
        msg = f"launcher tests need java and the Kafka jars: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


@pytest.fixture
def cli_env(tmp_path: Path, kafka_libs: Path) -> dict[str, str]:
    """A private state dir per test, sharing the already-downloaded jars."""
    env = dict(os.environ)
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env.update(
        REWARDSTREAM_CACHE_DIR=str(tmp_path / "cache"),
        REWARDSTREAM_KAFKA_STATE_DIR=str(tmp_path / "state"),
        KAFKA_LIBS_DIR=str(kafka_libs),
    )
    return env


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rewardstream.kafka.local", "kafka", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def gone(pid: int, timeout: float = 10.0) -> bool:
    """True once the pid has vanished; init reaps the detached JVM's zombie within ~2 s."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() if Path("/proc/self").exists() else _exists(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


REPLICATION_KEYS = (
    "num.partitions",
    "default.replication.factor",
    "min.insync.replicas",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
)


async def broker_config(bootstrap: str, node_id: int) -> dict[str, str]:
    """The replication-related settings broker ``node_id`` reports (DescribeConfigs)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.BROKER, str(node_id))
        (response,) = await admin.describe_configs([resource])
        entries = response.resources[0][4]
        return {e[0]: e[1] for e in entries if e[0] in REPLICATION_KEYS}
    finally:
        await admin.close()


async def auto_created_partitions(bootstrap: str, topic: str) -> int:
    """Produce to a topic that does not exist yet; return how many partitions Kafka gave it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"x")
        return len(await producer.partitions_for(topic))
    finally:
        await producer.stop()


@pytest.fixture
def reap_leftover(cli_env: dict[str, str]) -> Iterator[None]:
    """Never leak a JVM if a test fails half-way: stop whatever the state file records."""
    yield
    state = Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]) / "broker.json"
    if state.exists():
        cli(cli_env, "stop")


@pytest.mark.usefixtures("reap_leftover")
def test_cli_start_twice_status_stop(cli_env: dict[str, str]) -> None:
    port = kafka_local.free_port()
    started = cli(cli_env, "start", "--port", str(port), "--partitions", "3")
    assert started.returncode == 0, started.stderr
    bootstrap = f"127.0.0.1:{port}"
    assert started.stdout.strip().splitlines()[-1] == f"bootstrap={bootstrap}"
    state = json.loads((Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]) / "broker.json").read_text())
    pid, workdir = state["pid"], Path(state["workdir"])
    assert state["bootstrap"] == bootstrap and state["pgid"] == pid and workdir.is_dir()
    assert [b["pid"] for b in state["brokers"]] == [pid]
    assert not gone(pid, timeout=0)
    # One broker: replication 1 and a transaction log that works on it; --partitions applies.
    assert asyncio.run(broker_config(bootstrap, 1)) == {
        "num.partitions": "3",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
    }
    assert asyncio.run(auto_created_partitions(bootstrap, "auto-created")) == 3

    second = cli(cli_env, "start")
    assert second.returncode == 1
    assert ALREADY.format(bootstrap=bootstrap, pid=pid) in second.stderr
    assert "bootstrap=" not in second.stdout

    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (
        0,
        f"running bootstrap={bootstrap} pid={pid}",
    )

    stopped = cli(cli_env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert gone(pid), f"broker pid {pid} still exists after stop"
    assert not workdir.exists()
    assert not (Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]) / "broker.json").exists()

    here = f"not running (no broker recorded in {cli_env['REWARDSTREAM_KAFKA_STATE_DIR']})"
    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (1, here)
    again = cli(cli_env, "stop")
    assert (again.returncode, again.stdout.strip()) == (0, here)


def test_cli_cleans_stale_state(cli_env: dict[str, str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=kafka_local.WORKDIR_PREFIX))
    cache = Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"])
    cache.mkdir(parents=True)
    proc = subprocess.Popen(["true"])
    proc.wait()  # its pid has certainly exited: the state file is stale
    state = {"pid": proc.pid, "pgid": proc.pid, "bootstrap": "127.0.0.1:1", "workdir": str(workdir)}
    (cache / "broker.json").write_text(json.dumps({**state, "started_at": "x"}))

    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (
        1,
        f"not running (no broker recorded in {cache})",
    )
    assert not (cache / "broker.json").exists() and not workdir.exists()
    stopped = cli(cli_env, "stop")
    assert (stopped.returncode, stopped.stdout.strip()) == (
        0,
        f"not running (no broker recorded in {cache})",
    )


@pytest.mark.usefixtures("reap_leftover")
def test_each_state_folder_sees_and_stops_only_its_own_broker(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Two projects (or two people) on one machine: a broker started for one is not "already
    running" for the other, and the other's ``stop`` never touches it."""
    started = cli(cli_env, "start")
    assert started.returncode == 0, started.stderr
    pid = json.loads((Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]) / "broker.json").read_text())
    other = {k: v for k, v in cli_env.items() if k != "REWARDSTREAM_KAFKA_STATE_DIR"}
    project = tmp_path / "project"
    project.mkdir()
    status = subprocess.run(
        [sys.executable, "-m", "rewardstream.kafka.local", "kafka", "status"],
        env=other,
        cwd=project,  # the default state folder: the project's .rewardstream/kafka
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    default = project / ".rewardstream" / "kafka"
    assert (status.returncode, status.stdout.strip()) == (
        1,
        f"not running (no broker recorded in {default})",
    )
    # ... and it says where the running one is recorded, with the command that sees it
    owner = Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]).resolve()
    pointer = f"pid(s) {pid['pid']}, recorded in {owner}: 'rewardstream kafka status --state-dir"
    assert pointer in status.stderr, status.stderr
    assert not (project / ".rewardstream").exists()  # status looks, creates nothing
    elsewhere = ["--state-dir", str(tmp_path / "elsewhere")]
    stopped = cli(cli_env, "stop", *elsewhere)
    assert (stopped.returncode, stopped.stdout.strip()) == (
        0,
        f"not running (no broker recorded in {tmp_path / 'elsewhere'})",
    )
    assert pointer in stopped.stderr, stopped.stderr
    assert not gone(pid["pid"], timeout=0)  # still running
    assert cli(cli_env, "status").returncode == 0
    assert cli(cli_env, "stop").returncode == 0
    assert gone(pid["pid"])


def test_local_broker_context_manager(kafka_libs: Path) -> None:
    with kafka_local.LocalBroker(libs=kafka_libs) as broker:
        assert broker.running and broker.pid is not None and broker.workdir is not None
        assert broker.startup_seconds is not None and 0 < broker.startup_seconds < 90
        meta = asyncio.run(kafka_local.wait_ready(broker.bootstrap, 10))
        assert meta["cluster_id"] == broker.cluster_id
        pid, workdir = broker.pid, broker.workdir
    assert not broker.running and gone(pid, timeout=0) and not workdir.exists()


def test_early_exit_reports_kafka_out(kafka_libs: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        # The controller listener binds first, so a taken controller port fails fastest.
        taken = blocker.getsockname()[1]
        broker = kafka_local.LocalBroker(
            port=kafka_local.free_port({taken}), controller_port=taken, libs=kafka_libs
        )
        with pytest.raises(kafka_local.KafkaLocalError, match="Address already in use"):
            broker.start()
    assert broker.pid is not None and gone(broker.pid, timeout=0)
    assert broker.workdir is not None and not broker.workdir.exists()


def test_port_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="port 0"):
        kafka_local.LocalBroker(port=0).start()


CLUSTER_CONFIG = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
}


@pytest.mark.usefixtures("reap_leftover")
def test_cli_cluster_status_degraded_stop(cli_env: dict[str, str]) -> None:
    """``--brokers 3``: every broker is recorded, reported and stopped by its own pid."""
    started = cli(cli_env, "start", "--brokers", "3")
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1].removeprefix("bootstrap=")
    assert len(bootstrap.split(",")) == 3
    state = json.loads((Path(cli_env["REWARDSTREAM_KAFKA_STATE_DIR"]) / "broker.json").read_text())
    pids = [b["pid"] for b in state["brokers"]]
    workdirs = [Path(b["workdir"]) for b in state["brokers"]]
    assert state["bootstrap"] == bootstrap and len(set(pids)) == 3
    assert all(w.is_dir() for w in workdirs)
    cfg = asyncio.run(broker_config(bootstrap, 2))
    assert cfg == {**CLUSTER_CONFIG, "num.partitions": str(kafka_local.CLI_PARTITIONS)}

    status = cli(cli_env, "status")
    joined = ",".join(map(str, pids))
    assert (status.returncode, status.stdout.strip()) == (
        0,
        f"running bootstrap={bootstrap} pids={joined}",
    )
    second = cli(cli_env, "start", "--brokers", "3")
    assert second.returncode == 1 and f"(pids {joined})" in second.stderr

    os.kill(pids[1], signal.SIGKILL)
    assert gone(pids[1])
    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (
        2,
        f"degraded bootstrap={bootstrap} pids={joined} down={pids[1]}",
    )

    stopped = cli(cli_env, "stop")
    assert (stopped.returncode, stopped.stdout.strip()) == (0, f"stopped pids={joined}")
    assert all(gone(pid) for pid in pids), "a broker of the cluster survived stop"
    assert not any(w.exists() for w in workdirs)
    assert cli(cli_env, "status").returncode == 1


async def _produce(bootstrap: str, topic: str, values: range) -> None:
    """acks=all (idempotent): every send returns only once min ISR (2) replicas have it."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, request_timeout_ms=10000
    )
    await producer.start()
    try:
        sent = [await producer.send(topic, str(v).encode(), key=str(v).encode()) for v in values]
        await asyncio.wait_for(asyncio.gather(*sent), 60)
    finally:
        await producer.stop()


async def _consume_all(bootstrap: str, topic: str, group: str, expected: int) -> list[int]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    values: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            values += [int(m.value or b"") for ms in batches.values() for m in ms]
    finally:
        await consumer.stop()
    return values


async def _leader_and_isr(bootstrap: str, topic: str) -> tuple[int, list[list[int]]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (desc,) = await admin.describe_topics([topic])
        parts = sorted(desc["partitions"], key=lambda p: p["partition"])
        return parts[0]["leader"], [sorted(p["isr"]) for p in parts]
    finally:
        await admin.close()


async def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])
    finally:
        await admin.close()


def test_cluster_loses_nothing_when_a_broker_is_killed(kafka_libs: Path) -> None:
    """SIGKILL the leader of a partition mid-stream: acks=all writes and reads go on, nothing
    is lost; the broker comes back and rejoins every ISR; stop leaves no JVM behind."""
    started: list[int] = []
    with kafka_local.LocalCluster(brokers=3, partitions=2, libs=kafka_libs) as cluster:
        started += cluster.pids
        bootstrap = cluster.bootstrap
        assert len(set(started)) == 3 and cluster.running
        assert asyncio.run(broker_config(bootstrap, 3)) == {**CLUSTER_CONFIG, "num.partitions": "2"}
        asyncio.run(_create_topic(bootstrap, "events"))
        asyncio.run(_produce(bootstrap, "events", range(100)))

        leader, _ = asyncio.run(_leader_and_isr(bootstrap, "events"))
        victim = leader - 1  # node id = index + 1
        os.kill(cluster.pids[victim], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while cluster.nodes[victim].running:  # polling reaps our child
            assert time.monotonic() < deadline, "SIGKILL did not end the broker"
            time.sleep(0.05)
        assert gone(started[victim]) and not cluster.running

        asyncio.run(_produce(bootstrap, "events", range(100, 200)))
        values = asyncio.run(_consume_all(bootstrap, "events", "g1", 200))
        assert sorted(values) == list(range(200))

        started.append(cluster.start_broker(victim))
        assert cluster.running and started[-1] not in started[:3]
        deadline = time.monotonic() + 30
        while (isr := asyncio.run(_leader_and_isr(bootstrap, "events"))[1]) != [[1, 2, 3]] * 3:
            assert time.monotonic() < deadline, f"ISR did not recover: {isr}"
            time.sleep(0.5)
        values = asyncio.run(_consume_all(bootstrap, "events", "g2", 200))
        assert sorted(values) == list(range(200))
        workdirs = [node.workdir for node in cluster.nodes]
    assert not cluster.running
    assert all(gone(pid) for pid in started), "a JVM of the test is still alive"
    assert not any(w is not None and w.exists() for w in workdirs)
