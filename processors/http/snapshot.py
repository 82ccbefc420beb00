"""Partial profiles of a live run: built in forked children, whole before they are sent.

Why fork: the child sees the run's state exactly as it was when the request came (copy-on-write:
consistent, and no copy to make), while the parent keeps ingesting on its own core; and once the
profile's numbers are built, a helper child renders the second half of the task rows and the
agent-level files while the first renders and sends the first half, so a snapshot uses two
cores. The parent spools what they send to a file and answers with it once it is whole (with its
length), within a bound; the requests for a run at the same positions share one build, and
beyond a bound on builds and requests the answer is "busy" (:class:`Snapshots`).

The wire form and the client end are in :mod:`rewardstream.sinks.snapshot_wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson
from prometheus_client import CollectorRegistry, Counter

from rewardstream.errors import RewardstreamError
from rewardstream.infra.forking import fork
from rewardstream.processors.core.profile import TaskRow, build_profile
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import PartView
from rewardstream.sinks.files import ProfilePaths, aggregate_files
from rewardstream.sinks.snapshot_wire import (
    CHUNK,
    END,
    FRAME,
    HEAD_LIMIT,
    SnapshotError,
    SnapshotHead,
    frames,
)

__all__ = ["Busy", "SnapshotJob", "SnapshotLimits", "SnapshotUnavailable", "Snapshots"]

_SPLIT_MIN = 2_000  # task rows below which the helper renders none of them
# the first renderer's share of the rows: the helper also computes the agent-level metrics,
# which cost about a third of rendering all rows (100,000 tasks x 8: 0.35 s of 1 s), and the
# aggregate and difficulty files when asked for (0.43 s more)
_FIRST_SHARE = 0.67
_FIRST_SHARE_AGGREGATES = 0.85


def _fork(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child (:func:`rewardstream.infra.forking.fork`)."""
    return fork(work, lambda exc: print(f"snapshot worker failed: {exc!r}", file=sys.stderr))


def _task_frames(rows: Iterable[TaskRow], sample: Callable[[int], bytes]) -> Iterator[bytes]:
    """The task rows' lines as frames of file 0, cut where :func:`frames` cuts them, each
    frame joined once from its rows' pieces (head, sample, tail): rendering each line first
    copied the whole file once more (15% of the framing's time, ~0.05 s at 100,000 tasks)."""
    pieces, size = [b""], 0
    for head, locator, tail in rows:
        value = sample(locator)
        pieces += (head, value, tail)
        size += len(head) + len(value) + len(tail)
        if size >= CHUNK:
            pieces[0] = FRAME.pack(0, size)
            yield b"".join(pieces)
            pieces, size = [b""], 0
    if size:
        pieces[0] = FRAME.pack(0, size)
        yield b"".join(pieces)


def _final_files(pipeline: Pipeline, run_id: str, paths: ProfilePaths, out: BinaryIO) -> None:
    """A done run's snapshot is its final files: its state is dropped once they are written
    (:meth:`Pipeline.mark_final`), and they are what a snapshot of every rollout would give."""
    run = pipeline.runs[run_id]
    order = [*paths, *(p for p in paths.extras() if p.exists())]
    files = [p.name for p in order]
    head = SnapshotHead(run_id, run.rollouts, run.inputs, pipeline.positions(), files)
    out.write(orjson.dumps(head._asdict(), option=orjson.OPT_APPEND_NEWLINE))
    for index, path in enumerate(order):
        with open(path, "rb") as fh:
            out.writelines(frames(index, iter(functools.partial(fh.read, CHUNK), b"")))
    out.write(FRAME.pack(END, 0))


