"""Snapshots are bounded, as real processes: a frozen peer costs a 503 naming it within the
bound, never a wait of minutes; a storm of snapshot requests shares builds, gets 429s beyond
the limits, and starves neither ``/healthz`` nor the group's heartbeats; idle connections are
closed. (A builder that dies mid-build: tests/test_snapshot.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.snapshot_storm import probing
from rewardstream.commands.cli import main
from rewardstream.contract.events import EventKind, Topics
from tests.golden import (
    assert_batch_files,
    file_events,
    generated_collection,
    partial_batch_profile,
)
from tests.processes import Processor, make_topics, send_events
from tests.test_snapshot import FRAME

PARTITIONS = 4
END = FRAME.pack(255, 0)


def _start_pair(
    bootstrap: str, prefix: str, tmp_path: Path, processors: list[Processor], extra: list[str]
) -> list[Processor]:
    """Two members of one group, each with a log of its own, once they split the partitions."""
    members = [
        Processor(bootstrap, prefix, tmp_path / "out", tmp_path / f"p{i}.log", extra=extra)
        for i in range(2)
    ]
    processors.extend(members)

    def split(_: object) -> bool:
        units = [set(p.units()) for p in members]
        return all(units) and len(set.union(*units)) == 2 * PARTITIONS

    for p in members:
        p.wait(split)
    return members


def _feed_run(
    bootstrap: str, prefix: str, tmp_path: Path, members: list[Processor], tasks: int, consumed: int
) -> tuple[Path, Path, list[tuple[EventKind, bytes]], int]:
    """A run with its inputs, ``consumed`` rollouts and its RunStarted, seen by both members."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=tasks, repeats=2, seed=7)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    send_events(
        bootstrap, Topics.for_prefix(prefix), [*events[: n_in + consumed], events[-1]], "run"
    )
    for p in members:
        p.wait(lambda runs: runs.get("run", {}).get("rollouts") == consumed)
        p.wait(lambda runs: runs["run"]["expected_rollouts"] is not None)
    return inputs, rollouts, events, n_in


@pytest.mark.kafka
def test_a_frozen_peer_costs_a_503_naming_it_within_the_bound(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    bound = 3.0
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), PARTITIONS))
    a, b = _start_pair(
        kafka_bootstrap, prefix, tmp_path, processors, ["--snapshot-timeout", str(bound)]
    )
    inputs, rollouts, _, _ = _feed_run(kafka_bootstrap, prefix, tmp_path, [a, b], 200, 150)
    mine, frozen = sorted(a.units()), sorted(b.units())
    cmd = [
        sys.executable,
        "-m",
        "rewardstream.commands.cli",
        "snapshot",
        "--url",
        a.url,
        "--run-id",
        "run",
    ]
    b.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = subprocess.run(
            [*cmd, "--out", str(tmp_path / "snap")], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - started
        assert sorted(a.units()) == mine  # the group has not moved b's partitions meanwhile
    finally:
        b.proc.send_signal(signal.SIGCONT)
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rewardstream: error: snapshot failed: HTTP 503 "), line
    assert b.url in line and all(unit in line for unit in frozen), line
    assert took < bound + 10, took  # the bound, plus starting the command on a loaded machine
    assert not (tmp_path / "snap").exists()

    # b answers again: the snapshot is whole, equal to batch
    argv = ["snapshot", "--url", a.url, "--run-id", "run", "--out", str(tmp_path / "snap")]
    assert main(argv) == 0
    lines = rollouts.read_bytes().splitlines(keepends=True)[:150]
    partial_batch_profile(inputs, lines, tmp_path / "batch", "r")
    assert_batch_files(tmp_path / "snap", tmp_path / "batch")


def _post(url: str) -> tuple[int, str | None, bytes]:
    """A snapshot request: its status, Retry-After and body (read to its Content-Length)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/runs/run/snapshot")
        response = conn.getresponse()
        body = response.read()  # http.client raises IncompleteRead on a short body
        if response.status == 200:
            assert int(response.headers["Content-Length"]) == len(body)
        return response.status, response.headers.get("Retry-After"), body
    finally:
        conn.close()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.kafka
def test_a_storm_of_snapshots_shares_builds_gets_429s_and_starves_nothing(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    storm, idle, requests = 48, 100, 8
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), PARTITIONS))
    extra = ["--max-snapshot-builds", "1", "--max-snapshot-requests", str(requests)]
    extra += ["--http-idle-timeout", "3"]
    a, b = _start_pair(kafka_bootstrap, prefix, tmp_path, processors, extra)
    _, _, events, n_in = _feed_run(kafka_bootstrap, prefix, tmp_path, [a, b], 2000, 2000)
    assigned = [p.log.read_text().count(" assigned ") for p in (a, b)]

    sockets = [socket.create_connection(("127.0.0.1", a.port), timeout=30) for _ in range(idle)]
    try:
        with (
            probing(a.url) as (latencies, unanswered),
            concurrent.futures.ThreadPoolExecutor(storm) as pool,
        ):
            answers = list(pool.map(_post, [a.url] * storm))
        statuses = sorted(status for status, _, _ in answers)
        assert set(statuses) <= {200, 429} and 429 in statuses, statuses
        assert all(int(retry or 0) >= 1 for status, retry, _ in answers if status == 429)
        served = [body for status, _, body in answers if status == 200]
        assert served and all(body == served[0] and body.endswith(END) for body in served)
        builds = _metric(a.url, "rewardstream_snapshot_builds_total")
        assert builds < len(served), (builds, len(served))  # shared
        assert latencies and unanswered == [0], unanswered  # /healthz answered throughout
        for s in sockets:  # idle connections closed by the server
            assert s.recv(1) == b""
    finally:
        for s in sockets:
            s.close()
    send_events(kafka_bootstrap, Topics.for_prefix(prefix), events[n_in + 2000 : -1], "run")
    a.wait(lambda runs: runs.get("run", {}).get("done") is True)  # and it folds on
    for p, before in zip((a, b), assigned, strict=True):
        text = p.log.read_text()
        assert text.count(" assigned ") == before, text[-3000:]  # no rebalance
        assert "Heartbeat session expired" not in text and "UnknownMemberId" not in text
