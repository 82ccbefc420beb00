"""Content is identity: an event whose (run, task, rollout) key was folded already is a duplicate
only when its content is the same; with other content it is a conflict, reported, never
dropped as a duplicate (issue 24, finding 2)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.engine import EngineTopics, FinalRecord
from rewardstream.contract.events import (
    EventKind,
    Input,
    Rollout,
    Topics,
    content_digest,
    content_sum,
    decode_input,
    decode_rollout,
    encode,
)
from rewardstream.contract.names import ProfilePaths
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.engine.pipeline import Pipeline, log_level
from rewardstream.processors.engine.runs import Part
from rewardstream.processors.stream import StreamProcessor
from rewardstream.producers.gym.collect import CollectConfig, collect
from rewardstream.producers.publisher.live import KafkaSink
from rewardstream.sinks.metrics import Metrics
from rewardstream.sinks.topics.content import Conflict, files_content
from rewardstream.sinks.topics.profiles import list_finals
from tests.golden import assert_batch_files, file_events, generated_collection
from tests.gym import serve, write_problems
from tests.processes import Processor, make_topics, send_events
from tests.test_poison import dead_letters


def _rollout(task: int, rollout: int, reward: float = 1.0, at: float = 0.0) -> bytes:
    row = {"reward": reward, "_ng_task_index": task, "_ng_rollout_index": rollout}
    record = extract_result(row, task, rollout)
    event = Rollout(run_id="r", task=task, rollout=rollout, record=record, published_at=at)
    return encode(event)


def _input(task: int, rollout: int, question: str = "q", line: int = 0) -> bytes:
    row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "question": question}
    return encode(Input(run_id="r", line=line, row=row))


def _metrics(pipeline: Pipeline) -> Metrics:
    return Metrics(lambda: pipeline.runs)


def _rejected(metrics: Metrics, kind: str, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "rewardstream_events_rejected_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def _apply(pipeline: Pipeline, kind: EventKind, batches: list[list[bytes]], batch: bool) -> None:
    """Apply the batches to unit ``<kind>-0``, as batches or one event at a time."""
    at = 0
    for raws in batches:
        if batch:
            handle = pipeline.handle_rollouts if kind == "rollout" else pipeline.handle_inputs
            assert handle(raws, f"{kind}-0", range(at, at + len(raws))) is not None
        else:
            for i, raw in enumerate(raws):
                pipeline.handle(kind, raw, f"{kind}-0", at + i)
        at += len(raws)


@pytest.mark.parametrize("batch", [False, True])
def test_a_rollout_of_a_folded_key_is_a_duplicate_only_with_the_same_content(
    tmp_path: Path, batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with Pipeline(tmp_path) as pipeline:
        rejected = pipeline.rejected
        pipeline.metrics = metrics = _metrics(pipeline)
        rows = [_input(t, r, line=i) for i, (t, r) in enumerate([(0, 0), (0, 1), (1, 0), (2, 0)])]
        _apply(pipeline, "input", [rows], batch)  # a rollout counts once its row is in
        first = [_rollout(0, 0), _rollout(0, 1), _rollout(1, 0)]
        again = [
            _rollout(0, 0, at=99.0),  # republished: a duplicate (published_at is no content)
            _rollout(0, 1, reward=0.0),  # same key, other reward: a conflict
            _rollout(2, 0),  # new
            _rollout(2, 0, reward=0.5),  # same key as the one before it, in one batch
        ]
        _apply(pipeline, "rollout", [first, again], batch)
        run = pipeline.runs["r"]
        assert (run.rollouts, run.duplicates, run.conflicts) == (4, 1, 2)
        assert [r.reason for r in rejected] == ["conflict", "conflict"]
        assert [r.raw for r in rejected] == [again[1], again[3]]
        assert "run 'r' task 0 rollout 1" in rejected[0].detail
        assert "--run-id" in rejected[0].detail
        assert _rejected(metrics, "rollout", "conflict") == 2
        part = pipeline.units["rollout-0"].parts["r"]
        assert part.conflicts == 2
        # the first content stands
        assert part.state.pool.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_a_conflict_is_an_error_line_naming_run_task_and_rollout(tmp_path: Path) -> None:
    """The engine returns the conflict; the transport logs it at ``log_level`` (the Kafka
    processor's "dead letter from" line)."""
    with Pipeline(tmp_path) as pipeline:
        pipeline.handle("rollout", _rollout(3, 2), "rollout-0", 0)
        pipeline.handle("rollout", _rollout(3, 2, reward=0.0), "rollout-0", 1)
    [conflict] = [r for r in pipeline.take_rejected() if r.reason == "conflict"]
    assert log_level(conflict.reason) == logging.ERROR
    assert "run 'r' task 3 rollout 2" in conflict.detail
    assert conflict.offset == 1


def test_every_reject_names_its_own_offset_on_either_path(tmp_path: Path) -> None:
    """The transport names a dead letter ``topic:partition:offset`` from the offset the engine
    returns with it: a slice the batch path folds whole (conflicts) and one it hands to the
    one-by-one path (a bad event among them) name the same offsets, gaps in the log included
    (a transactional producer's markers take offsets)."""
    rows = [_input(t, 0, line=t) for t in range(4)]
    first = [_rollout(t, 0) for t in range(4)]
    again = [_rollout(0, 0, reward=0.0), _rollout(1, 0), _rollout(2, 0, reward=0.5)]
    for odd, want in (([], [11, 17]), ([b"not json"], [11, 14, 17])):
        with Pipeline(tmp_path / str(len(odd))) as pipeline:
            pipeline.apply("input", rows, "input-0", [0, 2, 3, 7])
            pipeline.apply("rollout", first, "rollout-0", [0, 1, 5, 6])
            assert pipeline.take_rejected() == []
            offsets = [11, 12, 14, 17] if odd else [11, 12, 17]
            pipeline.apply("rollout", [again[0], again[1], *odd, again[2]], "rollout-0", offsets)
            rejected = pipeline.take_rejected()
            assert [r.offset for r in rejected] == want
            assert pipeline.rejected == []  # taken once
            assert pipeline.runs["r"].conflicts == 2


async def test_the_processor_names_each_dead_letter_by_its_own_record(tmp_path: Path) -> None:
    """The Kafka processor hands a slice to the engine and names each reject it gets back
    ``topic:partition:offset``: the conflict and the bad event of one slice, each its own (no
    broker: the records are made here, as the consumer would give them)."""
    processor = StreamProcessor("127.0.0.1:1", None, state_dir=tmp_path)
    topics, now = processor.topics, int(time.time() * 1000)

    def records(topic: str, values: list[bytes], offsets: list[int]) -> list[ConsumerRecord]:
        return [
            ConsumerRecord(topic, 3, at, now, 0, None, value, None, 0, len(value), ())
            for value, at in zip(values, offsets, strict=True)
        ]

    try:
        for name in ("input-3", "rollout-3"):
            processor.pipeline.unit(name)  # assigned
        rows = [_input(t, 0, line=t) for t in range(2)]
        outs = [_rollout(0, 0), _rollout(0, 0, reward=0.0), b"{bad", _rollout(1, 0)]
        apply = processor.consume._apply
        await apply(TopicPartition(topics.inputs, 3), records(topics.inputs, rows, [0, 1]), 0)
        await apply(
            TopicPartition(topics.rollouts, 3), records(topics.rollouts, outs, [4, 9, 10, 12]), 0
        )
        named = [(source, r.reason) for r, source in processor.dead_letters.rejected]
        assert named == [
            (f"{topics.rollouts}:3:9", "conflict"),
            (f"{topics.rollouts}:3:10", "not-json"),
        ]
        assert processor.pipeline.units["rollout-3"].position == 13
    finally:
        processor.pipeline.close()


@pytest.mark.parametrize("batch", [False, True])
def test_an_input_row_of_a_folded_key_is_a_duplicate_only_with_the_same_content(
    tmp_path: Path, batch: bool
) -> None:
    with Pipeline(tmp_path) as pipeline:
        rejected = pipeline.rejected
        pipeline.metrics = metrics = _metrics(pipeline)
        first = [_input(0, 0, line=0), _input(0, 1, line=1)]
        again = [
            _input(0, 0, line=0),  # the same row again
            _input(0, 1, question="other", line=1),  # other content
            _input(0, 1, line=5),  # the same row at another line of the inputs file
        ]
        _apply(pipeline, "input", [first, again], batch)
        run = pipeline.runs["r"]
        assert (run.inputs, run.duplicates) == (2, 1)
        assert [(r.kind, r.reason, r.raw) for r in rejected] == [
            ("input", "conflict", again[1]),
            ("input", "conflict", again[2]),
        ]
        assert "run 'r' task 0 rollout 1" in rejected[0].detail
        assert _rejected(metrics, "input", "conflict") == 2


def test_a_row_too_deep_to_write_back_is_rejected_even_when_its_key_was_seen(
    tmp_path: Path,
) -> None:
    """Its digest cannot be taken (msgpack recurses no deeper than orjson writes): refused
    as invalid, as a row of a new key is, never a crash of the fold."""
    deep = _input(0, 0).replace(b'"question":"q"', b'"question":' + b"[" * 900 + b"]" * 900)
    with Pipeline(tmp_path) as pipeline:
        rejected = pipeline.rejected
        _apply(pipeline, "input", [[_input(0, 0)]], batch=False)
        _apply(pipeline, "input", [[deep]], batch=False)
    assert [r.reason for r in rejected] == ["invalid-event"]


def test_a_key_looked_up_again_after_more_keys_came_is_judged_by_its_own_content(
    tmp_path: Path,
) -> None:
    """The key index is built on the first repeat and kept up to date after it, whatever the
    indices (packed, or not: negative or large rollout indices, huge task indices)."""
    keys = [(t, r) for t in range(300) for r in (0, 1, 4095, 4096, -1)] + [(2**62, 3)]
    rng = random.Random(0)
    rng.shuffle(keys)
    part = Part(tmp_path / "s")
    half = len(keys) // 2
    reward = {key: float(rng.random()) for key in keys}
    for key in keys[:half]:
        assert part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
    assert not part.add_rollout(decode_rollout(_rollout(*keys[0], reward=reward[keys[0]])))
    for key in keys[half:]:
        assert part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
    for key in rng.sample(keys, 200):
        assert not part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key])))
        assert not part.add_rollout(decode_rollout(_rollout(*key, reward=reward[key] + 1)))
    assert (part.duplicates, part.conflicts) == (201, 200)