def _build(
    pipeline: Pipeline,
    run_id: str,
    received: dict[str, PartView],
    offsets: dict[str, int],
    out: BinaryIO,
) -> None:
    """The child's work: merge the run's parts, build the profile, stream the files."""
    source = pipeline.snapshot_source(run_id, received, offsets)
    state = source.merged.state
    try:
        profile = build_profile(state, allow_partial=True)
    except RewardstreamError as exc:
        out.write(orjson.dumps({"error": str(exc)}, option=orjson.OPT_APPEND_NEWLINE))
        return
    paths: ProfilePaths = source.paths
    aggregates = pipeline.aggregates(pipeline.runs[run_id])
    order = [*paths, *(paths.extras() if aggregates is not None else [])]
    head = SnapshotHead(
        run_id, state.num_results, state.num_inputs, source.offsets, [p.name for p in order]
    )
    out.write(orjson.dumps(head._asdict(), option=orjson.OPT_APPEND_NEWLINE))
    rows, sample = profile.task_rows, source.merged.sample
    share = _FIRST_SHARE if aggregates is None else _FIRST_SHARE_AGGREGATES
    split = round(len(rows) * share) if len(rows) >= _SPLIT_MIN else len(rows)
    source.spool_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=source.spool_dir) as spool:

        def second_half() -> None:  # rows after the split, then the agent-level files
            spool.writelines(_task_frames(rows.range(split, len(rows)), sample))
            spool.writelines(frames(1, [orjson.dumps(profile.agent_metrics)]))
            spool.writelines(frames(2, [orjson.dumps(profile.repeat_metrics)]))
            if aggregates is not None:
                extra = aggregate_files(profile, paths, aggregates)
                for index, (_, blocks) in enumerate(extra, start=3):
                    spool.writelines(frames(index, blocks))
            spool.flush()

        helper = _fork(second_half)
        out.writelines(_task_frames(rows.range(0, split), sample))
        _, status = os.waitpid(helper, 0)
        if status:
            raise RuntimeError(f"snapshot renderer exited with status {status}")
        spool.seek(0)
        shutil.copyfileobj(spool, out, CHUNK)
    out.write(FRAME.pack(END, 0))


class SnapshotJob:
    """A snapshot being built by a forked child: read its stream, then :meth:`close`."""

    def __init__(
        self,
        pipeline: Pipeline,
        run_id: str,
        received: dict[str, PartView] | None = None,
        offsets: dict[str, int] | None = None,
        final: ProfilePaths | None = None,
    ) -> None:
        """Fork now: the snapshot covers exactly what ``pipeline`` has consumed at this call,
        with the parts ``received`` from peers (covering the units to ``offsets``). A done run's
        snapshot is its ``final`` files (default: where the in-process transport wrote them).

        Raises KeyError for an unknown run.
        """
        run = pipeline.runs[run_id]
        if final is None and run.terminal is not None:
            final = pipeline.paths(run)
        read, write = os.pipe()

        def work() -> None:
            os.close(read)
            with open(write, "wb", buffering=CHUNK) as out:
                if final is not None:
                    _final_files(pipeline, run_id, final, out)
                else:
                    _build(pipeline, run_id, received or {}, offsets or {}, out)

        self.pid: int | None = _fork(work)
        os.close(write)
        self.fd = read

    def wait(self) -> int:
        """Reap the child (blocking); its exit status."""
        if self.pid is None:
            return 0
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        return status

    def kill(self) -> None:
        """Stop the child and its helper (the client went away), then reap it."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.wait()

    async def spool(self, path: Path) -> None:
        """The whole stream into ``path``, so that a response is sent only once it is whole
        (with its length: a body cut short in transit can never pass for a whole one). Raises
        :class:`SnapshotError` if the build failed before its head (e.g. rollouts without input
        rows), :class:`SnapshotUnavailable` if the child died later. Cancelled (its deadline, or
        every asker gone): the children are killed, then reaped."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=HEAD_LIMIT, loop=loop)
        pipe = open(self.fd, "rb", 0)  # noqa: SIM115 - the transport owns and closes it
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        whole = False
        try:
            line = await reader.readline()
            if not line.startswith(b'{"run_id"'):
                message = orjson.loads(line).get("error") if line else None
                raise SnapshotError(message or "the snapshot worker failed (see the log)")
            with path.open("wb") as fh:
                fh.write(line)
                while data := await reader.read(CHUNK):
                    fh.write(data)
            whole = True
        finally:
            transport.close()
            if not whole and self.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
            status = await loop.run_in_executor(None, self.wait)
        if status:
            raise SnapshotUnavailable(f"the snapshot worker failed (status {status}; see the log)")


