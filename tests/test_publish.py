"""``rewardstream publish``: the events it sends to a real broker, its errors, and follow mode.

Kafka tests get their own topic prefix (``unique_name``) and create the topics up front, so
reading back never races auto-creation; data topics get 3 partitions to exercise partitioning.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rewardstream.commands.publish
from rewardstream.contract.events import (
    Input,
    Rollout,
    RunFinished,
    RunStarted,
    Topics,
    decode_control,
    decode_input,
    decode_rollout,
    encode,
    encode_rollout,
    task_key,
)
from rewardstream.errors import InputError, InvalidRow, LineError
from rewardstream.kafka.local import free_port
from rewardstream.processors.batch import load_state
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.state import row_key
from rewardstream.producers.gym.materialize import write_rows
from rewardstream.producers.publisher.publish import PublishReport, publish_files
from rewardstream.producers.publisher.run_id import default_run_id
from tests.golden import GOLDEN
from tests.processes import make_topics
from tests.topics import control_events, read_all

UniqueName = Callable[[str], str]
BLACKJACK = GOLDEN / "blackjack" / "upstream"
needs_golden = pytest.mark.skipif(not BLACKJACK.exists(), reason="no goldens")


# --------------------------------------------------------------------------- helpers


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def key_partition(key: bytes, partitions: int) -> int:
    """Where the Java client (and ``AIOKafkaProducer.send``) would put ``key``."""
    every = list(range(partitions))
    return int(DefaultPartitioner()(key, every, every))


# --------------------------------------------------------------------------- against a broker


@needs_golden
@pytest.mark.kafka
async def test_golden_blackjack_round_trip(
    kafka_bootstrap: str, unique_name: UniqueName, tmp_path: Path
) -> None:
    inputs = BLACKJACK / "example_rollouts_materialized_inputs.jsonl"
    rollouts = BLACKJACK / "example_rollouts.jsonl"
    topics = Topics.for_prefix(unique_name("pub"))
    await make_topics(kafka_bootstrap, topics, partitions=3)

    report = await publish_files(inputs, rollouts, kafka_bootstrap, topics=topics)

    st = inputs.stat()
    ident = f"{inputs.resolve()}|{st.st_ino}|{st.st_mtime_ns}|{st.st_size}"
    run_id = f"example_rollouts-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"
    assert report.run_id == run_id == default_run_id(inputs, "example_rollouts")
    assert report.finished
    assert (report.inputs_sent, report.rollouts_sent) == (5, 5)
    assert report.seconds > 0

    input_records = await read_all(kafka_bootstrap, topics.inputs, 3)
    rollout_records = await read_all(kafka_bootstrap, topics.rollouts, 3)
    control_records = await read_all(kafka_bootstrap, topics.control, 1)

    rows = rows_of(inputs)
    got_inputs = sorted(((decode_input(r.value), r) for r in input_records), key=_line)
    assert [e for e, _ in got_inputs] == [
        Input(run_id=run_id, line=i, row=row) for i, row in enumerate(rows)
    ]
    for row_event, record in got_inputs:
        assert record.key == task_key(row_event.row["_ng_task_index"])
        assert record.partition == key_partition(record.key, 3)
        assert encode(row_event) == record.value  # the event, encoded again: the same bytes

    originals = {row_key(r): r for r in rows_of(rollouts)}
    assert len(rollout_records) == len(originals) == 5
    for record in rollout_records:
        event = decode_rollout(record.value)
        original = originals.pop((event.task, event.rollout))
        assert record.key == task_key(event.task)
        assert record.partition == key_partition(record.key, 3)
        assert event.run_id == run_id
        assert event.agent == original["agent_ref"]["name"] == "blackjack_gymnasium_agent"
        assert event.record == extract_result(original, event.task, event.rollout)
        assert abs(event.published_at - time.time()) < 120
        assert encode(event) == record.value  # the event, encoded again: the same bytes
    assert not originals

    assert [r.key for r in control_records] == [run_id.encode()] * 2
    assert [decode_control(r.value) for r in control_records] == [
        RunStarted(run_id=run_id, expected_rollouts=5, output_stem="example_rollouts"),
        RunFinished(run_id=run_id),
    ]


def _line(pair: tuple[Input, ConsumerRecord]) -> int:
    return pair[0].line


@needs_golden
@pytest.mark.kafka
@pytest.mark.parametrize(
    ("bad_line", "malformed"),
    [
        (b"{bad", True),
        (b'{"_ng_task_index": 1, "_ng_rollout_index": 0, "response": "text"}', False),
        (b'{"_ng_task_index": "1", "_ng_rollout_index": 0}', False),
    ],
    ids=["malformed-json", "bad-response", "bad-task-index"],
)
async def test_bad_line_fails_like_the_batch_reader(
    kafka_bootstrap: str,
    unique_name: UniqueName,
    tmp_path: Path,
    bad_line: bytes,
    malformed: bool,
) -> None:
    inputs = tmp_path / "rollouts_materialized_inputs.jsonl"
    rollouts = tmp_path / "rollouts.jsonl"
    shutil.copy(BLACKJACK / "example_rollouts_materialized_inputs.jsonl", inputs)
    lines = (BLACKJACK / "example_rollouts.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = bad_line + b"\n"
    rollouts.write_bytes(b"".join(lines))
    topics = Topics.for_prefix(unique_name("bad"))
    await make_topics(kafka_bootstrap, topics, partitions=1)

    with pytest.raises(LineError) as published:
        await publish_files(inputs, rollouts, kafka_bootstrap, topics=topics)
    with pytest.raises(LineError) as batch:
        load_state(inputs, rollouts)
    assert published.value.lineno == 3
    assert published.value.malformed is malformed
    assert str(published.value) == str(batch.value)

    # lines 1-2 went out before line 3 failed; the run was started but never finished
    sent = [decode_rollout(r.value) for r in await read_all(kafka_bootstrap, topics.rollouts, 1)]
    assert [(e.task, e.rollout) for e in sent] == [(0, 0), (0, 1)]
    control = [decode_control(r.value) for r in await read_all(kafka_bootstrap, topics.control, 1)]
    assert [type(e) for e in control] == [RunStarted]


@needs_golden
@pytest.mark.kafka
@pytest.mark.parametrize("follow", [False, True], ids=["replay", "follow"])
async def test_an_event_above_the_topic_limit_names_its_line(
    kafka_bootstrap: str, unique_name: UniqueName, tmp_path: Path, follow: bool
) -> None:
    """The broker's own refusal (MessageSizeTooLargeError for a whole batch) named a topic and
    partition; the user needs the line. The topic's max.message.bytes is read before sending."""
    inputs = tmp_path / "rollouts_materialized_inputs.jsonl"
    rollouts = tmp_path / "rollouts.jsonl"
    rows = [
        orjson.loads(x)
        for x in (BLACKJACK / "example_rollouts_materialized_inputs.jsonl")
        .read_bytes()
        .splitlines()
    ]
    rows[3]["context"] = "x" * (3 << 19)  # 1.5 MiB, above the broker's default 1 MiB
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    shutil.copy(BLACKJACK / "example_rollouts.jsonl", rollouts)
    topics = Topics.for_prefix(unique_name("big"))
    await make_topics(kafka_bootstrap, topics, partitions=1)
    cmd = [sys.executable, "-m", "rewardstream.commands.cli", "publish", "--inputs", str(inputs)]
    cmd += ["--rollouts", str(rollouts), "--quiet"]
    cmd += ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.inputs.removesuffix(".inputs")]
    cmd += ["--follow", "--finish-when-idle", "1"] if follow else []
    child = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(child.communicate(), 120)
    err = stderr.decode()
    assert child.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"rewardstream: error: {inputs} line 4: its event is "), err
    assert f"above the 1048588-byte max.message.bytes of {topics.inputs} (publishing stopped" in err
    # the three rows before it went out; the run never started, so nothing profiles it
    assert len(await read_all(kafka_bootstrap, topics.inputs, 1)) == 3
    assert await read_all(kafka_bootstrap, topics.control, 1) == []


