"""Partial profiles of a live run: built in forked children, streamed while they render.

Why fork: the child sees the run's state exactly as it was when the request came (copy-on-write:
consistent, and no copy to make), while the parent keeps ingesting on its own core; and once the
profile's numbers are built, a helper child renders the second half of the task rows and the
agent-level files while the first renders and sends the first half, so a snapshot uses two
cores.

The wire form and the client end are in :mod:`rewardstream.sinks.snapshot_wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncGenerator, Callable
from typing import BinaryIO

import orjson

from rewardstream.errors import RewardstreamError
from rewardstream.forking import fork
from rewardstream.processors.pipeline import Pipeline
from rewardstream.processors.profile import build_profile
from rewardstream.processors.runs import PartView
from rewardstream.sinks.files import ProfilePaths, aggregate_files, task_lines
from rewardstream.sinks.snapshot_wire import (
    CHUNK,
    END,
    FRAME,
    HEAD_LIMIT,
    SnapshotError,
    SnapshotHead,
    frames,
)

__all__ = ["SnapshotJob"]

_SPLIT_MIN = 2_000  # task rows below which the helper renders none of them
# the first renderer's share of the rows: the helper also computes the agent-level metrics,
# which cost about a third of rendering all rows (100,000 tasks x 8: 0.35 s of 1 s), and the
# aggregate and difficulty files when asked for (0.43 s more)
_FIRST_SHARE = 0.67
_FIRST_SHARE_AGGREGATES = 0.85


def _fork(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child (:func:`rewardstream.forking.fork`)."""
    return fork(work, lambda exc: print(f"snapshot worker failed: {exc!r}", file=sys.stderr))


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
            spool.writelines(frames(0, task_lines(rows.range(split, len(rows)), sample)))
            spool.writelines(frames(1, [orjson.dumps(profile.agent_metrics)]))
            spool.writelines(frames(2, [orjson.dumps(profile.repeat_metrics)]))
            if aggregates is not None:
                extra = aggregate_files(profile, paths, aggregates)
                for index, (_, blocks) in enumerate(extra, start=3):
                    spool.writelines(frames(index, blocks))
            spool.flush()

        helper = _fork(second_half)
        out.writelines(frames(0, task_lines(rows.range(0, split), sample)))
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

    async def stream(self) -> AsyncGenerator[bytes]:
        """The head line (first item; raises :class:`SnapshotError` if the build failed), then
        the frames as they come. Closes the pipe and reaps the child when done or abandoned."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=HEAD_LIMIT, loop=loop)
        pipe = open(self.fd, "rb", 0)  # noqa: SIM115 - the transport owns and closes it
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        try:
            line = await reader.readline()
            if not line.startswith(b'{"run_id"'):
                message = orjson.loads(line).get("error") if line else None
                raise SnapshotError(message or "the snapshot worker failed (see the log)")
            yield line
            while data := await reader.read(CHUNK):
                yield data
        finally:
            transport.close()
            if self.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)  # still running only if abandoned
                await loop.run_in_executor(None, self.wait)
