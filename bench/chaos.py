"""Fault-injection trials: a real broker, real processes, nothing lost, nothing counted twice.

    python -m bench.chaos [--fault all] [--trials 20] [--seed 0] [--bootstrap HOST:PORT]
                          [--summary FILE] [--keep DIR] [--fast] [--plant KIND]

Each trial is seeded (trial ``i`` of a fault runs seed ``--seed + i``; ``--fault F --seed S
--trials 1`` repeats one): it generates a collection (``bench/generate.py``, 300-2,000 tasks x
4-8 rollouts, three agents), profiles it with the batch profiler, then streams it through real
``rewardstream stream`` and ``rewardstream publish`` child processes (the rollouts file grows
while the publisher follows it, as during a collection) and injects one fault:

- ``kill-processor``: ``kill -9`` of the processor, twice, each aimed at one moment: while it
  consumes a backlog, between two offset commits of its catch-up (mode ``checkpoint``:
  ``--checkpoint-every 0.05``, the group's committed offsets polled until one moves, then a
  kill within one commit interval), or while a ``POST /runs/<id>/snapshot`` is in flight; then
  a restart; sometimes once more while it writes the final profile (its files in its
  ``--state-dir``, then the Kafka transaction);
- ``broker-restart``: the broker (its own, for this trial) stopped (SIGTERM or SIGKILL) and
  started again on the same data dir and port mid-run; nothing else is restarted;
- ``group-rebalance``: two or three processors in one group, one (or two in turn) killed with
  ``kill -9`` mid-run and brought back;
- ``publisher-rerun``: the publisher's process group killed mid-publish and the publisher run
  again on the same files, sometimes followed by a whole republish killed and re-run too;
- ``disorder``: events sent by hand: inputs shuffled, rollouts shuffled, some tasks' inputs
  only after all their rollouts, rollouts after a snapshot (which is checked against the
  batch partial profile of what it covers), redelivered copies;
- ``pause-member``: a member stopped (SIGSTOP) past its session timeout while the group moves
  its partitions on, then resumed;
- ``pod-loss``: ``kill -9`` of a member mid-run, its private tmpfs gone with it (a pod lost
  with its disk), and a replacement on a fresh disk; sometimes twice;
- ``zombie``: a member (often the leader) stopped past the consumer session timeout
  (:data:`SESSION_TIMEOUT_S` plus 1-4 s), sometimes until the run is final, then resumed: its
  group's committed positions must never go back, and the run has exactly one final record;
- ``scale``: one member, then three (two started mid-run), then one again (two stopped with
  SIGTERM, as a scale-down does), during the run;
- ``broker-kill``: a three-broker cluster of its own (data topics with replication 3, min ISR
  2), one broker killed (``kill -9``) mid-run, and started again later in half the trials;
- ``two-groups``: two groups of processors on the same topics side by side, each with its own
  exactly-one final (``profiles get --group-id``), both equal to batch; sometimes a member of
  one of them killed and replaced;
- ``baseline``: no fault (the control); with ``--plant`` (:data:`PLANTS`) a finding the
  judge must report: the harness's self-test (``tests/test_chaos.py``);
- ``conflict``, ``foreign-keys``, ``frozen-peer``, ``snapshot-storm``, ``member-churn``
  (issue 24): each method's docstring says what the product must do, e.g. exactly N
  ``conflict`` dead letters, snapshots answered within :data:`SNAPSHOT_BOUND_S`;
- ``older-format``: a member record of a newer format (``"v": 2``) planted in another prefix's
  ``<prefix>.members``: a processor of that prefix must stop with exit code 2 and one error
  line, having written nothing (no Kafka record, no committed offset, no file on its disk),
  while the group of the trial's own prefix runs undisturbed.

Every processor is a separate host (``tests.processes.Processor(private_disk=...)``: a mount
namespace of its own, ``unshare -m``, with its ``--state-dir`` and ``--output-dir`` on a private
disk; root only), and the data topics have 4 partitions. The disk is a private tmpfs, gone with
the process, except for the hosts a trial restarts "on the same host" (``kill-processor``,
``group-rebalance``): a folder of that host bind-mounted there, which only it and its own
successor ever see. Mid-run snapshots (``kill-processor`` in ``snapshot`` mode excepted, where
it is killed: in ``pod-loss``, ``scale``, ``group-rebalance``, ``two-groups`` and ``disorder``)
are checked against ``ng_reward_profile ++allow_partial_rollouts=True`` on exactly what they
report having covered: the data topics read up to the offsets ``rewardstream snapshot``
prints, this run's events kept, rollouts deduplicated by (task, rollout), first seen, and each
mapped back to its line of the collection's files; a snapshot of a run already final must
equal the final profile.

Processors share nothing but Kafka: the run's final profile is the one in Kafka
(``<prefix>.finals`` and ``<prefix>.profiles``, fetched with ``rewardstream profiles get``, per
group), checked byte for byte against the batch one, with exactly one final record of the run
per group (and so is the copy the processor that wrote it mirrors into its
``--output-dir/<run_id>/``, read through ``/proc/<pid>/root``, when it was not killed before it
could or since). Lost and double-counted rollouts are counted three ways: per task from the
final profile's ``num_rollouts``, from the processors' ``/runs`` counters, and from an audit of
the final record against the collection (its inputs and rollouts, in all and per unit, each
held once, and every offset of a unit before the record's cut counted once: as new or as a
duplicate, or parked as a dead letter). Events read after the final are dead letters
(``run-final``); besides those, the dead letters (every partition, read to its end) must be
exactly those the fault kind expects (none for most); anything else is a finding.
Recovery time: from the restart of the killed component (for ``zombie`` and
``pause-member`` the stop, for ``scale`` each step, for ``broker-kill`` the kill) until the
processors have consumed the log as far as it reached then (or, for the last restart of a
``kill-processor`` trial, which comes after the collection ended, until the final profile is
written; for ``publisher-rerun``, until the run grows past what it held at the kill).

One JSON line per trial on stdout, then a summary table (also written to ``--summary``).
Every child process is killed when its trial ends, whatever happened (the publisher by process
group: it forks encoders); the broker is stopped on exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from bench.generate import generate
from rewardstream.contract.engine import EngineTopics, FinalRecord
from rewardstream.contract.events import EventKind, Topics, task_key
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.local import LocalBroker, LocalCluster
from rewardstream.processors.batch import ProfileConfig, run_profile
from rewardstream.producers.events import rollout_events
from rewardstream.sinks.topics.profiles import ensure_topics, list_finals, read_finals, read_to_end
from tests.golden import OUTPUT_SUFFIXES, file_events
from tests.processes import Processor, make_topics, read_topic, send_events

__all__ = ["FAST", "FAULTS", "PLANTS", "Result", "Sizes", "run_trial", "summary"]

FAULTS = (
    "baseline",
    "kill-processor",
    "broker-restart",
    "group-rebalance",
    "publisher-rerun",
    "disorder",
    "pause-member",
    "pod-loss",
    "zombie",
    "scale",
    "broker-kill",
    "two-groups",
    "older-format",
    "conflict",
    "foreign-keys",
    "frozen-peer",
    "snapshot-storm",
    "member-churn",
)
PLANTS = ("lost", "double", "dead-letter", "wrong-byte")
"""Findings a ``baseline`` trial can be made to hold, for the harness's self-test: a key
withheld from what is published (lost), one key added (double-counted), a poison event in
the rollouts topic (an unexpected dead letter), one reward changed (wrong bytes in the
final). The trial's reference (its batch profile, its expected counts) stays the collection."""
SNAPSHOT_BOUND_S = 10.0  # a snapshot answers (200, 429, 503) within this, whatever its peers do
# what an HTTP client on this loaded machine may add to the server's bound: being scheduled
# and the transfer (the bound is timed on a request of the harness's own, never on a command's
# wall time, whose interpreter start took over 2 s at a load of 13)
CLIENT_SLACK_S = 2.0
HEALTHZ_BOUND_S = 2.0  # and /healthz within this, during a snapshot storm
ONE_TRUTH_S = 10.0  # every live member reports a final run as final within this of its record
PARTITIONS = 4  # of each data topic
SESSION_TIMEOUT_S = 10.0  # aiokafka's default session_timeout_ms: processors/stream/ keeps it
KILL_MODES = ("consume", "checkpoint", "snapshot")  # "checkpoint": between offset commits
STEM = "r"
POLL = 0.05
TIMEOUT = 120.0  # for any one thing a trial waits for


class Sizes(NamedTuple):
    """What a trial draws from: tasks, rollouts per task, seconds the collection takes, the
    number of processor kills of a ``kill-processor`` trial (1: one kill of any kind)."""

    tasks: tuple[int, int] = (300, 2000)
    repeats: tuple[int, int] = (4, 8)
    feed_s: tuple[float, float] = (3.0, 5.0)
    kills: int = 2


DEFAULT = Sizes()
FAST = Sizes(tasks=(200, 400), repeats=(4, 6), feed_s=(1.5, 2.5), kills=1)
"""Small trials for the test suite."""


class TrialError(Exception):
    """The trial could not go on (a process crashed, a wait timed out): recorded, not raised."""


@dataclass
class Result:
    """One trial's outcome; :meth:`line` is its JSON line."""

    fault: str
    seed: int
    lost: int | None  # None: the trial was cut short before it could count
    double_counted: int | None
    recovery_s: float | None
    equal_to_batch: bool
    wall_s: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def rollouts(self) -> int:
        """The collection's rollouts (0 if the trial stopped before it was generated)."""
        return int(self.detail.get("tasks", 0)) * int(self.detail.get("repeats", 0))

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.double_counted == 0
            and self.equal_to_batch
            and not self.detail.get("errors")
        )

    def line(self) -> str:
        head = {
            "fault": self.fault,
            "seed": self.seed,
            "lost": self.lost,
            "double_counted": self.double_counted,
            "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 2),
            "equal_to_batch": self.equal_to_batch,
            "wall_s": round(self.wall_s, 2),
        }
        return json.dumps(head | self.detail)


async def _end_offsets(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await consumer.start()
    try:
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, raw: bool = False) -> dict[TopicPartition, int]:
    """The positions ``group`` committed (from each commit's metadata), by partition; with
    ``raw``, the committed offsets."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        offsets = (await _offsets(admin, group)).items()
        return {tp: int(meta.offset) if raw else _position(meta) for tp, meta in offsets}
    finally:
        await admin.close()


async def _offsets(admin: AIOKafkaAdminClient, group: str) -> dict[TopicPartition, Any]:
    try:
        return dict(await admin.list_consumer_group_offsets(group))
    except KafkaError:  # e.g. the group's coordinator not known yet
        return {}


def _position(meta: Any) -> int:
    """The position a commit's metadata names (the committed offset is where a replay starts,
    which is before it while a run is open); the offset itself without metadata."""
    try:
        return int(orjson.loads(meta.metadata)["position"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return int(meta.offset)


async def _a_commit(bootstrap: str, group: str, within: float) -> bool:
    """Poll ``group``'s committed offsets until they move (a commit); False if they do not
    within ``within`` seconds."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        before = await _offsets(admin, group)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if await _offsets(admin, group) != before:
                return True
            await asyncio.sleep(0.001)
        return False
    finally:
        await admin.close()


