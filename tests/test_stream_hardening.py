"""The stream processor as a user meets it: one line and exit 2 for what stops it, one log
line and on for what does not, and a healthy start that logs no error."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rewardstream.commands.cli import main
from rewardstream.contract.events import Topics
from rewardstream.processors.stream import StreamProcessor
from tests.golden import assert_batch_files, file_events, generated_collection
from tests.processes import Processor, make_topics, send_events


def _stream(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "rewardstream.commands.cli",
        "stream",
        "--bootstrap",
        bootstrap,
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_busy_http_port_is_one_line(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _stream(
            kafka_bootstrap, "--topic-prefix", unique_name("rs"), "--http", f"127.0.0.1:{port}"
        )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rewardstream: error: --http 127.0.0.1:{port}: ")
    assert "in use" in last


def test_a_first_start_logs_no_error(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Topics the broker creates on first use and a new group's coordinator are not errors."""
    log = tmp_path / "processor.log"
    p = Processor(kafka_bootstrap, unique_name("fresh"), tmp_path / "out", log)  # no topics yet
    processors.append(p)
    p.wait(lambda _: bool(p.units()))
    p.kill(signal.SIGTERM)
    text = log.read_text()
    assert p.proc.returncode == 0, text[-2000:]
    assert " ERROR " not in text, text
    assert "serving snapshots, parts and metrics on http://127.0.0.1:" in text


def test_an_unwritable_mirror_is_a_log_line_and_the_final_is_in_kafka(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=30, repeats=2, seed=3)
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    out.mkdir()
    (out / "run").write_text("a file where the run's folder goes\n")
    p = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(p)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "run", "r", True), "run")
    p.wait(lambda runs: runs.get("run", {}).get("done") is True)
    got = tmp_path / "got"
    argv = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", "run", "--out", str(got), "--timeout", "60"]) == 0
    assert_batch_files(got, inputs.parent)
    assert p.proc.poll() is None  # still serving
    text = log.read_text()
    assert "Traceback" not in text
    assert f"run run: the final profile is in Kafka but not in {out}" in text
    assert (out / "run").read_text() == "a file where the run's folder goes\n"


@contextlib.contextmanager
def _tiny_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``folder`` (root only), unmounted after."""
    folder.mkdir(parents=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    ).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_state_folder_stops_the_processor_with_one_line(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Scratch full: the state is in Kafka, so the processor stops (exit 2, one line naming
    the file) for a restart elsewhere to rebuild, instead of folding on without it."""
    inputs, rollouts = generated_collection(
        tmp_path / "data", tasks=200, repeats=4, seed=4, text_bytes=2000
    )  # ~2 MB of sample rows
    prefix, log = unique_name("rs"), tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 1))
    with _tiny_disk(tmp_path / "state", "512k") as state:
        p = Processor(
            kafka_bootstrap, prefix, tmp_path / "out", log, extra=["--state-dir", str(state)]
        )
        processors.append(p)
        send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "run", "r", True), "run")
        assert p.proc.wait(90) == 2, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("rewardstream: error: ") and str(state) in last, last
    assert last.endswith("No space left on device; stopping"), last


def test_clients_that_misbehave_leave_no_traceback_in_the_log(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A malformed request, a client gone mid-snapshot: an HTTP answer or nothing, never a
    traceback in the processor's log."""
    inputs, rollouts = generated_collection(
        tmp_path / "data", tasks=3000, repeats=2, seed=5, text_bytes=500
    )
    prefix, log = unique_name("rs"), tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 1))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", log)
    processors.append(p)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "run", "r", False), "run")
    p.wait(lambda runs: runs.get("run", {}).get("rollouts") == 6000)
    host, port = "127.0.0.1", int(p.url.rsplit(":", 1)[1])
    for request in (
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /runs HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS hello
    ):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(request)
            sock.recv(65536)  # an error answer, or the connection closed
    for _ in range(3):  # ask for a snapshot and hang up after its first bytes
        with socket.create_connection((host, port), timeout=30) as sock:
            sock.sendall(
                b"POST /runs/run/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            )
            sock.recv(1024)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    assert p.runs()["run"]["rollouts"] == 6000  # still serving
    # the last hang-up is noticed when the whole body's next write fails: wait for it
    gone = "/runs/run/snapshot: the client went away"
    deadline = time.monotonic() + 60
    while log.read_text().count(gone) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    p.kill(signal.SIGTERM)
    text = log.read_text()
    assert p.proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and " ERROR " not in text, text[-5000:]
    assert text.count(gone) == 3


def test_members_starting_together_claim_one_output_dir(tmp_path: Path) -> None:
    """The claim file is never seen empty: it used to be created, then written, and a member
    starting at that moment refused the folder as unreadable (CI: "processor exited")."""
    for attempt in range(200):
        out = tmp_path / f"out-{attempt}"
        go, start = os.pipe()
        children = []
        for _ in range(3):
            pid = os.fork()
            if not pid:
                code = 1
                try:
                    member = StreamProcessor("127.0.0.1:9", out, state_dir=tmp_path / "s")
                    os.read(go, 1)  # all at once
                    member.finals.claim_output_dir()
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        os.write(start, b"go!")
        os.close(go)
        os.close(start)
        assert [os.waitpid(pid, 0)[1] for pid in children] == [0, 0, 0], attempt
        assert [p.name for p in out.iterdir()] == [".rewardstream-owner.json"]


def test_an_open_page_does_not_hold_a_stop_back(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A browser's event stream open on the live page: SIGTERM still stops the processor
    promptly with 0 (aiohttp waited for the endless handler, about two minutes)."""
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 1))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    p.wait(lambda runs: p.units() != {})
    host, port = "127.0.0.1", int(p.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while b"data: " not in received:  # the stream is open and pushing
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(60) == 0  # a bound for a loaded machine, far below the old ~120 s
