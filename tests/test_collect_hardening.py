"""``ng_collect_rollouts`` hardening: no traceback, no lost file (real servers, files, broker).

- a start that fails (servers down, an unwritable folder) leaves every earlier output as it
  was, byte for byte, and no new empty file;
- a device, FIFO or directory at an output path is refused, never replaced; a write that fails
  mid-collection (disk full, file too large) is one line and a non-zero exit, never "Finished";
- an event too large for Kafka is a dead letter: the collection goes on, and says so;
- ``rewardstream.sinks.files`` writes with the permissions of a plain ``open()`` and never sets the
  umask.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from rewardstream.contract import Topics
from rewardstream.kafka_local import free_port
from rewardstream.processors.stream import StreamProcessor
from rewardstream.producers.run_id import default_run_id
from rewardstream.sinks.files import write_files
from tests.gym import NgRun, fast, keys, ng_run, read_jsonl, write_problems
from tests.processes import read_topic

ROOT = Path(__file__).resolve().parents[1]
FULL = os.makedev(1, 7)  # /dev/full's device number
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, mount)")


@pytest.fixture(scope="module")
def servers() -> Iterator[NgRun]:
    with ng_run(*fast()) as run:
        yield run


def _collect(
    inputs: Path, out: Path, *extra: str, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ng_collect_rollouts`` as a child process (a hang cannot outlive the test)."""
    cmd = [sys.executable, "-m", "rewardstream.producers.collect", f"+input_jsonl_fpath={inputs}"]
    cmd += [f"+output_jsonl_fpath={out}", "+quiet=true", *extra]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=preexec
    )


def _one_line_error(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    """Exit code 2, exactly one error line holding ``parts``, no traceback, no "Finished"."""
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "Finished" not in done.stdout, done
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every entry of ``folder`` (hidden ones included) and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def _dead() -> str:
    """A head server URL where nothing listens."""
    return f"+head_server_url=http://127.0.0.1:{free_port()}"


# --------------------------------------------------------------------------- 1. failed starts


def test_rerun_with_the_servers_down_keeps_every_output(servers: NgRun, tmp_path: Path) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 6)
    out_dir = tmp_path / "out"
    out = out_dir / "r.jsonl"
    done = _collect(src, out, f"+head_server_url={servers.head_url}", "+num_repeats=2")
    assert done.returncode == 0, done.stderr
    before = _snapshot(out_dir)
    assert set(before) == {
        "r.jsonl",
        "r_materialized_inputs.jsonl",
        "r_failures.jsonl",
        "r_aggregate_metrics.json",
    }
    assert before["r.jsonl"].count(b"\n") == 12

    # the head server is down: nothing is truncated, cleared or rewritten
    _one_line_error(_collect(src, out, _dead()), "Could not connect to the head server")
    assert _snapshot(out_dir) == before
    # an agent that is down (+agent_url): the same
    dead_agent = f"+agent_url=http://127.0.0.1:{free_port()}"
    _one_line_error(_collect(src, out, dead_agent), "Could not connect to agent", str(out_dir))
    assert _snapshot(out_dir) == before

    # a resume with rows left to run and the servers down: not even the cut line is dropped
    cut = before["r.jsonl"][: before["r.jsonl"].rindex(b"\n", 0, -1) + 40]
    out.write_bytes(cut)
    before = _snapshot(out_dir)
    done = _collect(src, out, _dead(), "+resume_from_cache=true")
    _one_line_error(done, "Could not connect to the head server")
    assert _snapshot(out_dir) == before

    # with the servers back, the resume completes the same files
    done = _collect(src, out, f"+head_server_url={servers.head_url}", "+resume_from_cache=true")
    assert done.returncode == 0, done.stderr
    assert sorted(keys(read_jsonl(out))) == sorted(
        keys(read_jsonl(out_dir / "r_materialized_inputs.jsonl"))
    )


