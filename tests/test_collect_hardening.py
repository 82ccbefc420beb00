"""``ng_collect_rollouts`` hardening: no traceback, no lost file (real servers, files, broker).

- a start that fails (servers down, an unwritable folder) leaves every earlier output as it
  was, byte for byte, and no new empty file;
- a device, FIFO or directory at an output path is refused, never replaced; a write that fails
  mid-collection (disk full, file too large) is one line and a non-zero exit, never "Finished";
- an event too large for Kafka is a dead letter: the collection goes on, and says so; a broker
  that is down turns the live view off, never the collection;
- a plain re-run moves every earlier output aside as numbered backups (``r.jsonl.~1~``), never
  deletes it; Ctrl-C and SIGTERM say how many rollouts are written and the exact command that
  resumes, which completes the collection;
- ``rewardstream.sinks.files`` writes with the permissions of a plain ``open()`` and never sets the
  umask.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import Topics
from rewardstream.kafka.local import free_port
from rewardstream.processors.stream import StreamProcessor
from rewardstream.producers.publisher.run_id import default_run_id
from rewardstream.sinks.files import write_files
from tests.golden import OUTPUT_SUFFIXES
from tests.gym import POLICY, NgRun, fast, keys, ng_run, read_jsonl, write_problems
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
    cmd = [
        sys.executable,
        "-m",
        "rewardstream.producers.gym.collect",
        f"+input_jsonl_fpath={inputs}",
    ]
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
            *(
                sys.executable,
                "-m",
                "rewardstream.producers.gym.collect",
                f"+input_jsonl_fpath={src}",
            ),
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


def test_a_broker_that_is_down_turns_the_live_view_off_not_the_collection(
    servers: NgRun, tmp_path: Path
) -> None:
    """docs/collection.md: Kafka never stops a collection. One line says the live view is off
    and how to publish the files afterwards; the files are those of a collection without Kafka."""
    src = write_problems(tmp_path / "problems.jsonl", 6)
    out = tmp_path / "out" / "r.jsonl"
    inputs = out.with_name("r_materialized_inputs.jsonl")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    head = f"+head_server_url={servers.head_url}"
    done = _collect(src, out, head, f"+kafka_bootstrap_servers={dead}", "+kafka_topic_prefix=t")
    assert done.returncode == 0, done.stderr
    assert "Finished rollout collection!" in done.stdout and "Traceback" not in done.stderr
    (off,) = [line for line in done.stderr.splitlines() if "live view is off" in line]
    assert dead in off
    publish = f"rewardstream publish --inputs {inputs} --rollouts {out} --bootstrap {dead}"
    assert off.endswith(f"{publish} --topic-prefix t"), off
    assert "streaming run" not in done.stderr  # nothing claims a live run
    assert sorted(keys(read_jsonl(out))) == sorted(keys(read_jsonl(inputs)))
    assert len(read_jsonl(inputs)) == 6

    # waiting for a streamed profile that cannot come: the collection is still whole
    again = tmp_path / "again" / "r.jsonl"
    done = _collect(
        src, again, head, f"+kafka_bootstrap_servers={dead}", "+kafka_wait_profile=true"
    )
    _one_line_error(done, "no streamed profile", str(again))
    assert sorted(keys(read_jsonl(again))) == sorted(keys(read_jsonl(inputs)))


@pytest.mark.parametrize(
    ("extra", "part"),
    [
        (["+kafka_bootstrap_servers=foo:bar"], "kafka_bootstrap_servers"),
        (["+kafka_bootstrap_servers=127.0.0.1:1", "+kafka_run_id='a b'"], "run_id"),
    ],
)
def test_bad_kafka_settings_are_one_line_and_write_nothing(
    servers: NgRun, tmp_path: Path, extra: list[str], part: str
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 2)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "r.jsonl").write_bytes(b'{"earlier": "run"}\n')
    before = _snapshot(out_dir)
    done = _collect(src, out_dir / "r.jsonl", f"+head_server_url={servers.head_url}", *extra)
    _one_line_error(done, part)
    assert _snapshot(out_dir) == before


# --------------------------------------------------------------------------- 4. re-runs


def _profile(out: Path) -> dict[str, bytes]:
    """ng_reward_profile's three files of the collection at ``out`` (written next to it)."""
    inputs = out.with_name(f"{out.stem}_materialized_inputs.jsonl")
    args = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={out}"]
    assert ng_reward_profile([*args, "+quiet=true"]) == 0
    return {s: out.with_name(f"{out.stem}{s}").read_bytes() for s in OUTPUT_SUFFIXES}


