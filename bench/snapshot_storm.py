"""A storm of snapshots against a processor: does it starve ``/healthz``, folding, the group?

    python -m bench.snapshot_storm --bootstrap HOST:PORT [--snapshots 200] [--idle 300]
    python -m bench.snapshot_storm --self-test

Two processors (real child processes) share a run's partitions; with the run half consumed,
``--idle`` sockets are opened to one of them and left silent, then ``--snapshots`` concurrent
``POST /runs/<id>/snapshot`` are sent to it while the rest of the run is published. Meanwhile
``/healthz`` is asked every 50 ms. Reported: the answers by status, the builds they took
(``rewardstream_snapshot_builds_total``), ``/healthz`` latency (p50, p99, max, unanswered within
3 s), rollouts folded during the storm, and the group's rebalances (``assigned`` lines,
``Heartbeat session expired`` in the processors' logs). Exit status 1 when ``/healthz`` p99 is
1 s or more, a probe went unanswered, nothing was folded, or the group rebalanced.

``--self-test`` points the same storm and probes at a server whose snapshot handler blocks its
event loop for 0.2 s: the report must say ``/healthz`` was starved (else the bench could not
see what it is for).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import http.client
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from aiohttp import web

from bench.generate import generate
from rewardstream.contract.events import Topics
from rewardstream.kafka.local import free_port
from tests.golden import file_events
from tests.processes import Processor, make_topics, send_events

PARTITIONS = 4


class Storm(NamedTuple):
    statuses: dict[int, int]  # status -> answers
    answer_s: list[float]
    healthz_s: list[float]  # answered probes' latencies
    unanswered: int  # probes without an answer within 3 s

    def p(self, q: float) -> float:
        ordered = sorted(self.healthz_s) or [float("inf")]
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def starved(self) -> bool:
        return self.unanswered > 0 or self.p(0.99) >= 1.0

    def report(self) -> str:
        answers = " ".join(f"{k}x{v}" for k, v in sorted(self.statuses.items()))
        return (
            f"answers {answers}; answer time median {statistics.median(self.answer_s):.2f} s, "
            f"max {max(self.answer_s):.2f} s; /healthz {len(self.healthz_s)} answered: "
            f"p50 {self.p(0.5) * 1000:.0f} ms, p99 {self.p(0.99) * 1000:.0f} ms, "
            f"max {max(self.healthz_s, default=0) * 1000:.0f} ms, {self.unanswered} unanswered"
        )


def _post(host: str, port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except OSError:
        return 0, time.monotonic() - started  # 0: no answer
    finally:
        conn.close()


@contextlib.contextmanager
def probing(url: str) -> Iterator[tuple[list[float], list[int]]]:
    """``/healthz`` every 50 ms: answered latencies, and a count of probes unanswered in 3 s."""
    answered: list[float] = []
    unanswered = [0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.wait(0.05):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=3) as r:
                    r.read()
                answered.append(time.monotonic() - started)
            except OSError:
                unanswered[0] += 1

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield answered, unanswered
    finally:
        stop.set()
        thread.join(10)


def storm(url: str, run_id: str, snapshots: int, idle: int) -> Storm:
    """``snapshots`` concurrent snapshot requests with ``idle`` silent sockets open, while
    ``/healthz`` is probed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(idle)]
    try:
        with (
            probing(url) as (answered, unanswered),
            concurrent.futures.ThreadPoolExecutor(snapshots) as pool,
        ):
            path = f"/runs/{run_id}/snapshot"
            answers = list(pool.map(lambda _: _post(host, int(port), path), range(snapshots)))
    finally:
        for s in sockets:
            s.close()
    statuses: dict[int, int] = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    return Storm(statuses, [t for _, t in answers], answered, unanswered[0])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def _folded(p: Processor) -> int:
    """Records the processor has consumed: the sum of its units' positions."""
    return sum(p.units().values())


def bench(bootstrap: str, snapshots: int, idle: int, tasks: int, repeats: int) -> bool:
    """The storm against real processors; True when nothing was starved."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate(tasks, repeats, work / "r", text_bytes=64, seed=1)
        events = file_events(
            work / "r_materialized_inputs.jsonl", work / "r.jsonl", "run", "r", finish=False
        )
        n_in = sum(1 for k, _ in events if k == "input")
        half = n_in + (len(events) - n_in) // 2
        prefix = f"storm-{os.getpid()}-{int(time.time())}"
        topics = Topics.for_prefix(prefix)
        asyncio.run(make_topics(bootstrap, topics, PARTITIONS))
        members = [
            Processor(bootstrap, prefix, work / "out", work / f"p{i}.log", checkpoint_every=5)
            for i in range(2)
        ]
        try:

            def split(_: object) -> bool:
                units = [set(p.units()) for p in members]
                return all(units) and len(set.union(*units)) == 2 * PARTITIONS

            for p in members:
                p.wait(split, timeout=120)
            send_events(bootstrap, topics, [*events[:half], events[-1]], "run")  # + RunStarted
            target = members[0]
            target.wait(lambda runs: runs.get("run", {}).get("expected_rollouts") is not None)
            assigned = [p.log.read_text().count(" assigned ") for p in members]
            feeder = threading.Thread(  # folding has work throughout the storm
                target=send_events, args=(bootstrap, topics, events[half:-1], "run")
            )
            before = _folded(target)
            feeder.start()
            result = storm(target.url, "run", snapshots, idle)
            folded = _folded(target) - before
            builds = _get(f"{target.url}/metrics").decode()
            builds = next(
                line.rsplit(" ", 1)[1]
                for line in builds.splitlines()
                if line.startswith("rewardstream_snapshot_builds_total")
            )
            feeder.join()
            logs = [p.log.read_text() for p in members]
            rebalances = sum(t.count(" assigned ") for t in logs) - sum(assigned)
            expired = sum(t.count("Heartbeat session expired") for t in logs)
        finally:
            for p in members:
                if p.proc.poll() is None:
                    p.kill(signal.SIGTERM)
    print(result.report())
    print(
        f"builds {float(builds):.0f}; records folded by the target during the storm {folded:,}; "
        f"rebalances {rebalances}; heartbeat sessions expired {expired}"
    )
    ok = not result.starved() and folded > 0 and rebalances == 0 and expired == 0
    print("OK" if ok else "STARVED")
    return ok


def self_test(snapshots: int, idle: int) -> bool:
    """The storm against a snapshot handler that blocks its event loop: reported starved."""

    async def blocking(_: web.Request) -> web.Response:
        time.sleep(0.2)  # what a snapshot built on the event loop would do
        return web.Response(text="built on the loop")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/runs/{run_id}/snapshot", blocking)
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        started.set()
        await asyncio.Event().wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    started.wait(10)
    result = storm(f"http://127.0.0.1:{port}", "run", snapshots, idle)
    print(result.report())
    seen = result.starved()
    print(f"self-test: a handler blocking the event loop {'is' if seen else 'is NOT'} reported")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--snapshots", type=int, default=200)
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(0 if self_test(min(a.snapshots, 50), a.idle) else 1)
    if not a.bootstrap:
        ap.error("--bootstrap (or KAFKA_BOOTSTRAP_SERVERS) is required")
    sys.exit(0 if bench(a.bootstrap, a.snapshots, a.idle, a.tasks, a.repeats) else 1)


if __name__ == "__main__":
    main()