class LiveReader:
    """Rollout events of one single-partition topic as they arrive."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.events: list[Rollout] = []

    async def until(self, count: int, timeout: float = 20.0) -> list[tuple[int, int]]:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert time.monotonic() < deadline, f"got {len(self.events)} of {count} events"
            for batch in (await self.consumer.getmany(timeout_ms=200)).values():
                self.events.extend(decode_rollout(r.value) for r in batch)
        return [(e.task, e.rollout) for e in self.events]

    async def settle(self, seconds: float) -> int:
        """How many events have arrived after ``seconds`` more of reading."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for batch in (await self.consumer.getmany(timeout_ms=100)).values():
                self.events.extend(decode_rollout(r.value) for r in batch)
        return len(self.events)


@pytest.fixture
async def live_topics(
    kafka_bootstrap: str, unique_name: UniqueName
) -> AsyncIterator[tuple[Topics, LiveReader]]:
    topics = Topics.for_prefix(unique_name("follow"))
    await make_topics(kafka_bootstrap, topics, partitions=1)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topics.rollouts, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        yield topics, LiveReader(consumer)
    finally:
        await consumer.stop()


def line(task: int, rollout: int) -> bytes:
    row = {"reward": task + rollout / 10, "agent_ref": {"name": "a"}}
    return orjson.dumps(row | {"_ng_task_index": task, "_ng_rollout_index": rollout}) + b"\n"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