def test_a_plain_rerun_keeps_every_earlier_file_as_a_numbered_backup(
    servers: NgRun, tmp_path: Path
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 6)
    out_dir = tmp_path / "out"
    out = out_dir / "r.jsonl"
    args = (f"+head_server_url={servers.head_url}", "+num_repeats=2")
    done = _collect(src, out, *args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # into an empty folder: nothing to clear, nothing alarming
    _profile(out)  # the collection's set now has the profile files too
    rollouts = out.read_bytes()
    out.write_bytes(rollouts[: rollouts.index(b"\n", len(rollouts) // 2) + 1])  # partial
    first = _snapshot(out_dir)
    assert len(first) == 4 + len(OUTPUT_SUFFIXES)

    done = _collect(src, out, *args)  # no +resume_from_cache: a fresh collection
    assert done.returncode == 0, done.stderr
    (moved,) = done.stderr.splitlines()
    assert "resume_from_cache=False" in moved and "~1~" in moved, moved
    after = _snapshot(out_dir)
    assert {f"{name}.~1~": data for name, data in first.items()} == {
        name: data for name, data in after.items() if name.endswith(".~1~")
    }
    fresh = {name: data for name, data in after.items() if not name.endswith("~")}
    assert set(fresh) == {"r.jsonl", "r_materialized_inputs.jsonl", "r_failures.jsonl"} | {
        "r_aggregate_metrics.json"
    }  # the new collection starts empty: no profile of the earlier rollouts beside it
    assert len(read_jsonl(out)) == 12

    done = _collect(src, out, *args)
    assert done.returncode == 0 and "~2~" in done.stderr, done.stderr
    second = _snapshot(out_dir)
    assert {n: d for n, d in second.items() if n.endswith(".~1~")} == {
        n: d for n, d in after.items() if n.endswith(".~1~")
    }
    assert {f"{n}.~2~": d for n, d in fresh.items()} == {
        n: d for n, d in second.items() if n.endswith(".~2~")
    }


@needs_root
def test_a_new_collection_that_cannot_start_puts_the_earlier_files_back(
    servers: NgRun, tmp_path: Path
) -> None:
    """The earlier files are moved aside, then the new materialized inputs do not fit."""
    src = write_problems(tmp_path / "problems.jsonl", 300)  # ~190 kB materialized
    with _tmpfs(tmp_path / "small", "size=64k") as folder:
        for name in ("r.jsonl", "r_materialized_inputs.jsonl", "r.jsonl.~1~"):
            (folder / name).write_bytes(b'{"earlier": "run"}\n')
        before = _snapshot(folder)
        done = _collect(src, folder / "r.jsonl", f"+head_server_url={servers.head_url}")
        _one_line_error(done, "Cannot write", "No space left on device")
        assert _snapshot(folder) == before


@pytest.fixture(scope="module")
def slow_servers() -> Iterator[NgRun]:
    with ng_run(*fast(f"{POLICY}.latency_s=0.1")) as run:
        yield run


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_collection_says_how_to_resume_and_that_completes_it(
    slow_servers: NgRun, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 60)
    out = tmp_path / "out" / "r.jsonl"
    args = [f"+input_jsonl_fpath={src}", f"+output_jsonl_fpath={out}", "+num_repeats=2"]
    args += ["+num_repeats_add_seed=true", "+num_samples_in_parallel=2", "+quiet=true"]
    args += [f"+head_server_url={slow_servers.head_url}"]
    child = subprocess.Popen(
        [sys.executable, "-m", "rewardstream.producers.gym.collect", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not out.exists() or out.read_bytes().count(b"\n") < 6:
            assert child.poll() is None, "the collection ended before it was interrupted"
            time.sleep(0.02)
        child.send_signal(sig)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == code, stderr
    assert "Traceback" not in stderr and "Finished" not in stdout, stderr
    written = out.read_bytes().count(b"\n")
    assert 6 <= written < 120
    (line,) = [line for line in stderr.splitlines() if "to resume:" in line]
    assert f"{written} rollouts" in line and str(out) in line, line
    command = shlex.split(line.split("to resume: ", 1)[1])
    assert command == ["ng_collect_rollouts", *args, "+resume_from_cache=true"]

    resumed = subprocess.run(
        [str(Path(sys.executable).with_name(command[0])), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert not [p for p in out.parent.iterdir() if p.name.endswith("~")]  # nothing moved aside
    whole = tmp_path / "whole" / "r.jsonl"
    plain = [a for a in args if not a.startswith(("+output", "+num_samples"))]
    plain += [f"+output_jsonl_fpath={whole}", "+num_samples_in_parallel=16"]
    done = subprocess.run(
        [sys.executable, "-m", "rewardstream.producers.gym.collect", *plain],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert _profile(out) == _profile(whole)


# ------------------------------------------------------------- 5. rewardstream.sinks.files

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
