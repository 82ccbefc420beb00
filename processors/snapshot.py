"""Partial profiles of a live run: built in forked children, streamed while they render.

Why fork: the child sees the run's state exactly as it was when the request came (copy-on-write:
consistent, and no copy to make), while the parent keeps ingesting on its own core; and once the
profile's numbers are built, a helper child renders the second half of the task rows and the
agent-level files while the first renders and sends the first half, so a snapshot uses two
cores.

The wire form (:data:`MEDIA_TYPE`): one JSON line, the :class:`SnapshotHead`; then the files as
frames (file number in the head's ``files``, length, bytes), each file's frames in a row and the
files in the head's order; then an end frame. The files are large (~3 KB per task) and written
raw, not as JSON strings; a response cut short lacks the end frame, so it is never written as a
profile. A build that fails before its head (e.g. rollouts without input rows) sends
``{"error": ...}`` as its only line instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import shutil
import signal
import struct
import sys
import tempfile
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

import orjson

from processors.pipeline import Pipeline
from processors.profile import build_profile
from rewardstream.contract import valid_output_stem
from rewardstream.errors import InputError, RewardstreamError
from sinks.files import ProfilePaths, task_lines, write_files

__all__ = ["MEDIA_TYPE", "Readable", "SnapshotError", "SnapshotHead", "SnapshotJob", "receive"]

MEDIA_TYPE = "application/vnd.rewardstream.snapshot.v2"
_FRAME = struct.Struct(">BI")  # file number, payload length
_END = 255
_CHUNK = 1 << 20  # bytes of task lines per frame
_SPLIT_MIN = 2_000  # task rows below which the helper renders none of them
# the first renderer's share of the rows: the helper also computes the agent-level metrics,
# which cost about a fifth of rendering all rows (100,000 tasks x 8: 0.35 s of 1.5 s)
_FIRST_SHARE = 0.6
_HEAD_LIMIT = 1 << 24  # a head is small; its offsets grow with the partitions only


class SnapshotError(RewardstreamError):
    """The processor could not build the snapshot, or its response was not a whole one."""


class SnapshotHead(NamedTuple):
    """What a snapshot covers: ``rollouts`` results and ``inputs`` rows of ``run_id``, that is
    every event before the next offset per unit in ``offsets``; and its files' names."""

    run_id: str
    rollouts: int
    inputs: int
    offsets: dict[str, int]
    files: list[str]