def test_a_failed_first_start_leaves_no_empty_files(tmp_path: Path) -> None:
    """Only the complete materialized inputs (NeMo Gym writes them before any server)."""
    src = write_problems(tmp_path / "problems.jsonl", 3)
    out_dir = tmp_path / "out"
    _one_line_error(_collect(src, out_dir / "r.jsonl", _dead()), "Could not connect")
    assert sorted(p.name for p in out_dir.iterdir()) == ["r_materialized_inputs.jsonl"]
    assert len(read_jsonl(out_dir / "r_materialized_inputs.jsonl")) == 3


@needs_root
def test_a_read_only_folder_is_refused_before_anything_changes(
    servers: NgRun, tmp_path: Path
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 3)
    with _tmpfs(tmp_path / "ro", "size=1m") as folder:
        names = ("r.jsonl", "r_materialized_inputs.jsonl", "r_failures.jsonl")
        for name in names:
            (folder / name).write_bytes(b'{"earlier": "run"}\n')
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        done = _collect(src, folder / "r.jsonl", f"+head_server_url={servers.head_url}")
        _one_line_error(done, f"Cannot write in '{folder}'", "Read-only file system")
        assert _snapshot(folder) == dict.fromkeys(names, b'{"earlier": "run"}\n')


# --------------------------------------------------------------------------- 2. special files


def _make_special(path: Path, kind: str) -> None:
    if kind == "character device":
        os.mknod(path, stat.S_IFCHR | 0o666, FULL)
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
        (path / "keep").write_bytes(b"mine")


@needs_root
@pytest.mark.parametrize("which", ["r.jsonl", "r_materialized_inputs.jsonl"])
@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory"])
def test_special_files_are_refused_not_replaced(
    servers: NgRun, tmp_path: Path, kind: str, which: str
) -> None:
    """/dev/full (here a node of its own, with its device number) and its kin."""
    src = write_problems(tmp_path / "problems.jsonl", 2)
    out = tmp_path / "out"
    out.mkdir()
    special = out / which
    _make_special(special, kind)
    before = os.lstat(special)
    done = _collect(src, out / "r.jsonl", f"+head_server_url={servers.head_url}")
    _one_line_error(done, f"'{special}'", kind)
    after = os.lstat(special)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (
        before.st_ino,
        before.st_mode,
        before.st_rdev,
    )
    if kind == "directory":
        assert (special / "keep").read_bytes() == b"mine"
    assert sorted(p.name for p in out.iterdir()) == [which]  # nothing else was written
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@needs_root
def test_disk_full_mid_collection_is_one_line_not_finished(servers: NgRun, tmp_path: Path) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 20)  # ~20 kB materialized, ~76 kB results
    with _tmpfs(tmp_path / "small", "size=64k") as folder:
        out = folder / "r.jsonl"
        done = _collect(src, out, f"+head_server_url={servers.head_url}", "+num_repeats=2")
        _one_line_error(done, f"Cannot write '{out}'", "No space left on device")
        assert len(read_jsonl(folder / "r_materialized_inputs.jsonl")) == 40
        written = out.read_bytes()
        assert 0 < written.count(b"\n") < 40  # stopped part way, at the full disk


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (32_000, 32_000))


def test_file_too_large_mid_collection_is_one_line_not_finished(
    servers: NgRun, tmp_path: Path
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 20)
    out = tmp_path / "r.jsonl"
    done = _collect(
        src,
        out,
        f"+head_server_url={servers.head_url}",
        "+num_repeats=2",
        preexec=_limit_file_size,
    )
    _one_line_error(done, f"Cannot write '{out}'", "File too large")


# --------------------------------------------------------------------------- 3. Kafka


