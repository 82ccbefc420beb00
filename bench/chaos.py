"""Fault-injection trials: a real broker, real processes, nothing lost, nothing counted twice.

    python -m bench.chaos [--fault all] [--trials 20] [--seed 0] [--bootstrap HOST:PORT]
                          [--summary FILE] [--keep DIR] [--fast]

Each trial is seeded (trial ``i`` of a fault runs seed ``--seed + i``; ``--fault F --seed S
--trials 1`` repeats one): it generates a collection (``bench/generate.py``, 300-2,000 tasks x
4-8 rollouts, three agents), profiles it with the batch profiler, then streams it through real
``rewardstream stream`` and ``rewardstream publish`` child processes (the rollouts file grows
while the publisher follows it, as during a collection) and injects one fault:

- ``kill-processor``: ``kill -9`` of the processor, twice, each aimed at one moment: while it
  consumes a backlog, while a checkpoint file is being written (``--checkpoint-every 0.05``
  and the checkpoint folder polled for the temp file of a write in progress), or while a
  ``POST /runs/<id>/snapshot`` is in flight; then a restart;
- ``broker-restart``: the broker (its own, for this trial) stopped (SIGTERM or SIGKILL) and
  started again on the same data dir and port mid-run; nothing else is restarted;
- ``group-rebalance``: two or three processors in one group, one (or two in turn) killed with
  ``kill -9`` mid-run and brought back;
- ``publisher-rerun``: the publisher's process group killed mid-publish and the publisher run
  again on the same files, sometimes followed by a whole republish killed and re-run too;
- ``disorder``: events sent by hand: inputs shuffled, rollouts shuffled, some tasks' inputs
  only after all their rollouts, rollouts after a snapshot (which is checked against the
  batch partial profile of what it covers), redelivered copies.

Then it checks the final profile files against the batch ones, byte for byte, and counts lost
and double-counted rollouts three ways: per task from the final profile's ``num_rollouts``,
from the processors' ``/runs`` counters, and from an audit of the checkpoints after a graceful
stop (each partition consumed to its end, and every offset counted exactly once: as new or as
a duplicate). Recovery time: from the restart of the killed component until the processors
have consumed the log as far as it reached at that restart (or, for the last restart of a
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
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.generate import generate
from processors.checkpoint import CheckpointStore
from processors.pipeline import EventKind
from rewardstream.batch import ProfileConfig, run_profile
from rewardstream.contract import Topics
from rewardstream.kafka_local import LocalBroker
from tests.golden import OUTPUT_SUFFIXES, file_events
from tests.processes import Processor, make_topics, send_events

__all__ = ["FAST", "FAULTS", "Result", "Sizes", "run_trial", "summary"]

FAULTS = ("kill-processor", "broker-restart", "group-rebalance", "publisher-rerun", "disorder")
EXTRA_FAULTS = ("pause-member",)  # beyond issue 6's list; not in --fault all
KILL_MODES = ("consume", "checkpoint", "snapshot")
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


async def _delete_topics(bootstrap: str, topics: Topics) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        names = [topics.inputs, topics.rollouts, topics.control, topics.dead_letters]
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


class Publisher:
    """``rewardstream publish`` as a child in its own process group: it forks encoders, and a
    kill of the publisher takes them with it, as a ``kill -9`` of a job would."""

    def __init__(self, trial: Trial, follow: bool, idle_timeout: float = 1.0) -> None:
        cmd = [sys.executable, "-m", "rewardstream.cli", "publish", "--quiet"]
        cmd += ["--inputs", str(trial.inputs), "--bootstrap", trial.bootstrap]
        cmd += ["--topic-prefix", trial.prefix, "--run-id", trial.run_id]
        if follow:
            cmd += ["--rollouts", str(trial.live), "--follow", "--idle-timeout", str(idle_timeout)]
        else:
            cmd += ["--rollouts", str(trial.rollouts)]
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

    def stop(self) -> None:
        """SIGTERM: a following publisher sends what is left and RunFinished, and exits."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)

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

    def __init__(self, fault: str, seed: int, bootstrap: str, work: Path, sizes: Sizes) -> None:
        self.fault, self.seed, self.bootstrap, self.work, self.sizes = (
            fault,
            seed,
            bootstrap,
            work,
            sizes,
        )
        self.rng = random.Random(f"{fault}/{seed}")
        self.tasks = self.rng.randint(*sizes.tasks)
        self.repeats = self.rng.randint(*sizes.repeats)
        self.feed_s = self.rng.uniform(*sizes.feed_s)
        self.prefix = f"chaos-{fault}-{seed}-{uuid.uuid4().hex[:6]}"
        self.topics = Topics.for_prefix(self.prefix)
        self.run_id = f"chaos-{seed}"
        self.inputs = work / "data" / f"{STEM}_materialized_inputs.jsonl"
        self.rollouts = work / "data" / f"{STEM}.jsonl"
        self.live = work / "live" / f"{STEM}.jsonl"
        self.out = work / "out"
        self.partitions = 1
        self.members: list[Processor] = []
        self.killed: set[int] = set()  # pids killed on purpose
        self.frozen: set[int] = set()  # pids stopped (SIGSTOP) for now
        self.publishers: list[Publisher] = []
        self.feeder: Feeder | None = None
        self.recoveries: list[float] = []
        self.errors: list[str] = []
        self.detail: dict[str, Any] = {}

    @property
    def expected(self) -> int:
        return self.tasks * self.repeats

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self, partitions: int) -> None:
        """The collection, its batch profile (next to it), and the topics."""
        self.partitions = partitions
        generate(self.tasks, self.repeats, self.inputs.parent / STEM, 200, self.seed)
        config = ProfileConfig(
            materialized_inputs_jsonl_fpath=self.inputs,
            rollouts_jsonl_fpath=self.rollouts,
            quiet=True,
        )
        run_profile(config)
        self.live.parent.mkdir(parents=True)
        self.live.touch()
        asyncio.run(make_topics(self.bootstrap, self.topics, partitions))
        self.detail |= {"tasks": self.tasks, "repeats": self.repeats, "partitions": partitions}

    def units(self) -> dict[str, TopicPartition]:
        """Every data partition by the processor's unit name for it."""
        return {
            f"{kind}-{p}": TopicPartition(topic, p)
            for kind, topic in (("input", self.topics.inputs), ("rollout", self.topics.rollouts))
            for p in range(self.partitions)
        }

    def start_processor(self, checkpoint_every: float = 0.2) -> Processor:
        log = self.work / "processors.log"
        p = Processor(self.bootstrap, self.prefix, self.out, log, checkpoint_every)
        self.members.append(p)
        return p

    def start_publisher(self, follow: bool = True, idle_timeout: float = 1.0) -> Publisher:
        pub = Publisher(self, follow, idle_timeout)
        self.publishers.append(pub)
        return pub

    def start_feed(self) -> Publisher:
        """The growing rollouts file, written over ``feed_s``, and a publisher following it."""
        self.feeder = Feeder(self.rollouts, self.live)
        self.feeder.feed(1.0, self.feed_s)
        return self.start_publisher(follow=True)

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
        return [p for p in self.members if p.proc.poll() is None and p.proc.pid not in self.frozen]

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
        its peers' too) and duplicates dropped (summed: each counts its own units')."""
        members = self.live_members()
        return {
            "rollouts": max((self.count(p, "rollouts") for p in members), default=0),
            "duplicates": sum(self.count(p, "duplicates") for p in members),
        }

    @property
    def final_mark(self) -> Path:
        return self.out / self.run_id / ".state" / "final"

    # -- the fault kinds -----------------------------------------------------------------------
    def kill_processor_trial(self) -> None:
        """Each life of the processor but the last starts with a backlog (a segment of the
        collection published while it was down, all the inputs for the first) that its kill is
        aimed into; the last 10% of the rollouts are fed after the last restart, so the run
        cannot end before it."""
        self.prepare(self.rng.randint(1, 4))
        kills = self.sizes.kills
        bounds = [0.9 * (i + 1) / kills for i in range(kills)]
        seconds = self.feed_s / kills
        feeder = self.feeder = Feeder(self.rollouts, self.live)
        publisher = self.start_publisher(follow=True, idle_timeout=600)  # stopped by SIGTERM
        feeder.feed(bounds[0], seconds)
        target = self.published(feeder)
        landed = []
        for i in range(kills):
            restarted = time.monotonic()
            p = self.start_processor(checkpoint_every=0.05)  # many checkpoints to aim at
            mode = KILL_MODES[(self.seed * kills + i) % len(KILL_MODES)]
            landed.append(self.kill_during(p, mode, target, restarted, restart=i > 0))
            if i + 1 < kills:
                feeder.feed(bounds[i + 1], seconds)
                target = self.published(feeder)
            time.sleep(self.rng.uniform(0.0, 1.0))
        restarted = time.monotonic()
        p = self.start_processor(checkpoint_every=0.05)
        feeder.feed(1.0, self.feed_s * 0.1)
        feeder.wait()
        publisher.stop()  # RunFinished goes out, after every line
        if self.rng.random() < 0.5:  # and once more, while it writes the final profile
            landed.append(self.kill_in_final_write(p))
            time.sleep(self.rng.uniform(0.0, 1.0))
            restarted = time.monotonic()
            self.start_processor(checkpoint_every=0.05)
        self.detail["kills"] = landed
        self.until(self.final_mark.exists, "the final profile")
        self.recoveries.append(time.monotonic() - restarted)

    def kill_in_final_write(self, p: Processor) -> str:
        """``kill -9`` of ``p`` at the first temp file of the final profile seen (the files
        are written to temp names, then renamed, then the final mark); ``final`` if the kill
        came before the mark."""
        folder = self.out / self.run_id
        deadline = time.monotonic() + TIMEOUT
        while not any(folder.glob(f".{STEM}_*")) and not self.final_mark.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TrialError("timed out waiting for the final profile's write")
            time.sleep(0.0002)
        self.kill_processor(p)
        return "final-missed" if self.final_mark.exists() else "final"

    def kill_during(
        self, p: Processor, mode: str, target: dict[str, int], started: float, restart: bool
    ) -> str:
        """``kill -9`` of ``p`` (started at ``started``) aimed at ``mode``, once it is assigned;
        returns ``mode`` if it landed there, else ``mode`` + ``-missed``. ``target``: the log
        end offsets; its backlog is what lies between its checkpoints and them."""
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
            # landed if the restart must replay: progress not checkpointed, or backlog unread
            saved = CheckpointStore(self.out / ".checkpoint").manifests(target)
            landed = any(
                (saved[n].position if n in saved else 0) < end for n, end in target.items()
            )
        elif mode == "checkpoint":  # at the first checkpoint write seen in progress
            folder = self.out / ".checkpoint"
            before = {f.name for f in folder.glob(".*")}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if {f.name for f in folder.glob(".*")} - before:
                    break
                time.sleep(0.0002)
            self.kill_processor(p)
            landed = bool({f.name for f in folder.glob(".*")} - before)  # a write cut short
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
        self.prepare(self.rng.randint(1, 4))
        self.start_processor(checkpoint_every=self.rng.choice([0.2, 1.0, 5.0]))
        self.wait_owned()
        publisher = self.start_feed()
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
        self.prepare(self.rng.randint(size, 6))
        for _ in range(size):
            self.start_processor()
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
            self.start_processor()
            if overlap and i == 0:
                time.sleep(self.rng.uniform(0.0, 3.0))
            else:
                self.recover(since, target)
        self.detail |= {"processors": size, "killed": victims, "overlap": overlap}
        self.until(lambda: publisher.proc.poll() is not None, "the publisher")

    def pause_member_trial(self) -> None:
        """A member stopped (SIGSTOP) past its session timeout (10 s), then resumed, as after a
        long GC pause or a frozen VM: the group has moved its partitions on meanwhile, and the
        member goes on from where it stood until it learns so (a zombie)."""
        size = self.rng.choice([2, 3])
        self.prepare(self.rng.randint(size, 6))
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
        pause = self.rng.uniform(10.5, 14.0)
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
        self.prepare(self.rng.randint(1, 4))
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
                self.recoveries.append(self.until(self.final_mark.exists, "the final profile"))
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
        self.prepare(self.rng.randint(size, 4))
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
        # answer a snapshot (batch would refuse such files: that refusal is fine) and go on
        self.until(lambda: self.count(member, "rollouts") == self.expected, "the rollouts")
        done = self.snapshot(member, self.work / "snapshot-early")
        self.detail["snapshot_before_inputs"] = (
            "ok" if done.returncode == 0 else "refused: " + done.stderr.strip()[:100]
        )
        send_events(self.bootstrap, self.topics, last, self.run_id)
        if self.detail["finished_sent"]:
            send_events(self.bootstrap, self.topics, [finished], self.run_id)

    def snapshot(self, member: Processor, out: Path) -> subprocess.CompletedProcess[str]:
        """``rewardstream snapshot`` of the run from ``member`` into ``out``."""
        cmd = [sys.executable, "-m", "rewardstream.cli", "snapshot", "--url", member.url]
        cmd += ["--run-id", self.run_id, "--out", str(out)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)

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
        """Lost, double-counted, equal to batch: once the final profile is written, the log
        read to its end and every processor stopped gracefully (their last checkpoints)."""
        self.until(self.final_mark.exists, "the final profile")
        self.read_to(self.ends())  # nothing is published any more: duplicates included
        counters = self.run_counters()
        for p in self.live_members():
            p.proc.send_signal(signal.SIGTERM)
        for p in self.live_members():
            p.proc.wait(60)
            self.killed.add(p.proc.pid)
            if p.proc.returncode != 0:
                self.errors.append(f"processor exited with {p.proc.returncode} on SIGTERM")
        folder = self.out / self.run_id
        equal = all(
            (folder / f"{STEM}{s}").read_bytes() == (self.inputs.parent / f"{STEM}{s}").read_bytes()
            for s in OUTPUT_SUFFIXES
        )
        per_task = {
            row["_ng_task_index"]: row["num_rollouts"]
            for row in map(
                orjson.loads, (folder / f"{STEM}_reward_profiling.jsonl").read_bytes().splitlines()
            )
        }
        missing = sum(max(0, self.repeats - per_task.get(t, 0)) for t in range(self.tasks))
        extra = sum(max(0, n - self.repeats) for n in per_task.values())
        audit = self.audit()
        self.detail |= {"runs": counters, "audit": audit}
        if counters["rollouts"] != self.expected:  # a counter off, the profile may be right
            self.errors.append(f"/runs says {counters['rollouts']} of {self.expected} rollouts")
        lost = max(missing, audit["lost"])
        double = max(extra, counters["rollouts"] - self.expected, audit["double_counted"])
        return lost, double, equal

    def audit(self) -> dict[str, int]:
        """The checkpoints after a graceful stop: each partition read to its end, every offset
        counted once (as new or as a duplicate), every rollout and input row once."""
        store, ends = CheckpointStore(self.out / ".checkpoint"), self.ends()
        out = dict.fromkeys(("unread", "uncounted", "counted_twice", "lost", "double_counted"), 0)
        rollouts = inputs = 0
        for name, end in ends.items():
            unit = store.load(name)
            position = unit.position if unit else 0
            part = unit.parts.get(self.run_id) if unit else None
            counted = part.inputs + part.rollouts + part.duplicates if part else 0
            if part:
                rollouts, inputs = rollouts + part.rollouts, inputs + part.inputs
            if unit:
                unit.close()
            out["unread"] += max(0, end - position)
            out["uncounted"] += max(0, position - counted)
            out["counted_twice"] += max(0, counted - position)
        if not out["unread"]:  # behind the log end, a restart replays: not lost, but wrong
            out["lost"] = max(0, self.expected - rollouts) + max(0, self.expected - inputs)
        out["double_counted"] = max(0, rollouts - self.expected) + max(0, inputs - self.expected)
        for key in ("unread", "uncounted", "counted_twice"):
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
        for p in self.members:
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
        with contextlib.suppress(Exception):
            asyncio.run(_delete_topics(self.bootstrap, self.topics))

    def publisher_errors(self) -> None:
        """A publisher that failed on its own (not killed by the trial) is a finding."""
        for pub in self.publishers:
            if pub.failed():
                log = (self.work / "publisher.log").read_text(errors="replace")[-500:]
                self.errors.append(f"publisher exited with {pub.proc.returncode}: {log}")


def run_trial(
    fault: str, seed: int, bootstrap: str | None, work: Path, sizes: Sizes = DEFAULT
) -> Result:
    """One trial of ``fault`` in ``work`` (a fresh folder). ``broker-restart`` starts its own
    broker; the others need ``bootstrap``."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        broker = None
        if fault == "broker-restart":
            broker = stack.enter_context(LocalBroker())
            bootstrap = broker.bootstrap
        assert bootstrap is not None, f"{fault} needs a broker"
        trial = Trial(fault, seed, bootstrap, work, sizes)
        lost: int | None = None
        double: int | None = None
        equal = False
        try:
            if broker is not None:
                trial.broker_restart_trial(broker)
            else:
                getattr(trial, f"{fault.replace('-', '_')}_trial")()
            lost, double, equal = trial.verdict()
        except Exception as exc:  # recorded: the next trials still run
            why = str(exc) if isinstance(exc, TrialError) else traceback.format_exc(limit=-3)
            trial.errors.append(why)
        finally:
            trial.cleanup()
        trial.publisher_errors()
        if trial.errors:
            trial.detail["errors"] = trial.errors
        recovery = max(trial.recoveries) if trial.recoveries else None
        return Result(
            fault, seed, lost, double, recovery, equal, time.monotonic() - began, trial.detail
        )