def ask_snapshot(url: str) -> tuple[int | str, float, str | None]:
    """A snapshot asked over HTTP and read to its end: its status (or why it got none), the
    seconds it took, and ``Retry-After``."""
    began, retry = time.monotonic(), None
    code: int | str
    try:
        request = urllib.request.Request(url, method="POST")
        with urllib.request.urlopen(request, timeout=3 * SNAPSHOT_BOUND_S) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as exc:
        code, retry = exc.code, exc.headers.get("Retry-After")
    except OSError as exc:
        code = f"no answer ({exc!r})"[:120]
    return code, time.monotonic() - began, retry


def _reasons(letters: list[ConsumerRecord[bytes, bytes]]) -> dict[str, int]:
    """How many of ``letters`` (dead letters) there are, by their ``reason`` header: each
    ``source`` once (a processor killed before the commit that covers a dead letter parks it
    again on replay, with the same source)."""
    seen: set[tuple[bytes, bytes]] = set()
    count: Counter[str] = Counter()
    for index, letter in enumerate(letters):
        headers = dict(letter.headers)
        reason, source = headers.get("reason", b"?"), headers.get("source") or b"%d" % index
        if (reason, source) not in seen:
            seen.add((reason, source))
            count[reason.decode()] += 1
    return dict(count)


async def _delete_topics(bootstrap: str, topics: Topics) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        engine = EngineTopics.of(topics)
        names = [topics.inputs, topics.rollouts, topics.control, topics.dead_letters]
        names += [engine.members, engine.finals, engine.profiles]
        existing = set(await admin.list_topics())
        await admin.delete_topics([n for n in names if n in existing])
    finally:
        await admin.close()


def _leftovers(marker: str) -> dict[int, str]:
    """Live processes whose command line holds ``marker`` (a trial's unique topic prefix: its
    processors, publishers, and whatever they forked, which inherits the command line)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if marker.encode() in cmdline:
                    found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


async def _send(bootstrap: str, topic: str, value: bytes, key: bytes) -> None:
    """One record in ``topic``, written as is (a planted member record, a poison event)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def _records_in(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """How many records each of ``topics`` (one partition each) holds; absent: none."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await consumer.start()
    try:
        existing = await consumer.topics()
        out: dict[str, int] = {}
        for topic in topics:
            if topic not in existing:
                out[topic] = 0
                continue
            tp = TopicPartition(topic, 0)  # the engine's topics have one partition
            out[topic] = (await consumer.end_offsets([tp]))[tp]
        return out
    finally:
        await consumer.stop()


async def _members_written(bootstrap: str, topic: str) -> list[str]:
    """What ``topic`` (a members topic, one partition) holds after its first record: each
    record's key, format version and unit count, or ``tombstone``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=10_000
    )
    await consumer.start()
    try:
        out = []
        async for r in read_to_end(consumer, topic):
            if r.offset == 0:
                continue
            key = (r.key or b"").decode(errors="replace")
            if r.value is None:
                out.append(f"{r.offset}: {key} tombstone")
            else:
                body = orjson.loads(r.value)
                units = len(body.get("units") or {})
                out.append(f"{r.offset}: {key} v{body.get('v')} with {units} units")
        return out
    finally:
        await consumer.stop()


async def _read_until(
    bootstrap: str, wanted: dict[TopicPartition, int]
) -> list[tuple[TopicPartition, bytes]]:
    """Every record of each partition from its start to the offset ``wanted`` for it."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=10_000
    )
    await consumer.start()
    try:
        left = [tp for tp, n in wanted.items() if n > 0]
        out: list[tuple[TopicPartition, bytes]] = []
        if not left:
            return out
        consumer.assign(left)
        await consumer.seek_to_beginning(*left)
        deadline = time.monotonic() + TIMEOUT
        while left:
            if time.monotonic() > deadline:
                raise TrialError(f"timed out reading the data topics to {wanted}")
            batch = await consumer.getmany(*left, timeout_ms=500)
            for tp, records in batch.items():
                out += [(tp, r.value) for r in records if r.offset < wanted[tp] and r.value]
            left = [tp for tp in left if await consumer.position(tp) < wanted[tp]]
        return out
    finally:
        await consumer.stop()


def _rekeyed(line: bytes, task: int, rollout: int) -> bytes:
    """A collection row (input or rollout) under another (task, rollout) key."""
    body = orjson.loads(line)
    body["_ng_task_index"], body["_ng_rollout_index"] = task, rollout
    return orjson.dumps(body) + b"\n"


def _reward_flipped(line: bytes) -> bytes:
    """A rollout row with other content under the same key: its reward flipped (1 - r)."""
    body = orjson.loads(line)
    body["reward"] = 1.0 - float(body["reward"])
    return orjson.dumps(body) + b"\n"


def _wire_rollouts(rows: list[bytes], run_id: str, folder: Path) -> list[tuple[EventKind, bytes]]:
    """Rollout rows as the publisher encodes them (through a file, as it reads them)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{STEM}.jsonl"
    path.write_bytes(b"".join(rows))
    return [(e.kind, e.value) for e in rollout_events(path, run_id)]


class Publisher:
    """``rewardstream publish`` as a child in its own process group: it forks encoders, and a
    kill of the publisher takes them with it, as a ``kill -9`` of a job would."""

    def __init__(self, trial: Trial, follow: bool) -> None:
        cmd = [sys.executable, "-m", "rewardstream.commands.cli", "publish", "--quiet"]
        cmd += ["--inputs", str(trial.sent_inputs), "--bootstrap", trial.bootstrap]
        cmd += ["--topic-prefix", trial.prefix, "--run-id", trial.run_id]
        if follow:
            cmd += ["--rollouts", str(trial.live), "--follow"]  # finishes once all are sent
        else:
            cmd += ["--rollouts", str(trial.sent_rollouts)]
        with (trial.work / "publisher.log").open("ab") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, process_group=0
            )
        self.killed = False

    def kill(self) -> bool:
        """``kill -9`` of the whole process group; False if it had already exited."""
        running = self.proc.poll() is None
        if running:  # the leader is unreaped until wait(): the group id is still ours
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return running

    def failed(self) -> bool:
        """Exited with an error on its own (not killed by the trial)."""
        return not self.killed and self.proc.poll() not in (0, None)