@pytest.mark.kafka
async def test_an_event_too_large_for_kafka_is_a_dead_letter_not_an_abort(
    servers: NgRun, kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    prefix = unique_name("hardening")
    topics = Topics.for_prefix(prefix)
    src = write_problems(tmp_path / "problems.jsonl", 5)
    rows = read_jsonl(src)
    rows[2]["context"] = "x" * (3 << 19)  # 1.5 MiB: above the broker's 1 MiB message limit
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "out" / "big.jsonl"
    inputs = out.with_name("big_materialized_inputs.jsonl")

    processor = StreamProcessor(kafka_bootstrap, tmp_path / "profiles", topics)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    try:
        child = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "rewardstream.producers.collect", f"+input_jsonl_fpath={src}"),
            *(f"+output_jsonl_fpath={out}", f"+head_server_url={servers.head_url}"),
            *("+num_repeats=2", "+quiet=true", f"+kafka_bootstrap_servers={kafka_bootstrap}"),
            *(f"+kafka_topic_prefix={prefix}", "+kafka_wait_profile=true"),
            "+kafka_wait_profile_timeout_s=120",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(child.communicate(), 300)
        err = stderr.decode()
        assert child.returncode == 0, err
        run_id = default_run_id(inputs, "big")
        run = processor.pipeline.runs[run_id]
        assert run.done and run.terminal is not None
        assert (run.expected, run.terminal.inputs, run.terminal.rollouts) == (10, 8, 8)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)

    assert "Finished rollout collection!" in stdout.decode()
    assert "Traceback" not in err and "Future exception was never retrieved" not in err, err
    # the collection itself is whole
    assert sorted(keys(read_jsonl(out))) == sorted(keys(read_jsonl(inputs)))
    # one warning per oversized event, naming its line and both topics; then a summary
    big_lines = [n for n, r in enumerate(read_jsonl(inputs), 1) if "context" in r]
    assert big_lines == [5, 6]
    warnings = [line for line in err.splitlines() if line.startswith("WARNING:")]
    for lineno in big_lines:
        (line,) = [w for w in warnings if f"{inputs}:{lineno}: its input event" in w]
        assert topics.inputs in line and topics.dead_letters in line
    assert any("streamed profile leaves out their 2 rollouts" in w for w in warnings), warnings
    # the streamed profile, flagged partial by its final record, covers the 4 other tasks
    profiled = read_jsonl(out.with_name("big_reward_profiling.jsonl"))
    assert sorted(row["_ng_task_index"] for row in profiled) == [0, 1, 3, 4]
    # the dead letters, as the stream processor parks oversized events
    parked = await read_topic(kafka_bootstrap, topics.dead_letters, at_least=2)
    sources = []
    for record in parked:
        headers = dict(record.headers)
        assert headers["reason"] == b"oversized" and headers["kind"] == b"input"
        assert int(headers["size"]) > 3 << 19
        sources.append(headers["source"].decode())
    assert sorted(sources) == [f"{inputs}:{n}" for n in big_lines]


# ------------------------------------------------------------- 4. rewardstream.sinks.files

_SPY = """
import os, sys
calls = []
real = os.umask
os.umask = lambda mask: calls.append(mask) or real(mask)
from pathlib import Path
import rewardstream.sinks.files
target = Path(sys.argv[1])
rewardstream.sinks.files.write_files([(target, [b"new"]), (target.with_name("b.json"), [b"{}"])])
rewardstream.sinks.files.write_files([(target, [b"again"])])
print(calls)
"""


def test_sinks_files_never_sets_the_umask(tmp_path: Path) -> None:
    """Setting it (even to read it) is process-wide: another thread's files would get it."""
    target = tmp_path / "a.jsonl"
    target.write_bytes(b"old")
    done = subprocess.run(
        [sys.executable, "-c", _SPY, str(target)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert target.read_bytes() == b"again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_written_files_have_the_permissions_of_a_plain_open(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        with open(tmp_path / "plain", "wb"):
            pass
        fresh, replaced = tmp_path / "fresh.jsonl", tmp_path / "replaced.jsonl"
        replaced.write_bytes(b"old")
        replaced.chmod(0o600)
        write_files([(fresh, [b"x"]), (replaced, [b"y"])])
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == expected
    assert stat.S_IMODE(fresh.stat().st_mode) == expected
    assert stat.S_IMODE(replaced.stat().st_mode) == expected
    assert replaced.read_bytes() == b"y"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.jsonl", "plain", "replaced.jsonl"]