@needs_golden
@pytest.mark.kafka
def test_cli_publish(
    kafka_bootstrap: str, unique_name: UniqueName, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="rewardstream")
    rewardstream.commands.publish.add_parser(parser.add_subparsers(dest="command", required=True))
    prefix = unique_name("cli")
    args = parser.parse_args(
        [
            "publish",
            "--inputs",
            str(BLACKJACK / "example_rollouts_materialized_inputs.jsonl"),
            "--rollouts",
            str(BLACKJACK / "example_rollouts.jsonl"),
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            prefix,
            "--run-id",
            "cli-run",
            "--quiet",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("published run_id=cli-run inputs=5 rollouts=5 in ")
    assert out.endswith("s") and "\n" not in out
    control = asyncio.run(read_all(kafka_bootstrap, f"{prefix}.control", 1))
    assert [type(decode_control(r.value)) for r in control] == [RunStarted, RunFinished]


def inputs_for(path: Path, tasks: int, repeats: int = 2) -> Path:
    """A materialized inputs file of ``tasks`` x ``repeats`` rows: what follow expects."""
    rows = (
        {"_ng_task_index": t, "_ng_rollout_index": r} for t in range(tasks) for r in range(repeats)
    )
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


@pytest.mark.kafka
async def test_follow_tails_complete_lines_through_truncation_and_rotation(
    kafka_bootstrap: str, live_topics: tuple[Topics, LiveReader], tmp_path: Path
) -> None:
    topics, reader = live_topics
    inputs = inputs_for(tmp_path / "live_materialized_inputs.jsonl", 4)  # never all published
    rollouts = tmp_path / "live.jsonl"
    rollouts.write_bytes(line(0, 0) + line(0, 1))
    stop = asyncio.Event()
    task = asyncio.create_task(
        publish_files(
            inputs,
            rollouts,
            kafka_bootstrap,
            topics=topics,
            follow=True,
            finish_on_stop=True,
            stop=stop,
            run_id="live",
        )
    )
    try:
        assert await reader.until(2) == [(0, 0), (0, 1)]
        append(rollouts, line(1, 0) + line(1, 1))
        assert (await reader.until(4))[2:] == [(1, 0), (1, 1)]

        half = len(line(2, 0)) // 2
        append(rollouts, line(2, 0)[:half])
        assert await reader.settle(1.0) == 4  # several polls: the half line waits
        assert not task.done()  # (had it been parsed, it would have failed as malformed JSON)
        append(rollouts, line(2, 0)[half:])
        assert (await reader.until(5))[4:] == [(2, 0)]

        rollouts.write_bytes(line(2, 1))  # truncated to fewer bytes: read again from the start
        assert (await reader.until(6))[5:] == [(2, 1)]
        append(rollouts, line(0, 0))
        assert (await reader.until(7))[6:] == [(0, 0)]  # a duplicate: the processor dedupes

        os.replace(rollouts, tmp_path / "live.jsonl.1")  # rotated: the new file from its start
        rollouts.write_bytes(line(1, 0) * 3 + line(2, 0)[:half])
        assert (await reader.until(10))[7:] == [(1, 0)] * 3
        assert await reader.settle(0.6) == 10
        assert not task.done()  # 10 lines, but 6 of the 8 expected rollouts
    finally:
        stop.set()
        report = await asyncio.wait_for(task, 30)

    assert report == PublishReport("live", 8, 10, report.seconds, True)  # finish_on_stop
    assert await control_events(kafka_bootstrap, topics) == [
        RunStarted(run_id="live", expected_rollouts=8, output_stem="live"),
        RunFinished(run_id="live"),
    ]


CLI_MAIN = """
import argparse, sys
import rewardstream.commands.publish
parser = argparse.ArgumentParser(prog="rewardstream")
rewardstream.commands.publish.add_parser(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


@contextlib.asynccontextmanager
async def publish_child(
    bootstrap: str, topics: Topics, inputs: Path, rollouts: Path, *extra: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``rewardstream publish --follow`` as a child process, killed if still running after."""
    argv = ["publish", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    argv += ["--bootstrap", bootstrap, "--topic-prefix", topics.inputs.removesuffix(".inputs")]
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", CLI_MAIN, *argv, "--follow", "--quiet", *extra),
        cwd=Path(__file__).resolve().parents[1],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def ended(proc: asyncio.subprocess.Process) -> tuple[str, str]:
    """The child's stdout and stderr once it exits on its own, exit code 0 (within 120 s: a
    bound for a loaded machine, not a timing claim)."""
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


@pytest.mark.kafka
async def test_cli_follow_finishes_when_every_expected_rollout_is_published(
    kafka_bootstrap: str, live_topics: tuple[Topics, LiveReader], tmp_path: Path
) -> None:
    """No idle rule by default: a model slower between completions than any timeout still gets
    one final profile. A file read again from its start does not count its rollouts twice."""
    topics, reader = live_topics
    inputs = inputs_for(tmp_path / "slow_materialized_inputs.jsonl", 2)
    rollouts = tmp_path / "slow.jsonl"
    rollouts.write_bytes(line(0, 0) + line(0, 1))
    async with publish_child(kafka_bootstrap, topics, inputs, rollouts, "--run-id", "slow") as proc:
        await reader.until(2)
        await reader.settle(2.0)  # a long pause without a new line (the old test idled 1 s)
        assert proc.returncode is None
        assert await control_events(kafka_bootstrap, topics) == [
            RunStarted(run_id="slow", expected_rollouts=4, output_stem="slow")
        ]
        replaced = tmp_path / "slow.jsonl.new"  # rewritten: read again from its start
        replaced.write_bytes(line(0, 0) + line(0, 1) + line(1, 0))
        os.replace(replaced, rollouts)
        assert (await reader.until(5))[2:] == [(0, 0), (0, 1), (1, 0)]
        await reader.settle(1.0)  # 5 lines sent, 3 of the 4 rollouts
        assert proc.returncode is None
        assert len(await control_events(kafka_bootstrap, topics)) == 1
        append(rollouts, line(1, 1))
        out, err = await ended(proc)
    assert out.startswith("published run_id=slow inputs=4 rollouts=6 in "), out
    assert "left open" not in err
    assert await reader.until(6) == [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1)]
    assert [type(e) for e in await control_events(kafka_bootstrap, topics)] == [
        RunStarted,
        RunFinished,
    ]


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("sig", "extra"),
    [(signal.SIGINT, []), (signal.SIGTERM, []), (signal.SIGINT, ["--finish-on-stop"])],
    ids=["SIGINT", "SIGTERM", "SIGINT-finish-on-stop"],
)
async def test_cli_follow_stop_leaves_the_run_open_unless_asked(
    kafka_bootstrap: str,
    live_topics: tuple[Topics, LiveReader],
    tmp_path: Path,
    sig: signal.Signals,
    extra: list[str],
) -> None:
    topics, reader = live_topics
    inputs = inputs_for(tmp_path / "sig_materialized_inputs.jsonl", 2)
    rollouts = tmp_path / "sig.jsonl"
    rollouts.write_bytes(line(0, 0))
    async with publish_child(
        kafka_bootstrap, topics, inputs, rollouts, "--run-id", "sig", *extra
    ) as proc:
        await reader.until(1)  # it is following now
        append(rollouts, line(0, 1))
        await reader.until(2)
        proc.send_signal(sig)
        out, err = await ended(proc)
    assert out.startswith("published run_id=sig inputs=4 rollouts=2 in "), out
    control = [type(e) for e in await control_events(kafka_bootstrap, topics)]
    if extra:
        assert control == [RunStarted, RunFinished]
        assert err == ""
    else:
        assert control == [RunStarted]
        [message] = err.splitlines()
        assert message.startswith("stopped following: run 'sig' was left open"), message
        assert "without --follow and with --run-id sig" in message


@pytest.mark.kafka
async def test_cli_follow_finish_when_idle(
    kafka_bootstrap: str, live_topics: tuple[Topics, LiveReader], tmp_path: Path
) -> None:
    topics, reader = live_topics
    inputs = inputs_for(tmp_path / "idle_materialized_inputs.jsonl", 2)
    rollouts = tmp_path / "idle.jsonl"
    rollouts.write_bytes(line(0, 0))
    started = time.monotonic()
    async with publish_child(
        kafka_bootstrap, topics, inputs, rollouts, "--finish-when-idle", "1"
    ) as proc:
        assert await reader.until(1) == [(0, 0)]
        out, _ = await ended(proc)
    # idle for a second after its last send, which came after its start (no upper bound: a
    # loaded machine may take any time; a publisher that never finishes fails `ended`)
    assert time.monotonic() - started >= 1.0
    run_id = default_run_id(inputs, "idle")
    assert out.startswith(f"published run_id={run_id} inputs=4 rollouts=1 in "), out
    assert [type(e) for e in await control_events(kafka_bootstrap, topics)] == [
        RunStarted,
        RunFinished,
    ]


# --------------------------------------------------------------------------- without a broker


def test_cli_errors_propagate(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="rewardstream")
    rewardstream.commands.publish.add_parser(parser.add_subparsers(dest="command", required=True))
    missing, rollouts = tmp_path / "missing.jsonl", tmp_path / "r.jsonl"
    argv = f"publish --inputs {missing} --rollouts {rollouts} --bootstrap 127.0.0.1:1"
    args = parser.parse_args(argv.split())
    with pytest.raises(InputError, match=r"Input file not found: .*missing\.jsonl' \(--inputs\)"):
        args.func(args)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--follow", "--finish-when-idle", "0"], "must be a number of seconds > 0, got 0.0"),
        (["--follow", "--idle-timeout", "-1"], "must be a number of seconds > 0, got -1.0"),
        (["--follow", "--finish-when-idle", "nan"], "must be a number of seconds > 0, got nan"),
        (["--finish-when-idle", "5"], "only apply with --follow"),
        (["--finish-on-stop"], "only apply with --follow"),
    ],
)
def test_cli_bad_follow_options_fail_before_anything(
    tmp_path: Path, options: list[str], message: str
) -> None:
    parser = argparse.ArgumentParser(prog="rewardstream")
    rewardstream.commands.publish.add_parser(parser.add_subparsers(dest="command", required=True))
    inputs, rollouts = _two_files(tmp_path, "r")
    argv = f"publish --inputs {inputs} --rollouts {rollouts} --bootstrap 127.0.0.1:1".split()
    args = parser.parse_args([*argv, *options])
    with pytest.raises(InputError, match=message):
        args.func(args)


