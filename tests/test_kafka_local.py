"""The local-broker launcher itself: real JVMs and real CLI processes, no mocks."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewardstream import kafka_local

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
    env.update(REWARDSTREAM_CACHE_DIR=str(tmp_path / "cache"), KAFKA_LIBS_DIR=str(kafka_libs))
    return env


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rewardstream.kafka_local", "kafka", *args],
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


@pytest.fixture
def reap_leftover(cli_env: dict[str, str]) -> Iterator[None]:
    """Never leak a JVM if a test fails half-way: stop whatever the state file records."""
    yield
    state = Path(cli_env["REWARDSTREAM_CACHE_DIR"]) / "broker.json"
    if state.exists():
        cli(cli_env, "stop")


@pytest.mark.usefixtures("reap_leftover")
def test_cli_start_twice_status_stop(cli_env: dict[str, str]) -> None:
    port = kafka_local.free_port()
    started = cli(cli_env, "start", "--port", str(port))
    assert started.returncode == 0, started.stderr
    bootstrap = f"127.0.0.1:{port}"
    assert started.stdout.strip().splitlines()[-1] == f"bootstrap={bootstrap}"
    state = json.loads((Path(cli_env["REWARDSTREAM_CACHE_DIR"]) / "broker.json").read_text())
    pid, workdir = state["pid"], Path(state["workdir"])
    assert state["bootstrap"] == bootstrap and state["pgid"] == pid and workdir.is_dir()
    assert not gone(pid, timeout=0)

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
    assert not (Path(cli_env["REWARDSTREAM_CACHE_DIR"]) / "broker.json").exists()

    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (1, "not running")
    again = cli(cli_env, "stop")
    assert (again.returncode, again.stdout.strip()) == (0, "not running")


def test_cli_cleans_stale_state(cli_env: dict[str, str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=kafka_local.WORKDIR_PREFIX))
    cache = Path(cli_env["REWARDSTREAM_CACHE_DIR"])
    cache.mkdir(parents=True)
    proc = subprocess.Popen(["true"])
    proc.wait()  # its pid has certainly exited: the state file is stale
    state = {"pid": proc.pid, "pgid": proc.pid, "bootstrap": "127.0.0.1:1", "workdir": str(workdir)}
    (cache / "broker.json").write_text(json.dumps({**state, "started_at": "x"}))

    status = cli(cli_env, "status")
    assert (status.returncode, status.stdout.strip()) == (1, "not running")
    assert not (cache / "broker.json").exists() and not workdir.exists()
    stopped = cli(cli_env, "stop")
    assert (stopped.returncode, stopped.stdout.strip()) == (0, "not running")


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