def _fork(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child, in a process group of its own, and return its pid.

    The child never returns here: it leaves with ``os._exit`` (0 when ``work`` returned), so no
    cleanup of the parent's (event loop, Kafka clients, temp files) ever runs twice.
    """
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setpgid(0, 0)  # killed as a group with its own helper, never with the processor's
        gc.disable()  # short-lived: a collection would only walk (and copy) the parent's objects
        with contextlib.suppress(ValueError):  # the parent's event loop must not hear signals
            signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        work()
        code = 0
    except BrokenPipeError:  # the client went away: nothing to say
        pass
    except BaseException as exc:  # a child must reach os._exit whatever happens
        with contextlib.suppress(Exception):
            print(f"snapshot worker failed: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def _frames(index: int, lines: Iterable[bytes]) -> Iterator[bytes]:
    """``lines`` as frames of file ``index``, ~1 MiB each."""
    buf: list[bytes] = []
    size = 0
    for line in lines:
        buf.append(line)
        size += len(line)
        if size >= _CHUNK:
            yield _FRAME.pack(index, size) + b"".join(buf)
            buf, size = [], 0
    if buf:
        yield _FRAME.pack(index, size) + b"".join(buf)


def _final_files(pipeline: Pipeline, run_id: str, paths: ProfilePaths, out: BinaryIO) -> None:
    """A done run's snapshot is its final files: its state is dropped once they are written
    (:meth:`Pipeline.evict`), and they are what a snapshot of every rollout would give."""
    run = pipeline.runs[run_id]
    order = (paths.reward_profiling, paths.agent_metrics, paths.repeat_level_metrics)
    files = [p.name for p in order]
    head = SnapshotHead(run_id, run.rollouts, run.inputs, pipeline.positions(), files)
    out.write(orjson.dumps(head._asdict(), option=orjson.OPT_APPEND_NEWLINE))
    for index, path in enumerate(order):
        with open(path, "rb") as fh:
            out.writelines(_frames(index, iter(functools.partial(fh.read, _CHUNK), b"")))
    out.write(_FRAME.pack(_END, 0))


def _build(pipeline: Pipeline, run_id: str, out: BinaryIO) -> None:
    """The child's work: merge the run's parts, build the profile, stream the files."""
    final = pipeline.final_paths(run_id)
    if final is not None:
        _final_files(pipeline, run_id, final, out)
        return
    source = pipeline.snapshot_source(run_id)
    state = source.merged.state
    try:
        profile = build_profile(state, allow_partial=True)
    except RewardstreamError as exc:
        out.write(orjson.dumps({"error": str(exc)}, option=orjson.OPT_APPEND_NEWLINE))
        return
    paths: ProfilePaths = source.paths
    order = (paths.reward_profiling, paths.agent_metrics, paths.repeat_level_metrics)
    head = SnapshotHead(
        run_id, state.num_results, state.num_inputs, source.offsets, [p.name for p in order]
    )
    out.write(orjson.dumps(head._asdict(), option=orjson.OPT_APPEND_NEWLINE))
    rows, sample = profile.task_rows, source.merged.sample
    split = round(len(rows) * _FIRST_SHARE) if len(rows) >= _SPLIT_MIN else len(rows)
    source.spool_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=source.spool_dir) as spool:

        def second_half() -> None:  # rows after the split, then the agent-level files
            spool.writelines(_frames(0, task_lines(rows.range(split, len(rows)), sample)))
            spool.writelines(_frames(1, [orjson.dumps(profile.agent_metrics)]))
            spool.writelines(_frames(2, [orjson.dumps(profile.repeat_metrics)]))
            spool.flush()

        helper = _fork(second_half)
        out.writelines(_frames(0, task_lines(rows.range(0, split), sample)))
        _, status = os.waitpid(helper, 0)
        if status:
            raise RuntimeError(f"snapshot renderer exited with status {status}")
        spool.seek(0)
        shutil.copyfileobj(spool, out, _CHUNK)
    out.write(_FRAME.pack(_END, 0))


class SnapshotJob:
    """A snapshot being built by a forked child: read its stream, then :meth:`close`."""

    def __init__(self, pipeline: Pipeline, run_id: str) -> None:
        """Fork now: the snapshot covers exactly what ``pipeline`` has consumed at this call.

        Raises KeyError for an unknown run.
        """
        if run_id not in pipeline.runs:
            raise KeyError(run_id)
        read, write = os.pipe()

        def work() -> None:
            os.close(read)
            with open(write, "wb", buffering=_CHUNK) as out:
                _build(pipeline, run_id, out)

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
        reader = asyncio.StreamReader(limit=_HEAD_LIMIT, loop=loop)
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
            while data := await reader.read(_CHUNK):
                yield data
        finally:
            transport.close()
            if self.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)  # still running only if abandoned
                await loop.run_in_executor(None, self.wait)


class _Frames:
    """The frames of a snapshot stream, read one ahead so each file knows where it ends."""

    def __init__(self, fh: Readable, source: str) -> None:
        self.fh, self.source = fh, source
        self.index, self.data = self._read()

    def _exact(self, size: int) -> bytes:
        data = self.fh.read(size)
        if len(data) != size:
            raise SnapshotError(f"{self.source}: the snapshot response was cut short")
        return data

    def _read(self) -> tuple[int, bytes]:
        index, size = _FRAME.unpack(self._exact(_FRAME.size))
        return index, self._exact(size)

    def file(self, index: int, last: bool) -> Iterator[bytes]:
        """File ``index``'s bytes (no frames: an empty file); checks what follows it (a later
        file, or the end after the last)."""
        while self.index == index:
            yield self.data
            self.index, self.data = self._read()
        if self.index <= index or (last and self.index != _END):
            raise SnapshotError(f"{self.source}: frame for file {self.index} out of order")


def _targets(out: Path, names: list[object], source: str) -> list[Path]:
    """Where each file goes: ``out/<name>``, and only for the three profile files of one stem.
    The names come from the server, so an impostor or compromised server must not choose where
    the client writes (``../x``, ``/abs``, ``a/b``, NUL, other files)."""
    suffix = "_reward_profiling.jsonl"
    strings = [n for n in names if isinstance(n, str)]  # JSON could hold any type
    stems = [n.removesuffix(suffix) for n in strings if n.endswith(suffix)]
    if len(strings) == len(names) == 3 and len(stems) == 1 and valid_output_stem(stems[0]):
        expected = ProfilePaths.next_to(f"{stems[0]}.jsonl")
        if sorted(strings) == sorted(p.name for p in expected):
            return [out / n for n in strings]
    shown = ", ".join(map(repr, names))
    raise SnapshotError(
        f"{source} sent files other than the three profile files of one run; nothing written: "
        f"{shown[:300]}"
    )


class Readable(Protocol):
    """What :func:`receive` reads from: a file, or an HTTP response."""

    def read(self, size: int, /) -> bytes: ...

    def readline(self, size: int, /) -> bytes: ...


def receive(fh: Readable, out: Path, source: str) -> SnapshotHead:
    """Read a snapshot stream from ``fh`` and write its files into ``out``, all or nothing.

    ``source`` names where it came from, for errors.
    """
    line = fh.readline(_HEAD_LIMIT)
    try:
        fields = orjson.loads(line)
        if "error" in fields:
            raise SnapshotError(f"{source}: {fields['error']}")
        head = SnapshotHead(**fields)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise SnapshotError(f"{source} did not answer with a snapshot: {exc}"[:300]) from None
    targets = _targets(out, list(head.files), source)  # before anything is created
    frames = _Frames(fh, source)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot write '{out}': {exc.strerror or exc}") from None
    write_files([(t, frames.file(i, i == 2)) for i, t in enumerate(targets)])
    return head
