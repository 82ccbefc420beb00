"""A collection's lines as chunks of encoded events, read here or in forked encoder processes.

Parsing, validating and encoding a line costs several times what handing its event to Kafka
does, so a whole-file publish does it in child processes (:class:`Encoder`, one per file) while
the parent only fills record batches. Both files start at once: the rollouts child works ahead
(up to :data:`LOOKAHEAD_BYTES` of events) while the parent still sends the inputs, which must
all go first. On two cores the work overlaps instead of adding up. (Cutting a file into more
parts, one child each, measured slower here: on two cores it only adds overhead.) A whole
rollouts file is read by the batch profiler's lean reader (:func:`lean_rollout_chunks`: the
same events, 1.4-1.6x faster than a parse and the rules per line); inputs and ``--follow`` by
the reference (:func:`file_chunks`, :func:`encode_rows`).

A child stops at the first bad line after passing on every chunk before it, then passes the
:class:`~rewardstream.errors.LineError` itself: the parent sends what preceded the line and
raises the same error as an in-process read would.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, NamedTuple, Self

import orjson

from rewardstream.contract.events import encode_rollouts, task_key
from rewardstream.errors import InputError, LineError, RewardstreamError
from rewardstream.infra.jsonl import iter_jsonl, parse_line
from rewardstream.infra.readers import line_chunks
from rewardstream.processors.core import lean
from rewardstream.processors.core.lean_records import lean_results
from rewardstream.producers.events import WireEvent, rollout_event

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Chunk",
    "Encoder",
    "MakeEvent",
    "MessageLimit",
    "Tail",
    "chunked",
    "encode_rows",
    "file_chunks",
    "lean_rollout_chunks",
    "parsed",
]

MAX_MESSAGE_BYTES = 8 << 20  # the producer's max_request_size; brokers may allow less
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's message.max.bytes, for a limit not readable
RECORD_OVERHEAD = 128  # a record batch's header and one record's framing, beyond key and value
CHUNK_EVENTS = 2048  # a chunk ends at this many events or CHUNK_BYTES, whichever comes first:
CHUNK_BYTES = 1 << 20  # large enough that per-chunk costs vanish, small enough to bound memory
LOOKAHEAD_BYTES = 64 << 20  # how far an encoder may work ahead of the parent (bounded memory)
_READ_BYTES = 8 << 20  # files are read this many bytes at a time (bounded memory)

Chunk = list[tuple[bytes, bytes]]  # (key, value) of consecutive events
MakeEvent = Callable[
    [Any, str, Path, int], WireEvent
]  # rewardstream.producers.events.{input,rollout}_event
Source = Iterator[Chunk]  # a file's chunks, for an Encoder
_Item = Chunk | RewardstreamError | None  # what a child sends: chunks, then None or its error


class MessageLimit(NamedTuple):
    """The largest record a topic takes: its ``max.message.bytes`` as the broker reports it
    (Kafka's default where it cannot be read), never above this producer's request size."""

    topic: str
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    @property
    def room(self) -> int:
        """Bytes of key and value that fit in one record."""
        return min(self.max_message_bytes, MAX_MESSAGE_BYTES) - RECORD_OVERHEAD

    def refusal(self, size: int) -> str:
        """Why an event of ``size`` bytes is not sent to the topic."""
        limit = min(self.max_message_bytes, MAX_MESSAGE_BYTES)
        return (
            f"its event is {size} bytes, above the {limit}-byte max.message.bytes of {self.topic}"
        )


def encode_rows(
    rows: Iterable[tuple[int, Any]],
    path: Path,
    make_event: MakeEvent,
    run_id: str,
    limit: MessageLimit,
) -> Iterator[Chunk]:
    """Parsed, numbered lines as chunks of events; a bad line, or one whose event the topic
    would refuse, ends it with its ``LineError``, after the chunk of the lines before it."""
    events = ((lineno, *make_event(row, run_id, path, lineno)[1:]) for lineno, row in rows)
    return chunked(events, path, limit)


def chunked(
    events: Iterable[tuple[int, bytes, bytes]], path: Path, limit: MessageLimit
) -> Iterator[Chunk]:
    """Numbered events ``(lineno, key, value)`` as chunks; an error raised by ``events`` (a bad
    line) or an event the topic would refuse ends it with its ``LineError``, after the chunk of
    the events before it. One flat loop: it runs once per line."""
    chunk: Chunk = []
    size = 0
    room = limit.room
    try:
        for lineno, key, value in events:
            if len(key) + len(value) > room:
                raise LineError(str(path), lineno, limit.refusal(len(value)))
            chunk.append((key, value))
            size += len(value)
            if size >= CHUNK_BYTES or len(chunk) == CHUNK_EVENTS:
                yield chunk
                chunk, size = [], 0
    except InputError:  # a bad line (LineError) or a file that cannot be read further
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


def file_chunks(path: Path, make_event: MakeEvent, run_id: str, limit: MessageLimit) -> Source:
    """A whole file's chunks, each line parsed (``orjson.loads``) and made an event."""
    rows = map(itemgetter(0, 2), iter_jsonl(path))  # (lineno, value) of each JsonLine
    return encode_rows(rows, path, make_event, run_id, limit)


def lean_rollout_chunks(
    path: Path, run_id: str, answer_key: str | None, limit: MessageLimit
) -> Source:
    """:func:`file_chunks` of a rollouts file with :func:`rollout_event`, the same bytes but
    for ``published_at`` (one per run of lines): lines are read as the batch profiler's lean
    reader reads them (:mod:`rewardstream.infra.readers`), their events joined from columns
    (:func:`encode_rollouts`); each line it leaves to the reference is read as
    :func:`file_chunks` reads it, which owns every error and line number."""
    return chunked(_lean_rollout_events(path, run_id, answer_key), path, limit)


def _lean_rollout_events(
    path: Path, run_id: str, answer_key: str | None
) -> Iterator[tuple[int, bytes, bytes]]:
    for chunk in line_chunks(path, 0, os.path.getsize(path)):
        lines = chunk.lines()
        flagged = lean.suspects(chunk.array, chunk.starts, chunk.ends)
        lineno = chunk.lineno  # of the next line
        for taken in lean_results(lines, flagged, answer_key):
            if isinstance(taken, int):
                row = parse_line(lines[taken], path, lineno)
                _, key, value = rollout_event(row, run_id, path, lineno, answer_key)
                yield lineno, key, value
                lineno += 1
                continue
            tasks = taken.tasks
            values = encode_rollouts(
                run_id,
                tasks,
                taken.rollouts,
                taken.agents,
                taken.schemas,
                taken.masked,
                taken.answers,
                taken.values,
                taken.infos,
                time.time(),
            )
            for task, value in zip(tasks, values, strict=True):
                yield lineno, task_key(task), value
                lineno += 1


def parsed(lines: Iterable[tuple[int, bytes]], path: Path) -> Iterator[tuple[int, Any]]:
    """Raw numbered lines parsed as the batch reader parses them (its error wording included)."""
    loads = orjson.loads
    for lineno, raw in lines:
        try:
            yield lineno, loads(raw)  # JSON whitespace includes the line's own \r\n
        except orjson.JSONDecodeError:
            yield lineno, parse_line(raw, path, lineno)  # raises NeMo Gym's "Malformed JSON"


class Encoder:
    """A forked child that encodes one whole file and streams its chunks back through a pipe.

    The child starts at once and works ahead of the parent (see :class:`_Ahead`); it ends with
    the file, at its first error, or with a broken pipe when the parent goes away. Fork, not
    spawn: it needs no imports and starts in milliseconds.
    """

    def __init__(self, source: Callable[[], Iterable[Chunk]]) -> None:
        """``source``: called in the child, the file's chunks (:func:`file_chunks`,
        :func:`lean_rollout_chunks`)."""
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe(duplex=False)
        with contextlib.suppress(OSError):  # best effort (pipe-max-size): a chunk per wake-up
            fcntl.fcntl(child_end.fileno(), fcntl.F_SETPIPE_SZ, CHUNK_BYTES)
        self._process = context.Process(
            target=_encode_file,
            args=(child_end, self._conn, source),
            daemon=True,
        )
        self._process.start()
        child_end.close()  # now the child's death means end of file here

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The file's chunks in order; raises the child's error, or if it died."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                item: _Item = await loop.run_in_executor(None, self._conn.recv)
            except (EOFError, OSError):  # at a message boundary or within one
                self._process.join()
                raise InputError(
                    f"the encoder process died (exit code {self._process.exitcode})"
                ) from None
            if item is None:
                return
            if isinstance(item, RewardstreamError):
                raise item
            yield item

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the child (when the parent gives up early) and release the pipe."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._process.close()
        self._conn.close()


def _encode_file(
    conn: Connection, parent_end: Connection, source: Callable[[], Iterable[Chunk]]
) -> None:
    """The child: encode into a bounded buffer that a thread writes to the pipe, so encoding
    goes on while the parent is not reading."""
    parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # in case the parent's loop handles it
    signal.set_wakeup_fd(-1)  # the parent's event loop listens there, not the child
    ahead = _Ahead()
    writer = threading.Thread(target=_write, args=(conn, ahead), daemon=True)
    writer.start()
    try:
        for chunk in source():
            ahead.put(chunk, sum(len(value) for _, value in chunk))
        ahead.put(None, 0)
    except RewardstreamError as exc:
        ahead.put(exc, 0)
    writer.join()


def _write(conn: Connection, ahead: _Ahead) -> None:
    """The child's writer thread: a full pipe blocks it, not the encoding."""
    while True:
        item, size = ahead.get()
        try:
            conn.send(item)
        except BrokenPipeError:
            os._exit(0)  # the parent is gone or gave up: nobody wants the rest
        ahead.release(size)
        if not isinstance(item, list):
            conn.close()
            return


class _Ahead:
    """Encoded items not yet written to the pipe: at most :data:`LOOKAHEAD_BYTES` of event
    values plus one chunk (a chunk larger than the budget still passes, alone)."""

    def __init__(self) -> None:
        self._items: deque[tuple[_Item, int]] = deque()
        self._free = LOOKAHEAD_BYTES
        self._changed = threading.Condition()

    def put(self, item: _Item, size: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._free > 0)
            self._free -= size
            self._items.append((item, size))
            self._changed.notify_all()

    def get(self) -> tuple[_Item, int]:
        with self._changed:
            self._changed.wait_for(lambda: self._items)
            return self._items.popleft()

    def release(self, size: int) -> None:
        with self._changed:
            self._free += size
            self._changed.notify_all()


class Tail:
    """Complete lines appended to a file, starting over when it is truncated or replaced.

    ``pos`` counts the bytes consumed (the held-back partial line included), so a size below it
    means truncation; a different inode at the path means rotation, and the old file is read
    to its end first. A truncation followed, before the next poll, by more bytes than were
    consumed is indistinguishable from appending (as for ``tail -F``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[bytes] | None = None
        self.inode, self.pos, self.lineno, self.partial = -1, 0, 0, b""
        self._open()

    def _open(self) -> None:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across polls, closed in close()
        except FileNotFoundError:
            return  # between a rename and the new file's creation: wait for it
        except OSError as exc:
            raise InputError(f"Cannot read '{self.path}': {exc.strerror or exc}") from None
        self.fh, self.inode = fh, os.fstat(fh.fileno()).st_ino
        self.pos, self.lineno, self.partial = 0, 0, b""

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def complete_lines(self) -> Iterator[tuple[int, bytes]]:
        """Every complete line available now, with its 1-based line number."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if self.fh is None or st is None or st.st_ino != self.inode:
            yield from self._drain()  # the rotated-away file may have grown since last time
            if st is not None:
                self.close()
                self._open()
        elif st.st_size < self.pos:
            self.fh.seek(0)
            self.pos, self.lineno, self.partial = 0, 0, b""
        yield from self._drain()

    def _drain(self) -> Iterator[tuple[int, bytes]]:
        while self.fh is not None:
            chunk = self.fh.read(_READ_BYTES)
            if not chunk:
                return
            self.pos += len(chunk)
            data = self.partial + chunk if self.partial else chunk
            end = data.rfind(b"\n") + 1
            self.partial = data[end:]
            start = 0
            while start < end:
                nl = data.index(b"\n", start) + 1
                self.lineno += 1
                yield self.lineno, data[start:nl]
                start = nl