def summary(results: list[Result]) -> str:
    """The table of RELIABILITY.md: per fault, trials, lost, double-counted, max recovery."""
    lines = [
        "| fault | trials | lost | double-counted | max recovery (s) | all equal to batch "
        "| failed trials |",
        "|---|---|---|---|---|---|---|",
    ]
    for fault in (*FAULTS, *EXTRA_FAULTS):
        rs = [r for r in results if r.fault == fault]
        if not rs:
            continue
        recoveries = [r.recovery_s for r in rs if r.recovery_s is not None]
        worst = f"{max(recoveries):.1f}" if recoveries else "-"
        failed = ", ".join(str(r.seed) for r in rs if not r.ok) or "none"
        lines.append(
            f"| {fault} | {len(rs)} | {sum(r.lost or 0 for r in rs)} | "
            f"{sum(r.double_counted or 0 for r in rs)} | {worst} | "
            f"{'yes' if all(r.equal_to_batch for r in rs) else 'no'} | {failed} |"
        )
    kills = [k for r in results for k in r.detail.get("kills", ())]
    if kills:
        landed = ", ".join(
            f"{m}: {kills.count(m)} of {kills.count(m) + kills.count(m + '-missed')}"
            for m in (*KILL_MODES, "final")
        )
        lines.append(f"\nkill-processor kills that landed where aimed: {landed}")
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
    ap.add_argument("--fault", choices=[*FAULTS, *EXTRA_FAULTS, "all"], default="all")
    ap.add_argument("--trials", type=int, default=20, help="per fault (20)")
    ap.add_argument("--seed", type=int, default=0, help="first trial's seed (0)")
    ap.add_argument("--bootstrap", default=None, help="a broker (default: one started here)")
    ap.add_argument("--summary", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--keep", type=Path, default=Path("bench/out/chaos"), help="failed trials' folders"
    )
    ap.add_argument("--fast", action="store_true", help="the small trials of the test suite")
    a = ap.parse_args()
    faults = FAULTS if a.fault == "all" else (a.fault,)
    sizes = FAST if a.fast else Sizes()
    results: list[Result] = []
    interrupted = False
    try:
        with _interruptible(), contextlib.ExitStack() as stack:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
            bootstrap = a.bootstrap
            for fault in faults:
                if fault != "broker-restart" and bootstrap is None:  # one broker for the rest
                    bootstrap = stack.enter_context(LocalBroker()).bootstrap
                for seed in range(a.seed, a.seed + a.trials):
                    work = root / f"{fault}-{seed}"
                    result = run_trial(fault, seed, bootstrap, work, sizes)
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