def test_default_run_id_names_a_collection_not_a_path(tmp_path: Path) -> None:
    """The same files republished keep their run; a new collection at the same path (the
    collector writes its materialized inputs anew, atomically) gets a new one."""
    inputs, rollouts = _two_files(tmp_path, "r")
    first = default_run_id(inputs, rollouts.stem)
    assert first.startswith("r-") and len(first) == len("r-") + 8
    assert rows_of(inputs) and rows_of(rollouts)  # read, as a publish reads them
    assert default_run_id(inputs, rollouts.stem) == first

    write_rows(inputs, rows_of(inputs))  # the same rows, a second collection
    rollouts.write_bytes(line(0, 0))
    second = default_run_id(inputs, rollouts.stem)
    assert second != first
    assert default_run_id(inputs, rollouts.stem) == second
    assert default_run_id(inputs, "a b") == f"a_b-{second[2:]}"  # the stem made valid


def _two_files(tmp_path: Path, stem: str) -> tuple[Path, Path]:
    inputs, rollouts = tmp_path / f"{stem}_materialized_inputs.jsonl", tmp_path / f"{stem}.jsonl"
    inputs.write_bytes(orjson.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0}) + b"\n")
    rollouts.write_bytes(line(0, 0))
    return inputs, rollouts


@pytest.mark.parametrize(
    ("stem", "run_id", "message"),
    [
        ("ok", "", "invalid run id ''"),
        ("ok", "x" * 201, "invalid run id"),
        ("with space", None, "invalid rollouts file stem 'with space'"),
    ],
)
async def test_bad_run_id_or_stem_fails_before_connecting(
    tmp_path: Path, stem: str, run_id: str | None, message: str
) -> None:
    inputs, rollouts = _two_files(tmp_path, stem)
    with pytest.raises(InputError, match=message):
        await publish_files(inputs, rollouts, "127.0.0.1:1", run_id=run_id)


