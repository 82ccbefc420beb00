"""The snapshot wire form (:data:`MEDIA_TYPE`) and the client end that writes what it receives.

One JSON line, the :class:`SnapshotHead`; then the files as frames (file number in the head's
``files``, length, bytes), each file's frames in a row and the files in the head's order; then
an end frame. The files are large (~3 KB per task) and written raw, not as JSON strings; a
response cut short lacks the end frame, so it is never written as a profile. A build that fails
before its head (e.g. rollouts without input rows) sends ``{"error": ...}`` as its only line.

The server end is :mod:`rewardstream.processors.http.snapshot`. This module imports neither numpy
nor pydantic: ``rewardstream snapshot`` starts in a tenth of a second, and its start-up is part of a
snapshot's latency.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple, Protocol

import orjson

from rewardstream.contract.names import valid_output_stem
from rewardstream.errors import InputError, RewardstreamError
from rewardstream.sinks.files import ProfilePaths, write_files

__all__ = [
    "CHUNK",
    "END",
    "FRAME",
    "HEAD_LIMIT",
    "MEDIA_TYPE",
    "Readable",
    "SnapshotError",
    "SnapshotHead",
    "frames",
    "receive",
]

MEDIA_TYPE = "application/vnd.rewardstream.snapshot.v2"
FRAME = struct.Struct(">BI")  # file number, payload length
END = 255  # the end frame's file number
CHUNK = 1 << 20  # bytes of task lines per frame
HEAD_LIMIT = 1 << 24  # a head is small; its offsets grow with the partitions only


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


def frames(index: int, lines: Iterable[bytes]) -> Iterator[bytes]:
    """``lines`` as frames of file ``index``, ~1 MiB each."""
    buf: list[bytes] = []
    size = 0
    for line in lines:
        buf.append(line)
        size += len(line)
        if size >= CHUNK:
            yield FRAME.pack(index, size) + b"".join(buf)
            buf, size = [], 0
    if buf:
        yield FRAME.pack(index, size) + b"".join(buf)


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
        index, size = FRAME.unpack(self._exact(FRAME.size))
        return index, self._exact(size)

    def file(self, index: int, last: bool) -> Iterator[bytes]:
        """File ``index``'s bytes (no frames: an empty file); checks what follows it (a later
        file, or the end after the last)."""
        while self.index == index:
            yield self.data
            self.index, self.data = self._read()
        if self.index <= index or (last and self.index != END):
            raise SnapshotError(f"{self.source}: frame for file {self.index} out of order")


def _targets(out: Path, names: list[object], source: str) -> list[Path]:
    """Where each file goes: ``out/<name>``, and only for the three profile files of one stem
    (and its aggregate and difficulty files, when the run has them). The names come from the
    server, so an impostor or compromised server must not choose where the client writes
    (``../x``, ``/abs``, ``a/b``, NUL, other files)."""
    suffix = "_reward_profiling.jsonl"
    strings = [n for n in names if isinstance(n, str)]  # JSON could hold any type
    stems = [n.removesuffix(suffix) for n in strings if n.endswith(suffix)]
    if len(strings) == len(names) and len(stems) == 1 and valid_output_stem(stems[0]):
        expected = ProfilePaths.next_to(f"{stems[0]}.jsonl")
        three = [p.name for p in expected]
        if strings in (three, [*three, *(p.name for p in expected.extras())]):
            return [out / n for n in strings]
    shown = ", ".join(map(repr, names))
    raise SnapshotError(
        f"{source} sent files other than the profile files of one run; nothing written: "
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
    line = fh.readline(HEAD_LIMIT)
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
    last = len(targets) - 1
    write_files([(t, frames.file(i, i == last)) for i, t in enumerate(targets)])
    return head