class Feeder:
    """Appends the rollouts file to the live file as a running collection writes it: a segment
    at a time, each at a steady pace in a thread, cut at arbitrary bytes (a line is often
    half-written for a moment, or across a processor's downtime)."""

    def __init__(self, src: Path, dst: Path) -> None:
        self.data, self.dst = src.read_bytes(), dst
        self.at = 0  # bytes written
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def feed(self, until: float, seconds: float) -> None:
        """Start writing up to fraction ``until`` of the file over ``seconds``."""
        self.wait()
        end = round(len(self.data) * until)
        self._thread = threading.Thread(target=self._write, args=(end, seconds), daemon=True)
        self._thread.start()

    def _write(self, end: int, seconds: float) -> None:
        step = max(1, -(-(end - self.at) // max(1, int(seconds / POLL))))
        with self.dst.open("ab") as fh:
            while self.at < end and not self.stop.is_set():
                chunk = self.data[self.at : min(end, self.at + step)]
                fh.write(chunk)
                fh.flush()
                self.at += len(chunk)
                self.stop.wait(POLL)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    @property
    def lines(self) -> int:
        """Complete lines written so far."""
        return self.data.count(b"\n", 0, self.at)


class Trial:
    """One seeded trial: its collection, topics, child processes and findings."""

    def __init__(
        self,
        fault: str,
        seed: int,
        bootstrap: str,
        work: Path,
        sizes: Sizes,
        plant: str | None = None,
    ) -> None:
        self.fault, self.seed, self.bootstrap, self.work, self.sizes = (
            fault,
            seed,
            bootstrap,
            work,
            sizes,
        )
        self.plant = plant
        self.rng = random.Random(f"{fault}/{seed}")
        self.tasks = self.rng.randint(*sizes.tasks)
        self.repeats = self.rng.randint(*sizes.repeats)
        self.feed_s = self.rng.uniform(*sizes.feed_s)
        self.prefix = f"chaos-{fault}-{seed}-{uuid.uuid4().hex[:6]}"
        self.topics = Topics.for_prefix(self.prefix)
        self.engine_topics = EngineTopics.of(self.topics)
        self.group = f"{self.prefix}-profiler"  # the processors' default group
        self.run_id = f"chaos-{seed}"
        self.inputs = work / "data" / f"{STEM}_materialized_inputs.jsonl"
        self.rollouts = work / "data" / f"{STEM}.jsonl"
        self.live = work / "live" / f"{STEM}.jsonl"
        # what the publisher sends: the collection, unless a plant changed it (see PLANTS)
        self.sent_inputs, self.sent_rollouts = self.inputs, self.rollouts
        self.partitions = PARTITIONS
        self.replication = 1  # of the data topics (3 on a three-broker cluster)
        self.groups = [self.group]  # the groups profiling the run (two-groups: two)
        self.members: list[Processor] = []
        self.hosts = 0  # hosts started so far (each processor is one)
        self.host_of: dict[int, str] = {}  # each processor's host name, by pid
        self.group_of: dict[int, str] = {}  # and its group
        self.kept_disks: dict[str, Path] = {}  # hosts whose disk outlives them: its folder
        self.others: list[Processor] = []  # processors that must exit on their own
        self.extra_topics: list[Topics] = []  # another prefix's, deleted with the trial's
        self.killed: set[int] = set()  # pids killed on purpose
        self.frozen: set[int] = set()  # pids stopped (SIGSTOP) for now
        self.publishers: list[Publisher] = []
        self.feeder: Feeder | None = None
        self.recoveries: list[float] = []
        self.snapshot_s: list[float] = []  # every snapshot's wall time, answered or refused
        self.expected_letters: dict[str, int] = {}  # dead letters the fault must produce
        self.wrong_files = 0  # final profile files (per group) not equal to batch
        self.errors: list[str] = []
        self.detail: dict[str, Any] = {}

    @property
    def expected(self) -> int:
        return self.tasks * self.repeats

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self, partitions: int = PARTITIONS) -> None:
        """The collection, its batch profile (next to it), and the topics."""
        self.partitions = partitions
        generate(self.tasks, self.repeats, self.inputs.parent / STEM, 200, self.seed)
        config = ProfileConfig(
            materialized_inputs_jsonl_fpath=self.inputs,
            rollouts_jsonl_fpath=self.rollouts,
            quiet=True,
        )
        run_profile(config)
        if self.plant in ("lost", "double", "wrong-byte"):
            self.plant_in_files()
        self.live.parent.mkdir(parents=True)
        self.live.touch()
        asyncio.run(make_topics(self.bootstrap, self.topics, partitions, self.replication))
        self.detail |= {"tasks": self.tasks, "repeats": self.repeats, "partitions": partitions}

    def plant_in_files(self) -> None:
        """The files the publisher sends, changed by the plant from the collection (which
        stays the reference): one key's input row and rollout withheld (``lost``), one key
        added to a task (``double``), or one rollout's reward flipped (``wrong-byte``)."""
        inputs = self.inputs.read_bytes().splitlines(keepends=True)
        rollouts = self.rollouts.read_bytes().splitlines(keepends=True)
        row = orjson.loads(rollouts[0])
        key = (row["_ng_task_index"], row["_ng_rollout_index"])

        def is_key(line: bytes) -> bool:
            body = orjson.loads(line)
            return (body["_ng_task_index"], body["_ng_rollout_index"]) == key

        if self.plant == "lost":
            inputs = [line for line in inputs if not is_key(line)]
            rollouts = rollouts[1:]
        elif self.plant == "double":
            extra = self.repeats  # a rollout index the task does not have
            inputs.append(_rekeyed(next(x for x in inputs if is_key(x)), key[0], extra))
            rollouts.append(_rekeyed(rollouts[0], key[0], extra))
        else:
            rollouts[0] = _reward_flipped(rollouts[0])
        sent = self.work / "sent"
        sent.mkdir()
        self.sent_inputs, self.sent_rollouts = sent / self.inputs.name, sent / self.rollouts.name
        self.sent_inputs.write_bytes(b"".join(inputs))
        self.sent_rollouts.write_bytes(b"".join(rollouts))
        self.detail["plant"] = self.plant

    def units(self) -> dict[str, TopicPartition]:
        """Every data partition by the processor's unit name for it."""
        return {
            f"{kind}-{p}": TopicPartition(topic, p)
            for kind, topic in (("input", self.topics.inputs), ("rollout", self.topics.rollouts))
            for p in range(self.partitions)
        }

    def start_processor(
        self, checkpoint_every: float = 0.2, host: str | None = None, group: str | None = None
    ) -> Processor:
        """A processor as a separate host: a mount namespace of its own with its disk (its
        ``--state-dir`` and ``--output-dir``) at ``hosts/<host>/disk``, seen by no other
        process. A named ``host`` keeps its disk (a folder bind-mounted there) for the next
        processor started on it; an unnamed one gets a new host with a private tmpfs, gone with
        it. ``group``: another group than the prefix's default one."""
        name = host or f"t{self.hosts}"
        self.hosts += 1
        kept = None
        if host is not None:
            kept = self.kept_disks.setdefault(host, self.work / "hosts" / host / "kept")
        disk = self.work / "hosts" / name / "disk"
        log = self.work / "processors.log"
        extra = ("--group-id", group) if group is not None else ()
        p = Processor(
            self.bootstrap,
            self.prefix,
            self.work / "unused",  # --output-dir goes on the private disk
            log,
            checkpoint_every,
            extra,
            private_disk=disk,
            host_disk=kept,
        )
        self.members.append(p)
        self.host_of[p.proc.pid] = name
        self.group_of[p.proc.pid] = group or self.groups[0]
        return p

    def on_disk(self, p: Processor, *parts: str) -> Path:
        """A path on ``p``'s private disk, as ``p`` sees it (only while it runs)."""
        assert p.disk is not None
        return p.seen(p.disk.joinpath(*parts))

    def start_publisher(self, follow: bool = True) -> Publisher:
        pub = Publisher(self, follow)
        self.publishers.append(pub)
        return pub

    def start_feed(self) -> Publisher:
        """The growing rollouts file, written over ``feed_s``, and a publisher following it."""
        self.feeder = Feeder(self.sent_rollouts, self.live)
        self.feeder.feed(1.0, self.feed_s)
        return self.start_publisher(follow=True)

    def publishing(self) -> None:
        """Until the publisher has sent its first events: it has connected. (A publisher
        started while the broker is away refuses at once, exit 2, "cannot reach Kafka": a
        broker fault is only meant to hit one already publishing.)"""
        self.until(lambda: sum(self.ends().values()) > 0, "the publisher's first events")

    def published(self, feeder: Feeder) -> dict[str, int]:
        """Once the fed segment is written and published: the log end offsets then."""
        feeder.wait()

        def sent() -> bool:
            ends = self.ends()
            return sum(n for u, n in ends.items() if u.startswith("rollout")) >= feeder.lines

        self.until(sent, "the publisher to send what was fed")
        return self.ends()

    def kill_processor(self, p: Processor) -> None:
        self.killed.add(p.proc.pid)
        p.kill(signal.SIGKILL)

    def live_members(self) -> list[Processor]:
        """The running, not stopped, members of the group being looked at (``self.group``)."""
        return [
            p
            for p in self.members
            if p.proc.poll() is None
            and p.proc.pid not in self.frozen
            and self.group_of.get(p.proc.pid) == self.group
        ]

    # -- observing -----------------------------------------------------------------------------
    def check_alive(self) -> None:
        """Raise if a processor died that was not killed on purpose (a crash), or a publisher
        failed on its own."""
        for p in self.members:
            code = p.proc.poll()
            if code is not None and p.proc.pid not in self.killed:
                self.killed.add(p.proc.pid)  # reported once
                raise TrialError(f"processor pid {p.proc.pid} exited with code {code}")
        if any(pub.failed() for pub in self.publishers):
            raise TrialError("a publisher failed")

    def until(self, done: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> float:
        """Poll ``done``; the seconds it took. A crash or the timeout ends the trial."""
        began = time.monotonic()
        while not done():
            self.check_alive()
            if time.monotonic() - began > timeout:
                raise TrialError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(POLL)
        return time.monotonic() - began

    def ends(self) -> dict[str, int]:
        """The log end offset of every data partition, by unit name."""
        units = self.units()
        ends = asyncio.run(_end_offsets(self.bootstrap, list(units.values())))
        return {name: ends[tp] for name, tp in units.items()}

    def positions(self) -> dict[str, int]:
        """Next offset to consume per unit, over the live processors."""
        out: dict[str, int] = {}
        for p in self.live_members():
            for name, position in p.units().items():
                out[name] = max(out.get(name, 0), position)
        return out

    def caught_up(self, target: dict[str, int]) -> bool:
        at = self.positions()
        return all(at.get(name, -1) >= end for name, end in target.items())

    def wait_owned(self) -> None:
        """Until every live member owns units and together they own every partition."""

        def owned() -> bool:
            units = [set(p.units()) for p in self.live_members()]
            return bool(units) and all(units) and set.union(*units) == set(self.units())

        self.until(owned, "the partitions to be assigned")

    def read_to(self, target: dict[str, int]) -> None:
        """Until the processors have consumed every partition to ``target``."""
        self.until(lambda: self.caught_up(target), "the processors to catch up")

    def wait_assigned(self, p: Processor) -> None:
        self.until(lambda: bool(p.units()), "the processor's assignment")

    def recover(self, since: float, target: dict[str, int]) -> None:
        """Record the time from ``since`` (a restart) until the log as in ``target`` is read."""
        self.read_to(target)
        self.recoveries.append(time.monotonic() - since)

    def count(self, p: Processor, key: str) -> int:
        """One of ``p``'s ``/runs`` counters of the run (0 while it does not know the run)."""
        value = p.runs().get(self.run_id, {}).get(key)
        return value if isinstance(value, int) else 0

    def run_counters(self) -> dict[str, int]:
        """What the live processors' ``/runs`` say of the run: distinct rollouts (each counts
        its peers' too; once it is done, the final record's), duplicates dropped and events
        replayed after a restart that the final covers (summed: each counts its own units';
        informative only: a replay rebuilds a part, so they may count an offset twice)."""
        members = self.live_members()
        return {
            "rollouts": max((self.count(p, "rollouts") for p in members), default=0),
            "duplicates": sum(self.count(p, "duplicates_dropped") for p in members),
            "replays": sum(self.count(p, "replays_skipped") for p in members),
        }

    def final(self) -> FinalRecord | None:
        """The run's final record in Kafka, if it has one."""
        finals = asyncio.run(
            list_finals(
                self.bootstrap,
                KafkaSecurity.from_env(),
                self.engine_topics,
                self.prefix,
                self.group,
            )
        )
        return finals.get((self.group, self.run_id))

    def has_final(self) -> bool:
        return self.final() is not None

    def committed(self, raw: bool = False) -> dict[str, int]:
        """The positions the group committed, by unit name (0 where it never committed);
        ``raw``: the committed offsets themselves (where a replay starts)."""
        committed = asyncio.run(_committed(self.bootstrap, self.group, raw))
        return {name: committed.get(tp, 0) for name, tp in self.units().items()}

    # -- the fault kinds -----------------------------------------------------------------------
    def kill_processor_trial(self) -> None:
        """Each life of the processor but the last starts with a backlog (a segment of the
        collection published while it was down, all the inputs for the first) that its kill is
        aimed into; the last 10% of the rollouts are fed after the last restart, so the run
        cannot end before it."""
        self.prepare()
        kills = self.sizes.kills
        bounds = [0.9 * (i + 1) / kills for i in range(kills)]
        seconds = self.feed_s / kills
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        feeder.feed(bounds[0], seconds)
        target = self.published(feeder)
        landed = []
        for i in range(kills):
            restarted = time.monotonic()
            p = self.start_processor(checkpoint_every=0.05, host="a")  # many commits to aim at
            mode = KILL_MODES[(self.seed * kills + i) % len(KILL_MODES)]
            landed.append(self.kill_during(p, mode, target, restarted, restart=i > 0))
            if i + 1 < kills:
                feeder.feed(bounds[i + 1], seconds)
                target = self.published(feeder)
            time.sleep(self.rng.uniform(0.0, 1.0))
        restarted = time.monotonic()
        p = self.start_processor(checkpoint_every=0.05, host="a")
        feeder.feed(1.0, self.feed_s * 0.1)
        feeder.wait()
        # RunFinished goes out once every rollout is, and the publisher exits
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")
        if self.rng.random() < 0.5:  # and once more, while it writes the final profile
            landed.append(self.kill_in_final_write(p))
            time.sleep(self.rng.uniform(0.0, 1.0))
            restarted = time.monotonic()
            self.start_processor(checkpoint_every=0.05, host="a")
        self.detail["kills"] = landed
        self.until(self.has_final, "the final profile")
        self.recoveries.append(time.monotonic() - restarted)

    def kill_in_final_write(self, p: Processor) -> str:
        """``kill -9`` of ``p`` once it writes the final profile (its files first, in its
        ``--state-dir``, then the Kafka transaction, then the mirror in ``--output-dir``);
        ``final`` if the kill came before the final record was committed."""
        scratch = self.on_disk(p, "state", "finals", self.run_id)
        mirror = self.on_disk(p, "out", self.run_id)
        deadline = time.monotonic() + TIMEOUT
        while not scratch.exists() and not mirror.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TrialError("timed out waiting for the final profile's write")
            time.sleep(0.0002)
        self.kill_processor(p)
        return "final-missed" if self.has_final() else "final"

    def kill_during(
        self, p: Processor, mode: str, target: dict[str, int], started: float, restart: bool
    ) -> str:
        """``kill -9`` of ``p`` (started at ``started``) aimed at ``mode``, once it is assigned;
        returns ``mode`` if it landed there, else ``mode`` + ``-missed``. ``target``: the log
        end offsets; its backlog is what lies between its group's committed offsets and them."""
        while not p.units():  # tightly: the backlog goes fast
            self.check_alive()
            if time.monotonic() - started > TIMEOUT:
                raise TrialError("timed out waiting for the processor's assignment")
            time.sleep(0.002)
        self.detail.setdefault("joined_s", []).append(round(time.monotonic() - started, 2))
        landed = False
        if mode == "consume":  # at a random moment of the catch-up
            time.sleep(self.rng.uniform(0.0, 0.25))
            self.kill_processor(p)
            # landed if the restart must replay: progress not committed, or backlog unread
            committed = self.committed()
            landed = any(committed[n] < end for n, end in target.items())
        elif mode == "checkpoint":  # between two offset commits of the catch-up
            moved = asyncio.run(_a_commit(self.bootstrap, self.group, 10.0))
            time.sleep(self.rng.uniform(0.0, 0.05))  # within one commit interval
            self.kill_processor(p)
            # landed if it was committing a catch-up still under way when killed
            committed = self.committed()
            landed = moved and any(committed[n] < end for n, end in target.items())
        else:  # while a snapshot is being built, once the backlog is read
            self.read_to(target)
            if restart:
                self.recoveries.append(time.monotonic() - started)
            request = urllib.request.Request(f"{p.url}/runs/{self.run_id}/snapshot", method="POST")

            def post() -> None:
                with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=30):
                    pass

            thread = threading.Thread(target=post, daemon=True)
            thread.start()
            time.sleep(self.rng.uniform(0.0, 0.01))
            landed = thread.is_alive()
            self.kill_processor(p)
            thread.join(30)
        return mode if landed else f"{mode}-missed"

    def broker_restart_trial(self, broker: LocalBroker) -> None:
        self.prepare()
        self.start_processor(checkpoint_every=self.rng.choice([0.2, 1.0, 5.0]))
        self.wait_owned()
        publisher = self.start_feed()
        self.publishing()
        time.sleep(self.rng.uniform(0.2, 0.8) * self.feed_s)
        kill, pause = self.rng.random() < 0.5, self.rng.uniform(0.0, 2.0)
        began = time.monotonic()
        broker.restart(kill=kill, pause=pause)
        ready = time.monotonic()
        self.detail["broker"] = {"kill": kill, "away_s": round(ready - began, 2)}
        self.recover(ready, self.ends())
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def group_rebalance_trial(self) -> None:
        size = self.rng.choice([2, 3])
        self.prepare()
        for i in range(size):
            self.start_processor(host=f"h{i}")
        self.wait_owned()
        publisher = self.start_feed()
        kills = self.rng.choice([1, 2]) if self.sizes.kills > 1 else 1
        overlap = kills == 2 and self.rng.random() < 0.5  # the 2nd kill during the rebalance
        time.sleep(self.rng.uniform(0.1, 0.5) * self.feed_s)
        victims = []
        for i in range(kills):
            victim = self.rng.choice(self.live_members())
            units = victim.units()
            victims.append("leader" if "rollout-0" in units else "member" if units else "joining")
            self.kill_processor(victim)
            time.sleep(self.rng.uniform(0.2, 2.0))
            target, since = self.ends(), time.monotonic()
            self.start_processor(host=self.host_of[victim.proc.pid])  # back on its host
            if overlap and i == 0:
                time.sleep(self.rng.uniform(0.0, 3.0))
            else:
                self.recover(since, target)
        self.detail |= {"processors": size, "killed": victims, "overlap": overlap}
        if publisher.proc.poll() is None:  # mid-run, once the group is whole again
            self.wait_owned()
            self.check_offsets_snapshot(self.rng.choice(self.live_members()), "mid-run")
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def pause_member_trial(self) -> None:
        """A member stopped (SIGSTOP) past its session timeout (10 s), then resumed, as after a
        long GC pause or a frozen VM: the group has moved its partitions on meanwhile, and the
        member goes on from where it stood until it learns so (a zombie)."""
        size = self.rng.choice([2, 3])
        self.prepare()
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        publisher = self.start_feed()
        time.sleep(self.rng.uniform(0.1, 0.5) * self.feed_s)
        victim = self.rng.choice(self.live_members())
        self.detail |= {
            "processors": size,
            "paused": "leader" if "rollout-0" in victim.units() else "member",
        }
        target, since = self.ends(), time.monotonic()
        pause = SESSION_TIMEOUT_S + self.rng.uniform(0.5, 4.0)
        self.frozen.add(victim.proc.pid)
        victim.proc.send_signal(signal.SIGSTOP)
        try:  # the others take its partitions over (and read them to the end) meanwhile
            self.recover(since, target)
            time.sleep(max(0.0, since + pause - time.monotonic()))
        finally:
            victim.proc.send_signal(signal.SIGCONT)
            self.frozen.discard(victim.proc.pid)
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def publisher_rerun_trial(self) -> None:
        self.prepare()
        p = self.start_processor()
        self.wait_owned()
        publisher = self.start_feed()
        kills = []
        for _ in range(self.rng.choice([1, 2]) if self.sizes.kills > 1 else 1):
            time.sleep(self.rng.uniform(0.1, 0.4) * self.feed_s)
            kills.append("publishing" if publisher.kill() else "after-exit")
            self.read_to(self.ends())
            held = self.count(p, "rollouts")
            time.sleep(self.rng.uniform(0.0, 0.5))
            publisher = self.start_publisher(follow=True)
            if held < self.expected:

                def grew(held: int = held) -> bool:
                    return self.count(p, "rollouts") > held

                self.recoveries.append(self.until(grew, "the run to grow again"))
            else:
                self.recoveries.append(self.until(self.has_final, "the final profile"))
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")
        if self.rng.random() < 0.5:  # republish the finished files, killed midway, re-run
            publisher = self.start_publisher(follow=False)
            time.sleep(self.rng.uniform(0.2, 1.5))
            kills.append("republishing" if publisher.kill() else "after-exit")
            rerun = self.start_publisher(follow=False)
            self.until(lambda: rerun.proc.poll() is not None, "the publisher")
        self.detail["publisher_kills"] = kills

    def disorder_trial(self) -> None:
        size = self.rng.choice([1, 2])
        self.prepare()
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        rng = self.rng
        events = file_events(self.inputs, self.rollouts, self.run_id, STEM, finish=True)
        started, finished = events[-2], events[-1]
        inputs = [(i, e) for i, e in enumerate(events) if e[0] == "input"]
        rollouts = [(i, e) for i, e in enumerate(events) if e[0] == "rollout"]
        tasks = list(range(self.tasks))
        rng.shuffle(tasks)
        late = set(tasks[: rng.randint(self.tasks // 10, self.tasks // 3)])  # inputs last

        def task(event: tuple[EventKind, bytes]) -> int:
            body = orjson.loads(event[1])
            return int(body["task"] if event[0] == "rollout" else body["row"]["_ng_task_index"])

        early_in = [x for x in inputs if task(x[1]) not in late]
        late_in = [x for x in inputs if task(x[1]) in late]
        early_out = [x for x in rollouts if task(x[1]) not in late]
        late_out = [x for x in rollouts if task(x[1]) in late]
        for part in (early_in, late_in, early_out):
            rng.shuffle(part)
        cut = rng.randint(len(early_out) // 4, 3 * len(early_out) // 4)
        first = [e for _, e in early_in] + [e for _, e in early_out[:cut]]
        if rng.random() < 0.5:
            first.insert(rng.randint(0, len(first)), started)
        send_events(self.bootstrap, self.topics, first, self.run_id)

        # a snapshot of what arrived, checked against the batch partial profile of it
        member = rng.choice(self.live_members())
        self.until(
            lambda: (
                self.count(member, "rollouts") == cut
                and self.count(member, "inputs") == len(early_in)
            ),
            "the first events to be consumed",
        )
        sent = sorted(i for i, _ in early_in + early_out[:cut])
        self.detail["snapshot_equal_to_batch"] = self.check_snapshot(member, sent)

        # late rollouts, rollouts of tasks with no inputs yet, redelivered copies
        rest = early_out[cut:] + late_out
        rng.shuffle(rest)
        later = [e for _, e in rest]
        copies = rng.sample(first + later, k=max(1, len(later) // 20))
        for copy in copies:
            later.insert(rng.randint(0, len(later)), copy)
        last = [e for _, e in late_in] + ([] if started in first else [started])
        rng.shuffle(last)
        self.detail |= {
            "processors": size,
            "late_input_tasks": len(late),
            "copies": len(copies),
            "finished_sent": rng.random() < 0.5,
        }
        send_events(self.bootstrap, self.topics, later, self.run_id)
        # every rollout is in, a fifth of the tasks without their inputs: the processor must
        # answer a snapshot (batch would refuse such files: that refusal is fine) and go on.
        # Consumed, not counted: a rollout whose row has not come yet does not count
        self.read_to(self.ends())
        done = self.snapshot(member, self.work / "snapshot-early")
        self.detail["snapshot_before_inputs"] = (
            "ok" if done.returncode == 0 else "refused: " + done.stderr.strip()[:100]
        )
        send_events(self.bootstrap, self.topics, last, self.run_id)
        if self.detail["finished_sent"]:
            send_events(self.bootstrap, self.topics, [finished], self.run_id)

    @contextlib.contextmanager
    def looking_at(self, group: str) -> Iterator[None]:
        """``self.group`` (whose members, commits and finals are looked at) set to ``group``."""
        before, self.group = self.group, group
        try:
            yield
        finally:
            self.group = before

    def pod_loss_trial(self) -> None:
        """Members on private tmpfs disks; one (or two, in turn) ``kill -9``-ed mid-run, its
        disk gone with its namespace, and a replacement started on a fresh host; a snapshot
        once the group is whole again, while the run is open."""
        size = self.rng.choice([2, 3])
        self.prepare()
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        losses = self.rng.choice([1, 2]) if self.sizes.kills > 1 else 1
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        victims = []
        for i in range(losses):
            feeder.feed(0.8 * (i + self.rng.uniform(0.3, 0.9)) / losses, self.feed_s / losses)
            time.sleep(self.rng.uniform(0.2, 0.8) * self.feed_s / losses)
            victim = self.rng.choice(self.live_members())
            units = victim.units()
            victims.append("leader" if "rollout-0" in units else "member" if units else "joining")
            assert victim.disk is not None
            if any(victim.disk.iterdir()):  # its disk is private: nothing of it out here
                self.errors.append(f"the victim's disk shows on the host: {victim.disk}")
            self.kill_processor(victim)
            time.sleep(self.rng.uniform(0.0, 2.0))
            target, since = self.ends(), time.monotonic()
            self.start_processor()  # a new host, a fresh disk: state only from Kafka
            self.recover(since, target)
            self.wait_owned()
            self.check_offsets_snapshot(self.rng.choice(self.live_members()), f"after-loss-{i}")
        feeder.feed(1.0, self.feed_s * 0.2)
        self.detail |= {"processors": size, "victims": victims}
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def zombie_trial(self) -> None:
        """A member (the leader in most trials) stopped (SIGSTOP) past the consumer session
        timeout, sometimes until the others have finished the run, then resumed: its group's
        committed positions must never go back, and only one final record may exist."""
        size = self.rng.choice([2, 3])
        self.prepare()
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        feeder.feed(self.rng.uniform(0.3, 0.7), self.feed_s * 0.5)
        time.sleep(self.rng.uniform(0.1, 0.5) * self.feed_s)
        members = self.live_members()
        leader = next((m for m in members if "rollout-0" in m.units()), None)
        victim = leader if leader and self.rng.random() < 0.6 else self.rng.choice(members)
        through_final = self.rng.random() < 0.5  # stopped until the run is final
        pause = SESSION_TIMEOUT_S + self.rng.uniform(1.0, 4.0)
        self.detail |= {
            "processors": size,
            "paused": "leader" if victim is leader else "member",
            "pause_s": round(pause, 1),
            "through_final": through_final,
        }
        target, since = self.ends(), time.monotonic()
        self.frozen.add(victim.proc.pid)
        victim.proc.send_signal(signal.SIGSTOP)
        try:  # the others take its partitions over (and read them to the end) meanwhile
            self.recover(since, target)
            feeder.feed(1.0, self.feed_s * 0.5)
            if through_final:
                self.until(lambda: publisher.proc.poll() is not None, "the publisher")
                self.until(self.has_final, "the final profile")
            time.sleep(max(0.0, since + pause - time.monotonic()))
            before, offsets = self.committed(), self.committed(raw=True)
        finally:
            victim.proc.send_signal(signal.SIGCONT)
            self.frozen.discard(victim.proc.pid)
        self.detail["stopped_s"] = round(time.monotonic() - since, 1)
        deadline = time.monotonic() + 3.0  # it wakes up with its old assignment in mind
        while time.monotonic() < deadline:
            back = {u: (before[u], n) for u, n in self.committed().items() if n < before[u]}
            if back:  # and the committed offsets (where a replay starts), for the record
                raw = self.committed(raw=True)
                self.detail["offsets_back"] = {
                    u: (offsets[u], n) for u, n in raw.items() if n < offsets[u]
                }
                self.errors.append(f"committed positions went back after SIGCONT: {back}")
                break
            self.check_alive()
            time.sleep(0.1)
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def scale_trial(self) -> None:
        """One member, three (two started mid-run), one again (two stopped with SIGTERM, as
        a scale-down does), the run open throughout; a snapshot at three and at one."""
        self.prepare()
        first = self.start_processor()
        self.wait_owned()
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        feeder.feed(self.rng.uniform(0.2, 0.4), self.feed_s * 0.3)
        time.sleep(self.rng.uniform(0.1, 0.3) * self.feed_s)
        target, since = self.ends(), time.monotonic()
        for _ in range(2):
            self.start_processor()
        self.wait_owned()  # three members, each with units
        self.recover(since, target)
        self.check_offsets_snapshot(self.rng.choice(self.live_members()), "at-3")
        feeder.feed(self.rng.uniform(0.5, 0.8), self.feed_s * 0.3)
        time.sleep(self.rng.uniform(0.1, 0.3) * self.feed_s)
        keep = self.rng.choice(self.live_members())
        leaving = [m for m in self.live_members() if m is not keep]
        self.detail |= {
            "kept": "first" if keep is first else "added",
            "kept_leader": "rollout-0" in keep.units(),
        }
        target, since = self.ends(), time.monotonic()
        for m in leaving:
            self.killed.add(m.proc.pid)
            m.proc.send_signal(signal.SIGTERM)
        for m in leaving:
            if m.proc.wait(60) != 0:
                self.errors.append(f"scale-down: a member exited with {m.proc.returncode}")
        self.wait_owned()
        self.recover(since, target)
        self.check_offsets_snapshot(keep, "at-1")
        feeder.feed(1.0, self.feed_s * 0.2)
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def broker_kill_trial(self, cluster: LocalCluster) -> None:
        """A three-broker cluster (data topics replicated 3 times, min ISR 2): one broker
        killed with ``kill -9`` mid-run, and in half the trials started again later."""
        self.prepare()
        size = self.rng.choice([1, 2])
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        publisher = self.start_feed()
        self.publishing()
        time.sleep(self.rng.uniform(0.2, 0.7) * self.feed_s)
        index, back = self.rng.randrange(len(cluster.nodes)), self.rng.random() < 0.5
        killed = time.monotonic()
        cluster.kill_broker(index)
        self.recover(killed, self.ends())
        away = None
        if back:
            time.sleep(self.rng.uniform(0.5, 3.0))
            cluster.start_broker(index)
            away = round(time.monotonic() - killed, 1)
        self.detail |= {"processors": size, "broker": {"index": index, "back_after_s": away}}
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def two_groups_trial(self) -> None:
        """Two groups of one or two members each on the same topics, side by side, each to
        exactly one final of its own; in half the trials a member of one killed and replaced;
        a snapshot from each group mid-run."""
        self.groups = [self.group, f"{self.prefix}-second"]
        self.prepare()
        sizes = [self.rng.choice([1, 2]) for _ in self.groups]
        for group, size in zip(self.groups, sizes, strict=True):
            for _ in range(size):
                self.start_processor(group=group)
        for group in self.groups:
            with self.looking_at(group):
                self.wait_owned()
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        feeder.feed(self.rng.uniform(0.3, 0.7), self.feed_s * 0.5)
        time.sleep(self.rng.uniform(0.1, 0.5) * self.feed_s)
        killed = None
        if self.rng.random() < 0.5:
            killed = self.rng.choice(self.groups)
            with self.looking_at(killed):
                self.kill_processor(self.rng.choice(self.live_members()))
                time.sleep(self.rng.uniform(0.0, 1.0))
                target, since = self.ends(), time.monotonic()
                self.start_processor(group=killed)
                self.recover(since, target)
                self.wait_owned()
        for i, group in enumerate(self.groups):
            with self.looking_at(group):
                self.check_offsets_snapshot(self.rng.choice(self.live_members()), f"group-{i}")
        feeder.feed(1.0, self.feed_s * 0.5)
        self.detail |= {"processors": sizes, "killed_in": killed and self.groups.index(killed)}
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def older_format_trial(self) -> None:
        """A member record of a newer format planted in another prefix's members topic: a
        processor of that prefix must refuse (exit 2, one error line) having written nothing,
        while the trial's own group profiles its run undisturbed."""
        self.prepare()
        for _ in range(self.rng.choice([1, 2])):
            self.start_processor()
        other = f"{self.prefix}-newer"
        topics = Topics.for_prefix(other)
        self.extra_topics.append(topics)
        asyncio.run(make_topics(self.bootstrap, topics, self.partitions, self.replication))
        newer = {
            "format": "rewardstream.member",
            "v": 2,
            "prefix": other,
            "group": f"{other}-profiler",
            "member": "future",
        }
        engine = EngineTopics.of(topics)
        asyncio.run(ensure_topics(self.bootstrap, KafkaSecurity.from_env(), topics, "processor"))
        asyncio.run(_send(self.bootstrap, engine.members, orjson.dumps(newer), b"future"))
        log = self.work / "older.log"
        kept = self.work / "hosts" / "older" / "kept"  # inspected once it has exited
        older = Processor(
            self.bootstrap,
            other,
            self.work / "unused",
            log,
            private_disk=self.work / "hosts" / "older" / "disk",
            host_disk=kept,
        )
        self.others.append(older)
        self.wait_owned()
        publisher = self.start_feed()
        deadline = time.monotonic() + 60
        while older.proc.poll() is None:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TrialError("the older processor did not exit within 60 s")
            time.sleep(POLL)
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if "error" in line.lower()]
        files = sorted(str(f.relative_to(kept)) for f in kept.rglob("*") if f.is_file())
        records = asyncio.run(
            _records_in(self.bootstrap, [engine.members, engine.finals, engine.profiles])
        )
        committed = asyncio.run(_committed(self.bootstrap, f"{other}-profiler"))
        self.detail["older"] = {
            "exit": older.proc.returncode,
            "error_lines": errors,
            "files": files,
            "records": records,
            "committed": len(committed),
        }
        if older.proc.returncode != 2:
            self.errors.append(f"the older processor exited with {older.proc.returncode}")
        if len(errors) != 1 or "format version 2" not in errors[0]:
            self.errors.append(f"the older processor's error lines: {errors}")
        # its claim on --output-dir (on its own disk) is taken before Kafka is read: noted,
        # not a finding; anything else, on its disk or in Kafka, is
        if [f for f in files if f != "out/.rewardstream-owner.json"] or committed:
            self.errors.append("the older processor wrote something before refusing")
        if records.get(engine.members, 0) != 1 or sum(records.values()) != 1:
            written = asyncio.run(_members_written(self.bootstrap, engine.members))
            self.detail["older"]["members_written"] = written
            self.errors.append(
                f"the refusing processor wrote to the older prefix's engine topics: {records}; "
                f"{engine.members} after the planted record: {written}"
            )
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    # -- the fault kinds of issue 24: what the product must do is spelled out --------------
    def start_group(self, sizes: list[int]) -> int:
        """The collection and topics, then one of ``sizes`` members, once they own every
        partition; returns how many."""
        size = self.rng.choice(sizes)
        self.prepare()
        for _ in range(size):
            self.start_processor()
        self.wait_owned()
        return size

    def feed_part(self, low: float, high: float) -> tuple[Feeder, Publisher]:
        """A following publisher, once a share (``low``-``high``) of the rollouts is fed and
        published."""
        feeder = self.feeder = Feeder(self.sent_rollouts, self.live)
        publisher = self.start_publisher(follow=True)
        feeder.feed(self.rng.uniform(low, high), self.feed_s * 0.5)
        self.published(feeder)
        return feeder, publisher

    def baseline_trial(self) -> None:
        """No fault: the collection fed and published to one processor. The control of the
        sweep, and, with a plant (:data:`PLANTS`), the harness's self-test."""
        self.prepare()
        self.start_processor()
        self.wait_owned()
        publisher = self.start_feed()
        if self.plant == "dead-letter":
            self.publishing()
            poison = (self.bootstrap, self.topics.rollouts, b"not json", task_key(0))
            asyncio.run(_send(*poison))
            self.detail["plant"] = self.plant
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def conflict_trial(self) -> None:
        """Conflicting re-publish: 1-5 rollouts already published sent again under their key
        with other content (the reward flipped) while the run is open. Expected: exactly that
        many ``conflict`` dead letters, and the final equal to batch on the original content
        (the reference is the collection as first published)."""
        size = self.start_group([1, 2])
        feeder, publisher = self.feed_part(0.3, 0.7)
        rows = self.sent_rollouts.read_bytes().splitlines(keepends=True)
        chosen = self.rng.sample(range(feeder.lines), self.rng.randint(1, 5))
        changed = [_reward_flipped(rows[i]) for i in chosen]
        events = _wire_rollouts(changed, self.run_id, self.work / "conflicts")
        send_events(self.bootstrap, self.topics, events, self.run_id)
        self.expected_letters = {"conflict": len(chosen)}
        self.detail |= {"processors": size, "conflicts": len(chosen)}
        feeder.feed(1.0, self.feed_s * 0.5)
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def foreign_keys_trial(self) -> None:
        """Rollouts whose (task, rollout) key is in no input row (another rollout index of a
        task, or a task the inputs lack), sent among the real rollouts or after the last of
        them (before ``run_finished``). Expected: one ``unknown-key`` dead letter each, and
        the final equal to batch on the collection."""
        size = self.start_group([1, 2])
        rows = self.sent_rollouts.read_bytes().splitlines(keepends=True)
        foreign = []
        for k in range(self.rng.randint(1, 4)):
            row = self.rng.choice(rows)
            if k % 2:  # a task the inputs lack
                foreign.append(_rekeyed(row, self.tasks + k, 0))
            else:  # a rollout index its task lacks
                foreign.append(_rekeyed(row, orjson.loads(row)["_ng_task_index"], self.repeats + k))
        strange = _wire_rollouts(foreign, self.run_id, self.work / "foreign")
        events = file_events(self.sent_inputs, self.sent_rollouts, self.run_id, STEM, True)
        finished, started = events.pop(), events.pop()
        events.insert(0, started)
        after = self.rng.random() < 0.5  # after the last real rollout
        if not after:
            first_rollout = 1 + self.expected  # RunStarted, then the input rows
            for event in strange:
                events.insert(self.rng.randint(first_rollout, len(events) - 1), event)
        send_events(self.bootstrap, self.topics, events, self.run_id)
        if after:
            send_events(self.bootstrap, self.topics, strange, self.run_id)
        send_events(self.bootstrap, self.topics, [finished], self.run_id)
        self.expected_letters = {"unknown-key": len(strange)}
        self.detail |= {"processors": size, "foreign": len(strange), "after_last": after}

    def frozen_peer_trial(self) -> None:
        """A member frozen (SIGSTOP) while a snapshot is asked of another: the snapshot must
        answer within :data:`SNAPSHOT_BOUND_S`, either whole (equal to the batch profile of
        its offsets) or HTTP 503 naming the frozen member's partitions."""
        size = self.start_group([2, 3])
        publisher = self.start_feed()
        self.publishing()
        time.sleep(self.rng.uniform(0.1, 0.4) * self.feed_s)
        members = self.live_members()
        victim = self.rng.choice(members)
        asked = self.rng.choice([m for m in members if m is not victim])
        held = sorted(victim.units())
        self.detail |= {"processors": size, "frozen_units": held}
        self.frozen.add(victim.proc.pid)
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            self.bounded_snapshot(asked, "frozen-peer", held)
        finally:
            victim.proc.send_signal(signal.SIGCONT)
            self.frozen.discard(victim.proc.pid)
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def snapshot_storm_trial(self) -> None:
        """A processor holding idle connections (some with a request half sent) while a storm
        of snapshot requests comes in: each must answer within :data:`SNAPSHOT_BOUND_S` with
        200, 429 (with ``Retry-After``) or 503, ``/healthz`` within :data:`HEALTHZ_BOUND_S`
        throughout, and a snapshot after the storm must equal the batch profile."""
        size = self.start_group([1, 2])
        publisher = self.start_feed()
        self.publishing()
        time.sleep(self.rng.uniform(0.1, 0.4) * self.feed_s)
        asked = self.rng.choice(self.live_members())
        idle, storm = self.rng.randint(20, 100), self.rng.randint(6, 16)
        with contextlib.ExitStack() as stack:
            for i in range(idle):
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", asked.port)))
                if i % 2:  # a request begun and never finished
                    sock.sendall(b"POST /runs/" + self.run_id.encode() + b"/snapshot HTTP/1.1\r\n")
            answers, health = self.storm(asked, storm)
            self.bounded_snapshot(asked, "after-storm", [])
        codes = Counter(str(a[0]) for a in answers)
        self.detail |= {
            "processors": size,
            "storm": {"requests": storm, "idle": idle, "answers": dict(codes)},
            "healthz_max_s": round(max(health, default=0.0), 2),
        }
        odd = Counter(str(code) for code, _, _ in answers if code not in (200, 429, 503))
        slow = [took for _, took, _ in answers if took > SNAPSHOT_BOUND_S]
        bare = sum(1 for code, _, retry in answers if code == 429 and not retry)
        if odd:
            self.errors.append(f"storm: answers other than 200, 429, 503: {dict(odd)}")
        if slow:
            self.errors.append(
                f"storm: {len(slow)} of {storm} snapshots over {SNAPSHOT_BOUND_S} s "
                f"(the longest {max(slow):.1f} s)"
            )
        if bare:
            self.errors.append(f"storm: {bare} answers 429 without Retry-After")
        if max(health, default=0.0) > HEALTHZ_BOUND_S:
            self.errors.append(f"storm: /healthz took {max(health):.1f} s")
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def storm(
        self, member: Processor, n: int
    ) -> tuple[list[tuple[int | str, float, str | None]], list[float]]:
        """``n`` snapshot requests to ``member`` at once, each read to its end: per request
        its status (or why it got none), seconds, and ``Retry-After``; and the seconds of each
        ``/healthz`` asked meanwhile, one at a time."""
        url = f"{member.url}/runs/{self.run_id}/snapshot"
        answers: list[tuple[int | str, float, str | None]] = []
        health: list[float] = []
        done = threading.Event()

        def ask() -> None:
            answer = ask_snapshot(url)
            self.snapshot_s.append(answer[1])
            answers.append(answer)

        def healthz() -> None:
            while not done.is_set():
                began = time.monotonic()
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"{member.url}/healthz", timeout=30).close()
                health.append(time.monotonic() - began)
                done.wait(0.2)

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(n)]
        watcher = threading.Thread(target=healthz, daemon=True)
        watcher.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(5 * SNAPSHOT_BOUND_S)
        done.set()
        watcher.join(60)
        return answers, health

    def bounded_snapshot(self, member: Processor, label: str, missing: list[str]) -> None:
        """``rewardstream snapshot`` from ``member`` must answer within
        :data:`SNAPSHOT_BOUND_S`: whole and equal to the batch profile of its offsets, or
        refused with HTTP 503 naming each unit of ``missing`` (a frozen peer's)."""
        self.knows_run(member)
        final_before = self.has_final()
        snap = self.work / f"snapshot-{label}"
        shots = self.detail.setdefault("snapshots", {})
        code, took, _ = ask_snapshot(f"{member.url}/runs/{self.run_id}/snapshot")
        if took > SNAPSHOT_BOUND_S + CLIENT_SLACK_S or code not in (200, 503):
            bound = f"bound {SNAPSHOT_BOUND_S} s + {CLIENT_SLACK_S} s for the client"
            self.errors.append(f"snapshot {label}: {code} in {took:.1f} s ({bound})")
        try:  # then the command, for what it writes and says (its wall time: the column)
            done = self.snapshot(member, snap, timeout=3 * SNAPSHOT_BOUND_S)
        except subprocess.TimeoutExpired:
            self.errors.append(f"snapshot {label}: no answer in {3 * SNAPSHOT_BOUND_S:.0f} s")
            shots[label] = "no answer"
            return
        if done.returncode == 0 or "HTTP 503" not in done.stderr:
            self.judge_snapshot(done, snap, label, final_before)
            return
        units = self.units()
        unnamed = [
            u
            for u in missing
            if not any(
                name in done.stderr
                for name in (
                    u,
                    f"{units[u].topic}:{units[u].partition}",
                    f"{units[u].topic}-{units[u].partition}",
                )
            )
        ]
        shots[label] = {"refused": 503, "s": round(took, 2), "unnamed": unnamed}
        if unnamed or not missing:
            why = done.stderr.strip()[-300:]
            self.errors.append(f"snapshot {label}: 503 not naming the partitions {unnamed}: {why}")

    def member_churn_trial(self) -> None:
        """Members joining and leaving around the final: when ``run_finished`` has gone out,
        or just after the final record, one member joins and one leaves (SIGTERM), sometimes
        one more is killed; every member that reports the run must report it final with
        every rollout within :data:`ONE_TRUTH_S` of its final record."""
        size = self.start_group([2, 3])
        feeder, publisher = self.feed_part(0.5, 0.8)
        feeder.feed(1.0, self.feed_s * 0.3)
        when = self.rng.choice(["run-finished", "final"])
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")
        if when == "final":
            self.until(self.has_final, "the final profile")
        leaving = self.rng.choice(self.live_members())
        self.start_processor()
        self.killed.add(leaving.proc.pid)
        leaving.proc.send_signal(signal.SIGTERM)
        killed = None
        if self.rng.random() < 0.3 and len(self.live_members()) > 2:
            victim = self.rng.choice([m for m in self.live_members() if m is not leaving])
            self.kill_processor(victim)
            killed = "member"
        if leaving.proc.wait(60) != 0:
            self.errors.append(f"member-churn: a leaving member exited {leaving.proc.returncode}")
        self.detail |= {"processors": size, "churn_at": when, "killed": killed}
        self.one_truth()
        self.wait_owned()  # the newcomer up (a SIGTERM while it starts is no finding)

    def one_truth(self) -> None:
        """Within :data:`ONE_TRUTH_S` of the run's final record, every live member that reports
        the run reports it ``final`` with every rollout and input (and one at least does)."""
        self.until(self.has_final, "the final profile")
        since = time.monotonic()
        while True:
            views = {p.proc.pid: p.runs().get(self.run_id) for p in self.live_members()}
            known = {pid: v for pid, v in views.items() if v}
            wrong = {
                pid: (v.get("state"), v.get("rollouts"), v.get("inputs"))
                for pid, v in known.items()
                if (v.get("state"), v.get("rollouts"), v.get("inputs"))
                != ("final", self.expected, self.expected)
            }
            if known and not wrong:
                break
            if time.monotonic() - since > ONE_TRUTH_S:
                self.errors.append(f"members disagree on the final run {ONE_TRUTH_S} s on: {wrong}")
                break
            self.check_alive()
            time.sleep(POLL)
        self.detail["one_truth"] = {"members": len(views), "knowing": len(known)}

    # -- snapshots -----------------------------------------------------------------------------
    def check_offsets_snapshot(self, member: Processor, label: str) -> bool:
        """A snapshot of the run from ``member`` equals ``ng_reward_profile
        ++allow_partial_rollouts=True`` on exactly the events it reports covering (the offsets
        ``rewardstream snapshot`` prints), or, for a run already final, the final profile."""
        self.knows_run(member)
        final_before = self.has_final()
        snap = self.work / f"snapshot-{label}"
        return self.judge_snapshot(self.snapshot(member, snap), snap, label, final_before)

    def judge_snapshot(
        self,
        done: subprocess.CompletedProcess[str],
        snap: Path,
        label: str,
        final_before: bool,
    ) -> bool:
        """A snapshot's answer ``done`` (its files in ``snap``) against the batch profile of
        the offsets it reports (or the final one, if the run was final before it was asked)."""
        shots = self.detail.setdefault("snapshots", {})
        if done.returncode != 0:
            self.errors.append(f"snapshot {label} failed: {done.stderr.strip()[-300:]}")
            shots[label] = "failed"
            return False
        found = re.search(r" offsets=(\{.*?\}) -> ", done.stdout)
        if found is None:
            self.errors.append(f"snapshot {label}: no offsets in {done.stdout.strip()[-300:]}")
            shots[label] = "failed"
            return False
        offsets: dict[str, int] = orjson.loads(found.group(1))
        if final_before:
            reference = self.inputs.parent
        else:
            reference = self.work / f"partial-{label}"
            try:
                self.partial_profile(offsets, reference)
            except Exception as exc:  # the batch profiler refused those files
                self.errors.append(f"snapshot {label}: batch refused its events: {exc}"[:400])
                shots[label] = "batch-refused"
                return False
        equal = all(
            [f.read_bytes() for f in snap.glob(f"*{s}")]
            == [(reference / f"{STEM}{s}").read_bytes()]
            for s in OUTPUT_SUFFIXES
        )
        covered = sum(n for u, n in offsets.items() if u.startswith("rollout"))
        shots[label] = {
            "equal": equal,
            "of": "final" if final_before else "offsets",
            "rollout_offsets": covered,
        }
        if not equal:
            self.errors.append(f"snapshot {label} differs from the batch profile of {offsets}")
        return equal

    def partial_profile(self, offsets: dict[str, int], folder: Path) -> None:
        """The batch partial profile of the run's events in the data topics before
        ``offsets`` (by unit), in ``folder``: input rows by their line, rollouts deduplicated
        by (task, rollout) and mapped back to their line of the collection's rollouts file."""
        units = self.units()
        wanted = {units[u]: n for u, n in offsets.items() if u in units}
        records = asyncio.run(_read_until(self.bootstrap, wanted))
        lines: set[int] = set()
        keys: set[tuple[int, int]] = set()
        for tp, raw in records:
            body = orjson.loads(raw)
            if body.get("run_id") != self.run_id:
                continue
            if tp.topic == self.topics.inputs:
                lines.add(int(body["line"]))
            else:
                keys.add((int(body["task"]), int(body["rollout"])))
        rollout_rows = self.rollouts.read_bytes().splitlines(keepends=True)
        where: dict[tuple[int, int], int] = {}
        for i, row in enumerate(rollout_rows):
            body = orjson.loads(row)
            where.setdefault((body["_ng_task_index"], body["_ng_rollout_index"]), i)
        unknown = keys - set(where)
        if unknown:
            raise TrialError(f"{len(unknown)} consumed rollouts are in no line of the collection")
        folder.mkdir()
        input_rows = self.inputs.read_bytes().splitlines(keepends=True)
        (folder / self.inputs.name).write_bytes(b"".join(input_rows[i] for i in sorted(lines)))
        chosen = sorted(where[k] for k in keys)
        (folder / self.rollouts.name).write_bytes(b"".join(rollout_rows[i] for i in chosen))
        run_profile(
            ProfileConfig(
                materialized_inputs_jsonl_fpath=folder / self.inputs.name,
                rollouts_jsonl_fpath=folder / self.rollouts.name,
                allow_partial_rollouts=True,
                quiet=True,
            )
        )

    def knows_run(self, member: Processor) -> None:
        """Wait until ``member`` has read an event of the run: asked before, it answers 404
        (unknown run), which says how fast the publisher and the member started under load,
        not whether the snapshot is right."""
        self.until(lambda: self.run_id in member.runs(), "the member asked to know the run")

    def snapshot(
        self, member: Processor, out: Path, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``rewardstream snapshot`` of the run from ``member`` into ``out``, timed (raises
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        cmd = [sys.executable, "-m", "rewardstream.commands.cli", "snapshot", "--url", member.url]
        cmd += ["--run-id", self.run_id, "--out", str(out)]
        began = time.monotonic()
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        finally:
            self.snapshot_s.append(time.monotonic() - began)

    def check_snapshot(self, member: Processor, sent: list[int]) -> bool:
        """``member``'s snapshot equals ``ng_reward_profile ++allow_partial_rollouts=True`` on
        exactly the input rows and rollouts sent (``sent``: indices into ``file_events``,
        which lists the input lines, then the rollouts lines, in file order)."""
        folder = self.work / "partial"
        folder.mkdir()
        n = self.expected  # input lines
        for src, keep in (
            (self.inputs, [i for i in sent if i < n]),
            (self.rollouts, [i - n for i in sent if i >= n]),
        ):
            rows = src.read_bytes().splitlines(keepends=True)
            (folder / src.name).write_bytes(b"".join(rows[i] for i in keep))
        config = ProfileConfig(
            materialized_inputs_jsonl_fpath=folder / self.inputs.name,
            rollouts_jsonl_fpath=folder / self.rollouts.name,
            allow_partial_rollouts=True,
            quiet=True,
        )
        run_profile(config)
        snap = self.work / "snapshot"
        done = self.snapshot(member, snap)
        if done.returncode != 0:
            self.errors.append(f"snapshot failed: {done.stderr.strip()[-300:]}")
            return False
        # named after RunStarted's stem, or "rollouts" while it has not arrived
        equal = all(
            [f.read_bytes() for f in snap.glob(f"*{s}")] == [(folder / f"{STEM}{s}").read_bytes()]
            for s in OUTPUT_SUFFIXES
        )
        if not equal:
            self.errors.append("the snapshot differs from the batch partial profile")
        return equal

    # -- the verdict ---------------------------------------------------------------------------
    def verdict(self) -> tuple[int, int, bool]:
        """Lost, double-counted, equal to batch, over every group profiling the run (the
        default group's findings at the top of :attr:`detail`, another's under its name)."""
        lost = double = 0
        equal = True
        first = self.groups[0]
        try:
            for group in reversed(self.groups):
                self.group = group
                found: dict[str, Any] = {}
                n_lost, n_double, n_equal = self.group_verdict(found)
                lost, double = max(lost, n_lost), max(double, n_double)
                equal = equal and n_equal
                if group == first:
                    self.detail |= found
                else:
                    self.detail[f"group {group}"] = found
        finally:
            self.group = first
        dead = _reasons(self.dead_letters())
        self.detail["dead_letters"] = dead
        # late events of the finished run (run-final) are expected, and what the fault must
        # produce, exactly, once per group; any other dead letter is a finding
        want = {r: n * len(self.groups) for r, n in self.expected_letters.items()}
        if {r: n for r, n in dead.items() if r != "run-final"} != want:
            self.errors.append(f"dead letters: {dead}, expected {want} (and any run-final)")
        late = [
            line
            for line in (self.work / "processors.log").read_text(errors="replace").splitlines()
            if "came after its final profile's cut" in line
        ]
        if late:  # events a processor held that the final lacks
            self.errors.append(f"processors.log: {late[0][-300:]}")
        return lost, double, equal

    def group_verdict(self, detail: dict[str, Any]) -> tuple[int, int, bool]:
        """Lost, double-counted, equal to batch for ``self.group``: once the final profile is
        in Kafka, the log read to its end and every processor of the group stopped
        gracefully."""
        self.until(self.has_final, "the final profile")
        ends = self.ends()  # nothing is published any more: duplicates included
        self.read_to(ends)
        # commits wait for the dead letters to be parked: then they reach the log end
        self.until(
            lambda: all(n >= ends[u] for u, n in self.committed().items()),
            "the offsets to be committed to the log end",
        )
        counters = self.run_counters()
        final = self.final()
        assert final is not None
        records = self.final_records()
        detail["final_records"] = records
        if records != 1:
            self.errors.append(f"{records} final records of run {self.run_id} in {self.group}")
        writer = final.written_by.rsplit("-", 2)[-2]  # <host>-<pid>-<nonce>
        pid = int(writer) if writer.isdigit() else -1
        detail["mirror"] = self.check_mirror(pid)
        for p in self.live_members():
            p.proc.send_signal(signal.SIGTERM)
        for p in self.live_members():
            p.proc.wait(60)
            self.killed.add(p.proc.pid)
            if p.proc.returncode != 0:
                self.errors.append(f"processor exited with {p.proc.returncode} on SIGTERM")
        fetched = self.work / f"final-{self.group}"  # as any host reads it: from Kafka
        self.profiles_get(fetched)
        wrong = self.differing(fetched)
        self.wrong_files += len(wrong)
        equal = not wrong
        per_task = {
            row["_ng_task_index"]: row["num_rollouts"]
            for row in map(
                orjson.loads,
                (fetched / f"{STEM}_reward_profiling.jsonl").read_bytes().splitlines(),
            )
        }
        missing = sum(max(0, self.repeats - per_task.get(t, 0)) for t in range(self.tasks))
        extra = sum(max(0, n - self.repeats) for n in per_task.values())
        audit = self.audit(final)
        detail |= {"runs": counters, "audit": audit}
        if counters["rollouts"] != self.expected:  # a counter off, the profile may be right
            self.errors.append(f"/runs says {counters['rollouts']} of {self.expected} rollouts")
        # every offset from a unit's cut on is a late event of the run: parked (run-final) if
        # read once the final was known, else counted as a duplicate (or, if new, logged)
        detail["after_cut"] = sum(
            max(0, end - (u.cut if (u := final.units.get(n)) else 0)) for n, end in ends.items()
        )
        lost = max(missing, audit["lost"])
        double = max(extra, counters["rollouts"] - self.expected, audit["double_counted"])
        return lost, double, equal

    def check_mirror(self, writer: int) -> str:
        """The copy of the final profile its writer (pid ``writer``) keeps in its
        ``--output-dir``, on its private disk: read through its namespace while it runs (or
        from its host's kept disk), and equal to batch; ``absent`` only if it was killed
        (between the transaction and the mirror, or since: a tmpfs goes with its process)."""
        p = next((m for m in self.members if m.proc.pid == writer), None)
        if p is None:
            self.errors.append(f"the final's writer (pid {writer}) is no processor of the trial")
            return "unknown"

        def folder() -> Path:
            kept = self.kept_disks.get(self.host_of[writer])
            if p.proc.poll() is not None and kept is not None:
                return kept / "out" / self.run_id
            return self.on_disk(p, "out", self.run_id)

        def written() -> bool:
            with contextlib.suppress(OSError):
                return all((folder() / f"{STEM}{s}").exists() for s in OUTPUT_SUFFIXES)
            return False

        deadline = time.monotonic() + 10  # it follows the transaction
        while not written() and p.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL)
        try:
            if written():
                if self.equal_to_batch(folder()):
                    return "equal"
                self.errors.append("the --output-dir mirror differs from the batch profile")
                return "differs"
        except OSError:  # its process (and tmpfs) went away while it was read
            pass
        if writer not in self.killed:
            self.errors.append(f"no mirror on the writer's disk; it (pid {writer}) was not killed")
        return "absent"

    def profiles_get(self, out: Path) -> None:
        """``rewardstream profiles get`` of the run's final profile, for ``self.group``."""
        cmd = [sys.executable, "-m", "rewardstream.commands.cli", "profiles", "get"]
        cmd += ["--bootstrap", self.bootstrap, "--topic-prefix", self.prefix]
        cmd += ["--group-id", self.group, "--run-id", self.run_id, "--out", str(out)]
        cmd += ["--timeout", str(TIMEOUT)]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT + 30, check=False
        )
        if done.returncode != 0:
            raise TrialError(f"profiles get exited with {done.returncode}: {done.stderr[-300:]}")

    def final_records(self) -> int:
        """How many final records of the run ``self.group`` has in ``<prefix>.finals``."""

        async def count() -> int:
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                isolation_level="read_committed",
                request_timeout_ms=10_000,
            )
            await reader.start()
            try:
                finals = read_finals(reader, self.engine_topics.finals, self.prefix, self.group)
                return sum([1 async for f in finals if f.run_id == self.run_id])
            finally:
                await reader.stop()

        return asyncio.run(count())

    def differing(self, folder: Path) -> list[str]:
        """Which of ``folder``'s three profile files differ from the batch ones."""
        batch = self.inputs.parent
        return [
            s
            for s in OUTPUT_SUFFIXES
            if (folder / f"{STEM}{s}").read_bytes() != (batch / f"{STEM}{s}").read_bytes()
        ]

    def equal_to_batch(self, folder: Path) -> bool:
        """``folder``'s three profile files equal the batch ones, byte for byte."""
        return not self.differing(folder)

    def by_unit(self) -> dict[str, int]:
        """The collection's events by the unit they are published to (the publisher's
        partitioner on the task key): inputs in ``input-<p>``, rollouts in ``rollout-<p>``."""
        partitioner, partitions = DefaultPartitioner(), list(range(self.partitions))
        out = dict.fromkeys(self.units(), 0)
        for kind, raw in file_events(self.inputs, self.rollouts, self.run_id, STEM, False):
            if kind == "control":
                continue
            body = orjson.loads(raw)
            task = body["task"] if kind == "rollout" else body["row"]["_ng_task_index"]
            partition = partitioner(task_key(int(task)), partitions, partitions)
            out[f"{kind}-{partition}"] += 1
        return out

    def dead_letters(self) -> list[ConsumerRecord[bytes, bytes]]:
        """Every dead letter in the trial's topic now (every partition, to its end)."""
        return asyncio.run(read_topic(self.bootstrap, self.topics.dead_letters))

    def parked(self) -> dict[str, set[int]]:
        """The data offsets parked as dead letters (their ``source`` header), by unit."""
        unit_of = {(tp.topic, tp.partition): name for name, tp in self.units().items()}
        out: dict[str, set[int]] = {}
        for letter in self.dead_letters():
            topic, _, rest = dict(letter.headers).get("source", b"").decode().partition(":")
            partition, _, offset = rest.partition(":")
            name = unit_of.get((topic, int(partition))) if partition.isdigit() else None
            if name is not None and offset.isdigit():
                out.setdefault(name, set()).add(int(offset))
        return out

    def audit(self, final: FinalRecord) -> dict[str, int]:
        """The final record against the collection, with no shared folder: every input row
        and rollout held once, in all and in the unit it was published to; and every offset
        of a unit before the record's cut counted once (as new, as a duplicate, or parked as
        a dead letter), the cut being where the unit's processor stood when its part was
        taken."""
        out = dict.fromkeys(("uncounted", "counted_twice", "lost", "double_counted"), 0)
        out["duplicates"] = sum(u.duplicates for u in final.units.values())
        if final.state != "final" or final.partial:
            self.errors.append(f"final record: state {final.state}, partial {final.partial}")
        parked = self.parked()
        for name, want in self.by_unit().items():
            unit = final.units.get(name)
            held = (unit.inputs if name.startswith("input") else unit.rollouts) if unit else 0
            other = (unit.rollouts if name.startswith("input") else unit.inputs) if unit else 0
            out["lost"] += max(0, want - held)
            out["double_counted"] += max(0, held - want) + other
            if unit is not None:
                letters = sum(1 for offset in parked.get(name, ()) if offset < unit.cut)
                counted = unit.inputs + unit.rollouts + unit.duplicates + letters
                out["uncounted"] += max(0, unit.cut - counted)
                out["counted_twice"] += max(0, counted - unit.cut)
        for what, n in (("inputs", final.inputs), ("rollouts", final.rollouts)):
            in_units = sum(getattr(u, what) for u in final.units.values())
            if n != self.expected or n != in_units:
                self.errors.append(
                    f"final record: {n} {what} ({in_units} in its units) of {self.expected}"
                )
                out["lost"] = max(out["lost"], self.expected - n)
                out["double_counted"] = max(out["double_counted"], n - self.expected)
        for key in ("uncounted", "counted_twice"):
            if out[key]:
                self.errors.append(f"audit: {out[key]} offsets {key.replace('_', ' ')}")
        return out

    def cleanup(self) -> None:
        """Kill whatever still runs (by pid; the publisher by process group), drop the topics."""
        if self.feeder is not None:
            self.feeder.stop.set()
            self.feeder.wait()
        for pub in self.publishers:
            pub.kill()
        for p in [*self.members, *self.others]:
            if p.proc.poll() is None:
                self.kill_processor(p)
        deadline = time.monotonic() + 5  # e.g. a killed processor's snapshot builders
        while (left := _leftovers(self.prefix)) and time.monotonic() < deadline:
            time.sleep(POLL)
        if left:
            self.errors.append(f"processes left after 5 s (killed now): {left}")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for topics in (self.topics, *self.extra_topics):
            with contextlib.suppress(Exception):
                asyncio.run(_delete_topics(self.bootstrap, topics))

    def publisher_errors(self) -> None:
        """A publisher that failed on its own (not killed by the trial) is a finding."""
        for pub in self.publishers:
            if pub.failed():
                log = (self.work / "publisher.log").read_text(errors="replace")[-500:]
                self.errors.append(f"publisher exited with {pub.proc.returncode}: {log}")


def run_trial(
    fault: str,
    seed: int,
    bootstrap: str | None,
    work: Path,
    sizes: Sizes = DEFAULT,
    plant: str | None = None,
) -> Result:
    """One trial of ``fault`` in ``work`` (a fresh folder). ``broker-restart`` starts its own
    broker, ``broker-kill`` its own three-broker cluster; the others need ``bootstrap``.
    ``plant`` (``baseline`` only, one of :data:`PLANTS`): a finding the trial must report."""
    if plant is not None and (fault != "baseline" or plant not in PLANTS):
        raise ValueError(f"plant {plant!r}: one of {PLANTS}, in a baseline trial only")
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        broker = cluster = None
        if fault == "broker-restart":
            broker = stack.enter_context(LocalBroker())
            bootstrap = broker.bootstrap
        elif fault == "broker-kill":
            cluster = stack.enter_context(LocalCluster(brokers=3))
            bootstrap = cluster.bootstrap
        assert bootstrap is not None, f"{fault} needs a broker"
        trial = Trial(fault, seed, bootstrap, work, sizes, plant)
        if cluster is not None:
            trial.replication = 3
        lost: int | None = None
        double: int | None = None
        equal = False
        try:
            if broker is not None:
                trial.broker_restart_trial(broker)
            elif cluster is not None:
                trial.broker_kill_trial(cluster)
            else:
                getattr(trial, f"{fault.replace('-', '_')}_trial")()
            lost, double, equal = trial.verdict()
        except Exception as exc:  # recorded: the next trials still run
            why = str(exc) if isinstance(exc, TrialError) else traceback.format_exc(limit=-3)
            trial.errors.append(why)
        finally:
            trial.cleanup()
        trial.publisher_errors()
        trial.detail["wrong_files"] = trial.wrong_files
        if trial.snapshot_s:
            trial.detail["max_snapshot_s"] = round(max(trial.snapshot_s), 2)
        if trial.errors:
            trial.detail["errors"] = trial.errors
        recovery = max(trial.recoveries) if trial.recoveries else None
        return Result(
            fault, seed, lost, double, recovery, equal, time.monotonic() - began, trial.detail
        )


def summary(results: list[Result]) -> str:
    """The table of RELIABILITY.md, per fault: trials, rollouts, lost, double-counted, wrong
    bytes (final profile files, per group, not equal to batch), max recovery, max snapshot
    latency, snapshots equal to batch, and the seeds of trials with a finding."""
    lines = [
        "| fault | trials | rollouts | lost | double-counted | wrong bytes (files) "
        "| max recovery (s) | max snapshot latency (s) | snapshots equal to batch "
        "| trials with a finding |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def worst(values: list[float]) -> str:
        return f"{max(values):.1f}" if values else "-"

    for fault in FAULTS:
        rs = [r for r in results if r.fault == fault]
        if not rs:
            continue
        recovery = worst([r.recovery_s for r in rs if r.recovery_s is not None])
        latency = worst([r.detail["max_snapshot_s"] for r in rs if "max_snapshot_s" in r.detail])
        failed = ", ".join(str(r.seed) for r in rs if not r.ok) or "none"
        shots = [
            x["equal"]
            for r in rs
            for x in r.detail.get("snapshots", {}).values()
            if isinstance(x, dict) and "equal" in x
        ]
        shots += [
            r.detail["snapshot_equal_to_batch"] for r in rs if "snapshot_equal_to_batch" in r.detail
        ]
        failed_shots = sum(
            1 for r in rs for x in r.detail.get("snapshots", {}).values() if not isinstance(x, dict)
        )
        snapshots = f"{sum(shots)} of {len(shots) + failed_shots}" if shots or failed_shots else "-"
        lost = "?" if any(r.lost is None for r in rs) else ""
        double = "?" if any(r.double_counted is None for r in rs) else ""
        lines.append(
            f"| {fault} | {len(rs)} | {sum(r.rollouts for r in rs):,} | "
            f"{sum(r.lost or 0 for r in rs)}{lost} | "
            f"{sum(r.double_counted or 0 for r in rs)}{double} | "
            f"{sum(int(r.detail.get('wrong_files', 0)) for r in rs)} | {recovery} | {latency} "
            f"| {snapshots} | {failed} |"
        )
    kills = [k for r in results for k in r.detail.get("kills", ())]
    if kills:
        landed = ", ".join(
            f"{m}: {kills.count(m)} of {kills.count(m) + kills.count(m + '-missed')}"
            for m in (*KILL_MODES, "final")
        )
        lines.append(f"\nkill-processor kills that landed where aimed: {landed}")
    cut = [f"{r.fault} {r.seed}" for r in results if r.lost is None]
    if cut:
        lines.append(f"\ncut short before they could count (a ? above): {', '.join(cut)}")
    return "\n".join(lines)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM unwind the trial, so every ``finally`` kills its children; a second
    one is ignored, so that cleanup is not cut short.

    Our own SIGINT handler also keeps ``asyncio.run`` from installing its own, which turns
    Ctrl-C into a cancellation that aiokafka's clean-up can swallow (seen here: the run went
    on as if nothing had happened)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--fault",
        choices=[*FAULTS, "all"],
        action="append",
        help="a fault kind, repeatable (default: all)",
    )
    ap.add_argument("--trials", type=int, default=20, help="per fault (20)")
    ap.add_argument("--seed", type=int, default=0, help="first trial's seed (0)")
    ap.add_argument("--bootstrap", default=None, help="a broker (default: one started here)")
    ap.add_argument("--summary", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--keep", type=Path, default=Path("bench/out/chaos"), help="failed trials' folders"
    )
    ap.add_argument("--fast", action="store_true", help="the small trials of the test suite")
    ap.add_argument(
        "--plant", choices=PLANTS, default=None, help="a finding to plant (--fault baseline only)"
    )
    a = ap.parse_args()
    if a.plant is not None and a.fault != ["baseline"]:
        ap.error("--plant needs --fault baseline (and no other kind)")
    # the trial's own clients retry while a broker is down: their log lines are no findings
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    faults = FAULTS if not a.fault or "all" in a.fault else tuple(a.fault)
    sizes = FAST if a.fast else Sizes()
    results: list[Result] = []
    interrupted = False
    try:
        with _interruptible(), contextlib.ExitStack() as stack:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
            bootstrap = a.bootstrap
            for fault in faults:
                own = ("broker-restart", "broker-kill")  # these start their own brokers
                if fault not in own and bootstrap is None:  # one broker for the rest
                    bootstrap = stack.enter_context(LocalBroker()).bootstrap
                for seed in range(a.seed, a.seed + a.trials):
                    work = root / f"{fault}-{seed}"
                    result = run_trial(fault, seed, bootstrap, work, sizes, a.plant)
                    print(result.line(), flush=True)
                    results.append(result)
                    if not result.ok:
                        dest = a.keep / work.name
                        shutil.rmtree(dest, ignore_errors=True)
                        shutil.copytree(work, dest)
                    shutil.rmtree(work, ignore_errors=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: every process this run started is stopped", file=sys.stderr)
    table = summary(results)
    print(table)
    if a.summary is not None:
        a.summary.write_text(table + "\n")
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