class SnapshotUnavailable(RewardstreamError):
    """No whole snapshot within the bound: a peer that does not answer, a builder that failed
    or took too long. The message names what, in one line."""


class Busy(RewardstreamError):
    """As many snapshots are under way as the limits allow: try again in ``retry_after`` s."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SnapshotLimits(NamedTuple):
    """How a processor bounds its snapshots (``rewardstream stream --snapshot-*``)."""

    timeout: float = 10.0  # seconds: a snapshot answers within it, the whole run or 503
    builds: int = 2  # snapshots built at once (each forks; the requests for one share it)
    requests: int = 32  # snapshot requests served at once (waiting for a build, or sending it)


@dataclasses.dataclass
class _Shared:
    """One build and the requests it answers; its file goes when the last of them is done."""

    task: asyncio.Task[None]
    path: Path
    users: int = 0


class Snapshots:
    """Admission control for snapshots: the requests for the same key (a run at the same
    positions) share one build; beyond :class:`SnapshotLimits`' ``builds`` or ``requests``,
    :class:`Busy`. Builds run in forked children, so the event loop (the consume loop, the
    group's heartbeats, ``/healthz``) only forks, reads a pipe and sends a file."""

    def __init__(
        self, limits: SnapshotLimits, spool_dir: Path, registry: CollectorRegistry | None
    ) -> None:
        self.limits, self.spool_dir = limits, spool_dir
        self._shared: dict[Hashable, _Shared] = {}
        self._requests = 0
        self._builds = Counter(
            "rewardstream_snapshot_builds",
            "Snapshots built (forked); the requests for a run at the same positions share one",
            registry=registry,
        )
        self._answers = Counter(
            "rewardstream_snapshot_requests",
            "Snapshot requests by outcome: served, busy (429), failed (409/503)",
            ["outcome"],
            registry=registry,
        )

    @contextlib.asynccontextmanager
    async def take(
        self, key: Hashable, build: Callable[[Path], Coroutine[Any, Any, None]]
    ) -> AsyncIterator[Path]:
        """The file ``build`` wrote for ``key`` (started now, or already under way for another
        request), held until the block ends. Raises :class:`Busy`, or what the build raised."""
        retry = math.ceil(self.limits.timeout)  # a build under way ends within it
        shared = self._shared.get(key)
        if self._requests >= self.limits.requests:
            self._answers.labels("busy").inc()
            raise Busy(f"{self._requests} snapshot requests under way already", retry)
        if shared is None:
            running = sum(not s.task.done() for s in self._shared.values())
            if running >= self.limits.builds:
                self._answers.labels("busy").inc()
                raise Busy(f"{running} snapshots being built already", retry)
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            path = self.spool_dir / f".snapshot-{uuid.uuid4().hex}"
            shared = self._shared[key] = _Shared(asyncio.create_task(build(path)), path)
            self._builds.inc()
        self._requests += 1
        shared.users += 1
        outcome = "failed"
        try:
            await asyncio.shield(shared.task)
            yield shared.path
            outcome = "served"
        finally:
            self._requests -= 1
            shared.users -= 1
            self._answers.labels(outcome).inc()
            if shared.users == 0:  # the last asker: nobody needs the build or its file
                if self._shared.get(key) is shared:
                    del self._shared[key]
                shared.task.cancel()
                shared.path.unlink(missing_ok=True)
