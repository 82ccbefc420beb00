"""Snapshots built by forked children: equal to batch, consistent while ingestion goes on, and a
broken or hostile stream never writes a file."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from bench.generate import generate
from rewardstream.contract.events import EventKind
from rewardstream.kafka.local import free_port
from rewardstream.processors.core.profile import TaskRow
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app, serve
from rewardstream.processors.http.snapshot import SnapshotJob, _task_frames
from rewardstream.sinks.files import task_lines
from rewardstream.sinks.snapshot_wire import (
    CHUNK,
    MEDIA_TYPE,
    SnapshotError,
    SnapshotHead,
    frames,
    receive,
)
from tests.golden import (
    GoldenCase,
    assert_batch_files,
    file_events,
    partial_batch_profile,
    profiled_cases,
)

CASES = profiled_cases()
FRAME = struct.Struct(">BI")
NAMES = ["r_reward_profiling.jsonl", "r_agent_metrics.json", "r_repeat_level_metrics.json"]


def take(pipeline: Pipeline, run_id: str, out: Path) -> SnapshotHead:
    """A snapshot through the real fork and pipe, read back as the CLI reads it."""
    job = SnapshotJob(pipeline, run_id)
    with open(job.fd, "rb") as fh:
        head = receive(fh, out, "test")
    assert job.wait() == 0
    return head


def feed(pipeline: Pipeline, events: list[tuple[EventKind, bytes]]) -> None:
    for kind, raw in events:
        assert pipeline.handle(kind, raw) is not None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_snapshot_of_a_golden_equals_its_partial_batch_profile(
    case: GoldenCase, tmp_path: Path
) -> None:
    inputs = case.source / f"{case.stem}_materialized_inputs.jsonl"
    rollouts = case.source / f"{case.stem}.jsonl"
    events = file_events(inputs, rollouts, "g", case.stem, finish=False)
    lines = rollouts.read_bytes().splitlines(keepends=True)
    keep = (len(lines) + 1) // 2  # the first half of the rollouts consumed
    data = [e for e in events if e[0] != "rollout"]
    data += [e for e in events if e[0] == "rollout"][:keep]
    with Pipeline(tmp_path / "proc") as pipeline:
        feed(pipeline, data)
        head = take(pipeline, "g", tmp_path / "snap")
    assert (head.rollouts, head.run_id) == (keep, "g")
    partial_batch_profile(inputs, lines[:keep], tmp_path / "batch", case.stem)
    assert_batch_files(tmp_path / "snap", tmp_path / "batch", case.stem)


def test_two_renderers_and_ingestion_during_the_snapshot(tmp_path: Path) -> None:
    """Enough tasks for the second renderer; events handled after the fork are not in it."""
    generate(2_500, 2, tmp_path / "r", text_bytes=16, seed=3)
    inputs, rollouts = tmp_path / "r_materialized_inputs.jsonl", tmp_path / "r.jsonl"
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    lines = rollouts.read_bytes().splitlines(keepends=True)
    data = [e for e in events if e[0] != "rollout"]
    later = [e for e in events if e[0] == "rollout"]
    cut = len(later) - 700
    with Pipeline(tmp_path / "proc") as pipeline:
        feed(pipeline, data + later[:cut])
        job = SnapshotJob(pipeline, "run")
        feed(pipeline, later[cut:])  # ingestion goes on while the children build
        with open(job.fd, "rb") as fh:
            head = receive(fh, tmp_path / "snap", "test")
        assert job.wait() == 0
        assert pipeline.runs["run"].rollouts == len(later)
    assert head.rollouts == cut
    assert head.files == NAMES
    partial_batch_profile(inputs, lines[:cut], tmp_path / "batch", "r")
    assert_batch_files(tmp_path / "snap", tmp_path / "batch")


def test_task_frames_are_the_frames_of_the_rendered_lines() -> None:
    """The renderers join each frame from the rows' pieces: the same bytes, cut at the same
    places, as framing the lines rendered one by one (here over several frames, a row
    straddling none)."""
    samples = {i: b'{"s":%d}' % i * (i % 7) for i in range(400)}
    rows = [TaskRow(b"h%d" % i * (i * 37 % 5000), i, b"t\n" * (i % 3 + 1)) for i in range(400)]
    want = list(frames(0, task_lines(rows, samples.__getitem__)))
    assert len(want) > 2
    assert list(_task_frames(rows, samples.__getitem__)) == want
    assert list(_task_frames([], samples.__getitem__)) == []


def test_unknown_run_is_a_key_error(tmp_path: Path) -> None:
    with Pipeline(tmp_path) as pipeline, pytest.raises(KeyError):
        SnapshotJob(pipeline, "nope")


def stream(files: list[bytes], names: list[object] | None = None, end: bool = True) -> bytes:
    head = {"run_id": "r", "rollouts": 1, "inputs": 1, "offsets": {}, "files": names or NAMES}
    body = orjson.dumps(head) + b"\n"
    body += b"".join(FRAME.pack(i, len(f)) + f for i, f in enumerate(files))
    return body + (FRAME.pack(255, 0) if end else b"")


def test_receive_writes_all_three_files(tmp_path: Path) -> None:
    receive(io.BytesIO(stream([b"[1]", b"[]", b""])), tmp_path, "test")
    assert sorted(os.listdir(tmp_path)) == sorted(NAMES)
    assert (tmp_path / NAMES[0]).read_bytes() == b"[1]"
    assert (tmp_path / NAMES[2]).read_bytes() == b""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (stream([b"[1]", b"[]", b"{}\n"], end=False), "cut short"),
        (stream([b"[1]", b"[]", b"{}\n"])[:-9], "cut short"),
        (b'{"error": "rollouts without input rows"}\n', "rollouts without input rows"),
        (b"<html>\n", "did not answer with a snapshot"),
        (stream([b"[1]"], names=["../r_agent_metrics.json", *NAMES[1:]]), "other than"),
        (stream([b"[1]"], names=["/etc/r_agent_metrics.json", *NAMES[1:]]), "other than"),
        (stream([b"[1]"], names=[NAMES[0], NAMES[0], NAMES[2]]), "other than"),
        (stream([b"[1]"], names=[1, 2, 3]), "other than"),
        (stream([b"[1]", b"[]", b"{}\n"])[:-5] + FRAME.pack(0, 0) + FRAME.pack(255, 0), "order"),
    ],
    ids=[
        "no-end",
        "truncated",
        "error",
        "not-ours",
        "dotdot",
        "absolute",
        "twice",
        "types",
        "order",
    ],
)
def test_a_bad_stream_writes_nothing(body: bytes, message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SnapshotError, match=message):
        receive(io.BytesIO(body), out, "test")
    assert not out.exists() or not os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == (["out"] if out.exists() else [])


@contextlib.asynccontextmanager
async def large_run_served(tmp_path: Path) -> AsyncIterator[str]:
    """The snapshot URL of a run of ~20 MB (many pipe writes) on a real endpoint."""
    generate(3_000, 2, tmp_path / "r", text_bytes=2_000, seed=5)
    events = file_events(
        tmp_path / "r_materialized_inputs.jsonl", tmp_path / "r.jsonl", "run", "r", finish=False
    )
    with Pipeline(tmp_path / "proc") as pipeline:
        feed(pipeline, events)
        port = free_port()
        runner, _ = await serve(make_app(pipeline, None), "127.0.0.1", port)
        try:
            yield f"http://127.0.0.1:{port}/runs/run/snapshot"
        finally:
            await runner.cleanup()


async def test_a_client_gone_mid_stream_stops_the_children(tmp_path: Path) -> None:
    """The endpoint reaps the builders of an abandoned snapshot, and keeps serving."""
    async with large_run_served(tmp_path) as url:
        before = set(_children())  # other tests' processes may still be going away
        async with aiohttp.ClientSession() as session:
            async with session.post(url) as response:
                assert response.headers["Content-Type"] == MEDIA_TYPE
                await response.content.readline()
                response.close()  # gone, with most of the body unread
            for _ in range(100):
                if not set(_children()) - before:
                    break
                await asyncio.sleep(0.05)
            assert set(_children()) - before == set()
            async with session.post(url) as response:  # and the next one is whole
                assert response.status == 200
                assert (await response.read()).endswith(FRAME.pack(255, 0))


def _wrote(pid: str) -> bool:
    """Whether process ``pid`` has written more than a frame (its head went with the first)."""
    with contextlib.suppress(OSError):
        io = Path(f"/proc/{pid}/io").read_text()
        return int(io.split("wchar:")[1].split()[0]) > CHUNK
    return False


async def test_a_builder_that_dies_mid_build_is_a_503_never_a_short_200(tmp_path: Path) -> None:
    """The builder killed once it has sent its head: the answer is a 503 saying so, not a 200
    whose body (complete as far as HTTP can tell) lacks its end."""
    async with large_run_served(tmp_path) as url, aiohttp.ClientSession() as session:
        before = set(_children())
        posted = asyncio.ensure_future(session.post(url))
        deadline = time.monotonic() + 30
        while not (builders := [c for c in set(_children()) - before if _wrote(c)]):
            assert time.monotonic() < deadline, "no snapshot builder wrote anything"
            await asyncio.sleep(0.001)
        (builder,) = builders
        state = Path(f"/proc/{builder}/stat").read_text().rsplit(")", 1)[1].split()[0]
        os.killpg(int(builder), signal.SIGKILL)
        assert state != "Z", "the builder was done before it could be killed"
        async with await posted as response:
            body = await response.read()
            assert response.status == 503, (response.status, body[-20:])
            assert b"snapshot worker failed" in body
        async with session.post(url) as response:  # and the next one is whole, with its length
            assert response.status == 200
            body = await response.read()
            assert int(response.headers["Content-Length"]) == len(body)
            assert body.endswith(FRAME.pack(255, 0))


def _children() -> list[str]:
    """This process's children (live or zombie), from /proc."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[1] == me:
                    found.append(entry)
    return found