def test_a_parts_content_is_the_sum_of_its_keys_digests_whatever_the_order(
    tmp_path: Path,
) -> None:
    rollouts = [_rollout(t, r, reward=t * 0.5 + r) for t in range(20) for r in range(3)]
    inputs = [_input(t, r, line=3 * t + r) for t in range(20) for r in range(3)]
    want = content_sum(
        [content_digest(decode_rollout(raw)) for raw in rollouts]
        + [content_digest(decode_input(raw)) for raw in inputs]
    )
    for seed in range(3):
        rng = random.Random(seed)
        shuffled = rng.sample(rollouts, len(rollouts)) + rng.sample(rollouts, 10)
        with Pipeline(tmp_path / str(seed)) as pipeline:
            for raw in shuffled:
                pipeline.handle("rollout", raw, f"rollout-{rng.randrange(1)}")
            for raw in rng.sample(inputs, len(inputs)):
                pipeline.handle("input", raw, "input-0")
            parts = pipeline.runs["r"].parts.values()
            assert content_sum(p.contents.total for p in parts) == want


def test_the_digest_reads_content_not_bytes_nor_publish_time() -> None:
    spaced = _rollout(1, 2).replace(b'"info":{"', b'"info":{ "')
    assert spaced != _rollout(1, 2)
    same = {content_digest(decode_rollout(raw)) for raw in (_rollout(1, 2), spaced)}
    same.add(content_digest(decode_rollout(_rollout(1, 2, at=5.0))))
    assert len(same) == 1
    others = [_rollout(1, 3), _rollout(2, 2), _rollout(1, 2, reward=2.0)]
    assert len({content_digest(decode_rollout(raw)) for raw in others} | same) == 4
    row = orjson.loads(_input(1, 2))["row"]
    assert content_digest(decode_input(_input(1, 2))) == content_digest(
        Input(run_id="other", line=0, row=row)
    )