async def test_unreachable_broker_is_an_input_error(tmp_path: Path) -> None:
    inputs, rollouts = _two_files(tmp_path, "r")
    with pytest.raises(InputError, match=r"cannot reach Kafka at 127\.0\.0\.1:\d+"):
        await publish_files(inputs, rollouts, f"127.0.0.1:{free_port()}")


# --------------------------------------------------------------------------- records on the wire

_KEYS = st.one_of(
    st.sampled_from(
        ["reward", "mask_sample", "agent_name", "agent_ref", "input_tokens", "total_tokens", "x"]
    ),
    st.text(max_size=6),
    st.text(max_size=5).map(lambda s: "_" + s),
)
_INTS = st.integers(-(2**63), 2**64 - 1)  # what orjson parses as an int
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)  # orjson rejects the others
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, st.text())
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_USAGE = st.dictionaries(_KEYS, st.one_of(_INTS, _FLOATS, st.booleans(), st.none(), _JSON))


@st.composite
def results(draw: st.DrawFn) -> dict[str, Any]:
    """Result rows whose response/usage collide with top-level keys, in random key order."""
    items = draw(st.lists(st.tuples(_KEYS, _JSON), max_size=8))
    if draw(st.booleans()):
        items.append(("mask_sample", draw(_JSON)))
    if draw(st.booleans()):
        items.append(("reward", draw(_JSON)))
    response = draw(
        st.one_of(
            st.none(),
            st.sampled_from([{}, [], "", 0, 0.0, False]),  # falsy: no usage; numbers: a column
            st.fixed_dictionaries(
                {"id": st.text(max_size=3)},
                optional={"usage": st.one_of(st.none(), st.just({}), _USAGE)},
            ),
        )
    )
    items.insert(draw(st.integers(0, len(items))), ("response", response))
    return dict(items)