# ------------------------------------------------------------------ end to end, real Kafka


def _publish(bootstrap: str, prefix: str, inputs: Path, rollouts: Path, *extra: str) -> Finished:
    """``rewardstream publish --wait-profile`` as a user runs it: a process of its own."""
    argv = [sys.executable, "-m", "rewardstream.commands.cli", "publish", "--inputs", str(inputs)]
    argv += ["--rollouts", str(rollouts), "--bootstrap", bootstrap, "--topic-prefix", prefix]
    argv += ["--quiet", "--wait-profile", "--wait-timeout", "90", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


Finished = subprocess.CompletedProcess[str]


def _other_collection(rollouts: Path, batch: Path) -> None:
    """Write a new collection of the same inputs at ``rollouts`` (a new file at the same path,
    other rewards), and its batch profile into ``batch``."""
    lines = []
    for raw in rollouts.read_bytes().splitlines():
        row = orjson.loads(raw)
        row["reward"] = 1.0 - float(row["reward"])
        lines.append(orjson.dumps(row) + b"\n")
    fresh = rollouts.with_suffix(".new")
    fresh.write_bytes(b"".join(lines))
    os.replace(fresh, rollouts)
    batch.mkdir()
    shutil.copy(rollouts, batch / rollouts.name)
    shutil.copy(rollouts.parent / "r_materialized_inputs.jsonl", batch)
    argv = [f"+materialized_inputs_jsonl_fpath={batch / 'r_materialized_inputs.jsonl'}"]
    assert (
        ng_reward_profile([*argv, f"+rollouts_jsonl_fpath={batch / 'r.jsonl'}", "+quiet=true"]) == 0
    )


def _profiles(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(folder.glob("r_*")) if "materialized" not in p.name
    }


def _reasons(bootstrap: str, topics: Topics, least: int = 0) -> list[str]:
    """The reason of every dead letter, once there are at least ``least``."""
    parked = asyncio.run(dead_letters(bootstrap, topics.dead_letters, least))
    return [dict(r.headers)["reason"].decode() for r in parked]


def _topics(bootstrap: str, prefix: str) -> Topics:
    """The data topics (2 partitions) and the dead letters' (one), made up front."""
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(bootstrap, topics, 2))

    async def dead_letter_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topics.dead_letters, 1, 1)])
        finally:
            await admin.close()

    asyncio.run(dead_letter_topic())
    return topics