@settings(max_examples=400, deadline=None)
@given(results(), st.integers(0, 2**40), st.integers(0, 64))
@example({"reward": 1.0, "response": 0}, 0, 0)  # a falsy numeric response is a column
@example({"response": False, "total_tokens": 3}, 0, 0)
@example({"response": None, "reward": 2**53 + 1}, 0, 0)
def test_the_wire_carries_the_profilers_record(
    result: dict[str, Any], task: int, rollout: int
) -> None:
    try:
        record = extract_result(result, task, rollout)
    except InvalidRow:
        return  # the publisher fails such a line with this error (test_bad_line_fails_...)
    raw = encode_rollout("run", task, rollout, "agent", record, 1.5)
    event = Rollout(
        run_id="run", task=task, rollout=rollout, agent="agent", record=record, published_at=1.5
    )
    assert decode_rollout(raw) == event
    assert encode(event) == raw
    # the schema-2 bytes, written out by hand
    wire = {
        "names": record.names,
        "ints": record.is_int,
        "values": record.values,
        "info": orjson.Fragment(record.info),
        "masked": record.masked,
    }
    if record.big:  # ints beyond 2**53, exact beside their rounded floats
        wire["big"] = record.big
    expected = {"v": 2, "run_id": "run", "type": "rollout", "task": task, "rollout": rollout}
    expected |= {"agent": "agent", "record": wire, "published_at": 1.5}
    assert raw == orjson.dumps(expected)