def _start(bootstrap: str, prefix: str, log: Path, processors: list[Processor]) -> None:
    """A processor, once it owns the four data partitions (its engine topics made)."""
    processor = Processor(bootstrap, prefix, log.parent / "out", log)
    processors.append(processor)
    processor.wait(lambda _: len(processor.units()) == 4)


def _copy(tmp_path: Path, inputs: Path, rollouts: Path) -> tuple[Path, Path]:
    """The collection's two files in a folder of their own, as a NeMo Gym user has them."""
    pub = tmp_path / "pub"
    pub.mkdir()
    for path in (inputs, rollouts):
        shutil.copy(path, pub / path.name)
    return pub / inputs.name, pub / rollouts.name


@pytest.mark.kafka
def test_a_new_collection_next_to_unchanged_inputs_is_refused_not_given_the_old_profile(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Issue 24, finding 1, end to end: the second collection used to get the first one's run
    id, its events parked as ``run-final`` dead letters, and ``--wait-profile`` wrote the
    *old* profile next to the new rollouts, exit 0."""
    inputs, rollouts = generated_collection(tmp_path / "a", tasks=60, repeats=3, seed=5)
    prefix = unique_name("rs")
    topics = _topics(kafka_bootstrap, prefix)
    log = tmp_path / "processor.log"
    _start(kafka_bootstrap, prefix, log, processors)
    mine = _copy(tmp_path, inputs, rollouts)
    pub = mine[1].parent
    first = _publish(kafka_bootstrap, prefix, *mine)
    assert first.returncode == 0, first.stderr
    assert_batch_files(pub, inputs.parent)

    _other_collection(mine[1], tmp_path / "b")  # same path, inputs untouched
    before = _profiles(pub)
    second = _publish(kafka_bootstrap, prefix, *mine)
    assert second.returncode != 0
    [line] = second.stderr.strip().splitlines()
    assert "not the profile of" in line and "--run-id" in line, line
    assert _profiles(pub) == before  # nothing written next to the new rollouts
    assert _reasons(kafka_bootstrap, topics) == []  # refused up front: nothing sent

    third = _publish(
        kafka_bootstrap, prefix, pub / inputs.name, pub / rollouts.name, "--run-id", "b"
    )
    assert third.returncode == 0, third.stderr
    assert_batch_files(pub, tmp_path / "b")  # a new run: the new collection's own profile

    # the first collection's files again: already final with this content, nothing sent
    shutil.copy(rollouts, mine[1])
    again = _publish(kafka_bootstrap, prefix, *mine)
    assert again.returncode == 0, again.stderr
    assert "nothing sent" in again.stderr
    assert_batch_files(pub, inputs.parent)
    assert _reasons(kafka_bootstrap, topics) == []


@pytest.mark.kafka
def test_other_content_under_an_open_run_is_a_conflict_and_its_final_is_never_written(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A collection published halfway (never finished), then another one of the same inputs
    under the same run id: every key the first sent is a conflict (dead letter, ERROR line),
    and ``--wait-profile`` refuses the final, which is neither collection's profile."""
    inputs, rollouts = generated_collection(tmp_path / "a", tasks=40, repeats=3, seed=6)
    prefix = unique_name("rs")
    topics = _topics(kafka_bootstrap, prefix)
    log = tmp_path / "processor.log"
    _start(kafka_bootstrap, prefix, log, processors)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    half = [e for e in events if e[0] == "input"] + [e for e in events if e[0] == "rollout"][:50]
    send_events(kafka_bootstrap, topics, half, "run")
    mine = _copy(tmp_path, inputs, rollouts)
    _other_collection(mine[1], tmp_path / "b")
    done = _publish(kafka_bootstrap, prefix, *mine, "--run-id", "run")
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "50 events of its collection had the key of another" in line, line
    assert _profiles(mine[1].parent) == {}  # no final written next to the files
    assert _reasons(kafka_bootstrap, topics, 50) == ["conflict"] * 50
    errors = [x for x in log.read_text().splitlines() if "ERROR" in x and "conflict" in x]
    assert len(errors) == 50 and "run 'run' task" in errors[0]
    assert processors[0].runs()["run"]["conflicts"] == 50  # /runs says so too


@pytest.mark.kafka
def test_a_final_short_of_events_the_processors_rejected_is_refused_saying_so(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """An input row larger than the processors' ``--max-event-bytes`` is parked
    (``oversized``), so the final holds fewer keys than the files: ``--wait-profile`` writes
    nothing, and its line gives both counts and points at the dead letters, not at another
    collection (a new run id would be rejected the same)."""
    inputs, rollouts = generated_collection(tmp_path / "a", tasks=20, repeats=2, seed=7)
    rows = inputs.read_bytes().splitlines()
    big = orjson.loads(rows[0])
    big["padding"] = "x" * 30_000
    inputs.write_bytes(b"\n".join([orjson.dumps(big), *rows[1:]]) + b"\n")
    prefix = unique_name("rs")
    topics = _topics(kafka_bootstrap, prefix)
    log = tmp_path / "processor.log"
    processor = Processor(
        kafka_bootstrap, prefix, tmp_path / "out", log, extra=["--max-event-bytes", "20000"]
    )
    processors.append(processor)
    processor.wait(lambda _: len(processor.units()) == 4)
    mine = _copy(tmp_path, inputs, rollouts)
    done = _publish(kafka_bootstrap, prefix, *mine, "--run-id", "big")
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "it holds 39 input rows" in line and "the files 40 and 40" in line, line
    assert "dead-letter topic" in line and "other content" not in line, line
    assert _profiles(mine[1].parent) == {}
    assert "oversized" in _reasons(kafka_bootstrap, topics, 1)


@pytest.mark.kafka
def test_a_publish_run_again_after_a_crash_never_conflicts(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """The rollouts file is the record: what was published of it (the first lines, as a
    crash leaves it, the last written line never published) comes back the same, so a
    publish of the whole file afterwards is duplicates and new keys, never a conflict."""
    inputs, rollouts = generated_collection(tmp_path / "a", tasks=40, repeats=3, seed=7)
    prefix = unique_name("rs")
    topics = _topics(kafka_bootstrap, prefix)
    _start(kafka_bootstrap, prefix, tmp_path / "p.log", processors)
    run_id = "r-0123abcd"
    events = file_events(inputs, rollouts, run_id, "r", finish=False)
    sent = [e for e in events if e[0] == "input"] + [e for e in events if e[0] == "rollout"][:70]
    send_events(kafka_bootstrap, topics, sent, run_id)  # then the crash
    mine = _copy(tmp_path, inputs, rollouts)
    done = _publish(kafka_bootstrap, prefix, *mine, "--run-id", run_id)
    assert done.returncode == 0, done.stderr
    assert_batch_files(mine[1].parent, inputs.parent)
    assert _reasons(kafka_bootstrap, topics) == []
    [final] = asyncio.run(_finals(kafka_bootstrap, topics)).values()
    assert (final.conflicts, final.content) == (0, files_content(*mine, run_id, None).digest)


async def _finals(bootstrap: str, topics: Topics) -> dict[tuple[str, str], FinalRecord]:
    prefix = topics.control.removesuffix(".control")
    return await list_finals(bootstrap, KafkaSecurity(), EngineTopics.of(topics), prefix, None)


class _Crash(Exception):
    """The collector dies here: its line is on disk, its event never sent."""


class _CrashingSink(KafkaSink):
    """The live sink of a collector that dies right after the durable write of its
    ``crash_at``-th result, before that result is published."""

    def __init__(self, bootstrap: str, topics: Topics, crash_at: int) -> None:
        super().__init__(bootstrap, topics)
        self.crash_at, self.results = crash_at, 0

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        if kind == "rollout":
            self.results += 1
            if self.results == self.crash_at:
                raise _Crash(where)
        return await super().send(kind, key, value, where)


async def _agent(request: web.Request) -> web.Response:
    """A deterministic agent: the same row always gets the same result."""
    row = orjson.loads(await request.read())
    reward = (row["_ng_task_index"] * 7 + row["_ng_rollout_index"]) % 3 / 2
    return web.json_response({"response": {}, "reward": reward} | row)


@pytest.mark.kafka
async def test_a_resumed_collection_never_conflicts_and_a_final_one_is_sent_nothing(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """The collector writes a result, then publishes it: killed between the two, its resume
    publishes the file's lines (the record), never other content; resumed once more with
    nothing left to run, it sends nothing to the final run (no ``run-final`` dead letters) and
    writes that final; a new collection given the final run's id is refused up front."""
    prefix = unique_name("rs")
    topics = await asyncio.to_thread(_topics, kafka_bootstrap, prefix)
    await asyncio.to_thread(_start, kafka_bootstrap, prefix, tmp_path / "p.log", processors)
    runner, url = await serve({"/run": _agent})
    try:
        cfg = CollectConfig.model_validate(
            {
                "input_jsonl_fpath": write_problems(tmp_path / "problems.jsonl", 12),
                "output_jsonl_fpath": tmp_path / "out" / "r.jsonl",
                "num_repeats": 2,
                "agent_url": url,
                "num_samples_in_parallel": 1,
                "kafka_bootstrap_servers": kafka_bootstrap,
                "kafka_topic_prefix": prefix,
                "kafka_wait_profile_timeout_s": 90,
                "quiet": True,
            }
        )
        sink = await _CrashingSink(kafka_bootstrap, topics, crash_at=9).start()
        with pytest.raises(_Crash):
            await collect(cfg, sink)
        rollouts = tmp_path / "out" / "r.jsonl"
        assert rollouts.read_bytes().count(b"\n") == 9  # written; 8 of them published

        resumed = cfg.model_copy(update={"resume_from_cache": True, "kafka_wait_profile": True})
        report = await collect(resumed)
        assert (report.cached, report.completed) == (9, 15)
        batch = tmp_path / "batch"
        batch.mkdir()
        for path in (rollouts, rollouts.with_name("r_materialized_inputs.jsonl")):
            shutil.copy(path, batch / path.name)
        argv = [f"+materialized_inputs_jsonl_fpath={batch / 'r_materialized_inputs.jsonl'}"]
        argv += [f"+rollouts_jsonl_fpath={batch / 'r.jsonl'}", "+quiet=true"]
        assert ng_reward_profile(argv) == 0
        assert_batch_files(rollouts.parent, batch)
        [final] = (await _finals(kafka_bootstrap, topics)).values()
        assert (
            final.conflicts == 0
            and final.content
            == files_content(
                rollouts.with_name("r_materialized_inputs.jsonl"), rollouts, report.run_id, None
            ).digest
        )

        for path in ProfilePaths.next_to(rollouts):
            path.unlink()
        again = await collect(resumed)  # nothing left to run: nothing sent, the final written
        assert (again.cached, again.completed, again.run_id) == (24, 0, report.run_id)
        assert_batch_files(rollouts.parent, batch)
        assert await asyncio.to_thread(_reasons, kafka_bootstrap, topics) == []

        fresh = cfg.model_copy(
            update={"kafka_run_id": report.run_id, "output_jsonl_fpath": tmp_path / "new.jsonl"}
        )
        with pytest.raises(Conflict, match="a new collection cannot enter it"):
            await collect(fresh)
    finally:
        await runner.cleanup()
