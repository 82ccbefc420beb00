"""Soak: millions of rollouts through a real broker and one ``rewardstream stream`` process,
its memory sampled every second.

    python -m bench.soak                               # 10,000,000 rollouts: 20 runs x 100,000 x 5
    python -m bench.soak --rollouts 200000             # the short version (~1 min)
    python -m bench.soak --results bench/results       # where the CSV, summary and plot go

Why: a long-lived processor profiles collection after collection. Done runs are evicted
(:mod:`rewardstream.processors.engine.runs`), so its memory must follow the runs being
collected, never the runs profiled before: a sawtooth, not a slope.

What runs: a broker from the Maven jars whose retention deletes consumed data (64 MiB segments,
1 GiB per partition, checked every 5 s: 10M events would otherwise take ~10 GB of disk), fresh
topics with ``--partitions`` partitions, one processor as the CLI runs it (``tests.processes``,
default checkpointing), and here a feeder that publishes ``--runs`` collections one after the
other: a run's materialized rows (``bench.generate``'s rows), its ``RunStarted``, its rollouts in
a shuffled order and ``RunFinished``, encoded by the publisher's own ``input_event`` and
``rollout_event`` and sent through its ``Sender``. At most ``--ahead`` runs are published and
not yet profiled, which bounds the broker's backlog (so retention never deletes unread data).

Checks: every final profile has every task with all its rollouts (then its files are deleted:
~200 MB a run); for the runs in ``--compare`` the feeder also writes the collection's two
files, and ``ng_reward_profile`` on them must give the same three files byte for byte.
Outputs in ``--results``: ``soak-memory.csv`` (a sample a second), ``soak-summary.json`` and,
with matplotlib (``pip install -e '.[bench]'``), ``soak-memory.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, NamedTuple, cast

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer

from bench.generate import AGENTS, input_row, result_row, text
from bench.measure import tree_rss_kb
from rewardstream.contract.events import RunFinished, RunStarted, Topics, encode
from rewardstream.kafka.local import LocalBroker
from rewardstream.processors.batch import ProfileConfig, run_profile
from rewardstream.producers.events import WireEvent, input_event, rollout_event
from rewardstream.producers.publisher.lines import MAX_MESSAGE_BYTES
from rewardstream.producers.publisher.publish import Sender
from rewardstream.sinks.files import ProfilePaths
from tests.golden import OUTPUT_SUFFIXES
from tests.processes import Processor, Runs, make_topics

STEM = "rollouts"
CHUNK = 5_000  # events handed to the sender at once
RETENTION = {  # broker defaults for every topic: consumed data is deleted as the soak goes
    "log.segment.bytes": str(64 << 20),
    "log.retention.bytes": str(1 << 30),
    "log.retention.check.interval.ms": "5000",
    "log.segment.delete.delay.ms": "1000",
}
STALL_S = 900.0  # no run finished for this long: the soak fails


class SoakError(RuntimeError):
    """A run was not profiled, or not profiled right."""


@dataclass(frozen=True)
class Plan:
    """``runs`` collections of ``tasks`` x ``repeats`` rollouts each."""

    runs: int
    tasks: int
    repeats: int
    partitions: int = 2
    ahead: int = 2
    compare: frozenset[int] = frozenset()

    @property
    def per_run(self) -> int:
        return self.tasks * self.repeats

    @staticmethod
    def run_id(k: int) -> str:
        return f"soak-{k:03d}"


class Sample(NamedTuple):
    """One second of the soak: the processor's RSS and what it had consumed then."""

    t: float
    rss_mib: float
    rollouts: int
    inputs: int
    runs_done: int
    load1: float
    broker_mib: float


# -- the collections ------------------------------------------------------------------------
_RNG = random.Random(0)
_PROMPTS = [text(_RNG, 180) for _ in range(64)]
_BODIES = [text(_RNG, 64) for _ in range(256)]


def _chunks(events: Iterator[WireEvent]) -> Iterator[list[tuple[bytes, bytes]]]:
    chunk: list[tuple[bytes, bytes]] = []
    for event in events:
        chunk.append((event.key, event.value))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def input_events(plan: Plan, run_id: str, file: IO[bytes] | None) -> Iterator[WireEvent]:
    """The run's materialized rows, task by task (written to ``file`` too, if given)."""
    path = Path(f"{run_id}/{STEM}_materialized_inputs.jsonl")  # names lines in errors only
    for t in range(plan.tasks):
        row = input_row(t, 0, AGENTS[t % len(AGENTS)], _PROMPTS[t % 64] + f" #{t}")
        for r in range(plan.repeats):
            row["_ng_rollout_index"] = r
            if file is not None:
                file.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            yield input_event(row, run_id, path, t * plan.repeats + r + 1)


def rollout_events(plan: Plan, k: int, file: IO[bytes] | None) -> Iterator[WireEvent]:
    """Run ``k``'s rollouts in a shuffled (completion) order, rewards salted by run."""
    run_id, path = plan.run_id(k), Path(f"{plan.run_id(k)}/{STEM}.jsonl")
    order = np.random.default_rng(k).permutation(plan.per_run)
    for line, flat in enumerate(order.tolist(), 1):
        t, r = divmod(flat, plan.repeats)
        row = result_row(t, r, flat, _PROMPTS[t % 64] + f" #{t}", _BODIES, salt=k * 7919)
        if file is not None:
            file.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        yield rollout_event(row, run_id, path, line)


async def publish_run(sender: Sender, topics: Topics, plan: Plan, k: int, files: Path) -> None:
    """Send run ``k`` as ``rewardstream publish`` would (inputs, RunStarted, rollouts,
    RunFinished); a compared run's two files go to ``files/<run_id>/`` as well."""
    run_id = plan.run_id(k)
    with contextlib.ExitStack() as stack:
        inputs = rollouts = None
        if k in plan.compare:
            folder = files / run_id
            folder.mkdir(parents=True)
            inputs = stack.enter_context(open(folder / f"{STEM}_materialized_inputs.jsonl", "wb"))
            rollouts = stack.enter_context(open(folder / f"{STEM}.jsonl", "wb"))
        for chunk in _chunks(input_events(plan, run_id, inputs)):
            await sender.send_many(topics.inputs, chunk)
        started = RunStarted(run_id=run_id, expected_rollouts=plan.per_run, output_stem=STEM)
        await sender.send(topics.control, encode(started), run_id.encode())
        await sender.flush()
        for chunk in _chunks(rollout_events(plan, k, rollouts)):
            await sender.send_many(topics.rollouts, chunk)
        await sender.send(topics.control, encode(RunFinished(run_id=run_id)), run_id.encode())
        await sender.flush()


# -- watching the processor ---------------------------------------------------------------------
def _dir_mib(folder: Path | None) -> float:
    if folder is None:
        return 0.0
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512  # on disk
    return total / (1 << 20)


def _runs(processor: Processor, timeout: float = 120.0) -> Runs:
    """The processor's ``/runs``, waiting while it does not answer (a final profile being
    built keeps its event loop busy for seconds)."""
    deadline = time.monotonic() + timeout
    while not (runs := processor.runs()):
        if processor.proc.poll() is not None or time.monotonic() > deadline:
            raise SoakError("the processor does not answer /runs")
        time.sleep(0.1)
    return runs


class Sampler:
    """Every second: the processor's RSS (its process tree), what it has consumed (``/runs``,
    polled by a second thread, so a busy processor delays no RSS sample), the load average
    and the broker's log size; appended to ``csv`` as it goes."""

    def __init__(self, processor: Processor, csv: Path, broker_dir: Path | None) -> None:
        self.processor, self.csv, self.broker_dir = processor, csv, broker_dir
        self.samples: list[Sample] = []
        self.halt = threading.Event()
        self.started_at = time.monotonic()
        self._counts = (0, 0, 0)  # rollouts, inputs, runs done: as last answered
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._rss, self._poll)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.halt.set()
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()

    def _poll(self) -> None:
        while not self.halt.wait(0.5):
            runs = self.processor.runs().values()
            if runs:
                self._counts = (
                    sum(cast(int, r["rollouts"]) for r in runs),
                    sum(cast(int, r["inputs"]) for r in runs),
                    sum(1 for r in runs if r["done"]),
                )

    def _rss(self) -> None:
        with open(self.csv, "w", buffering=1) as fh:
            fh.write(",".join(Sample._fields) + "\n")
            while not self.halt.is_set():
                sample = Sample(
                    round(time.monotonic() - self.started_at, 2),
                    round(tree_rss_kb(self.processor.proc.pid) / 1024, 1),
                    *self._counts,
                    os.getloadavg()[0],
                    round(_dir_mib(self.broker_dir), 1),
                )
                self.samples.append(sample)
                fh.write(",".join(map(str, sample)) + "\n")
                self.halt.wait(1.0)


@dataclass
class Checker:
    """Notices each final profile (its mirror in the processor's --output-dir: the three
    files are renamed in place in order, so the last one says all are), checks it and frees
    its disk."""

    plan: Plan
    out: Path
    processor: Processor
    started: float = field(default_factory=time.monotonic)
    done_at: dict[int, float] = field(default_factory=dict)  # run -> seconds since start
    last: float = field(default_factory=time.monotonic)

    def poll(self, published: int) -> None:
        for k in range(published):
            mirror = ProfilePaths.next_to(self.out / self.plan.run_id(k) / f"{STEM}.jsonl")
            if k not in self.done_at and mirror.repeat_level_metrics.exists():
                self.check(k)
                self.done_at[k] = time.monotonic() - self.started
                self.last = time.monotonic()
        if self.processor.proc.poll() is not None:
            raise SoakError(f"the processor exited with {self.processor.proc.returncode}")
        if time.monotonic() - self.last > STALL_S:
            raise SoakError(f"no run finished for {STALL_S:.0f} s; runs: {_runs(self.processor)}")

    def check(self, k: int) -> None:
        run_id, plan = self.plan.run_id(k), self.plan
        paths = ProfilePaths.next_to(self.out / run_id / f"{STEM}.jsonl")
        data = paths.reward_profiling.read_bytes()
        n = plan.repeats
        full = b'"num_rollouts":%d,"expected_num_rollouts":%d,"missing_num_rollouts":0,' % (n, n)
        tasks = [int(t) for t in re.findall(rb'^\{"_ng_task_index":(\d+),', data, re.M)]
        if tasks != list(range(plan.tasks)) or data.count(full) != plan.tasks:
            raise SoakError(f"{run_id}: the final profile lacks tasks or rollouts")
        seen = _runs(self.processor).get(run_id, {})
        counts = [
            seen.get(x) for x in ("rollouts", "inputs", "expected_rollouts", "duplicates_dropped")
        ]
        if counts != [plan.per_run, plan.per_run, plan.per_run, 0]:
            raise SoakError(f"{run_id}: the processor reports {seen}")
        if k not in plan.compare:
            for path in paths:
                path.unlink()

    async def wait(self, done: int, published: int) -> None:
        """Until ``done`` runs are profiled, of the first ``published``."""
        while len(self.done_at) < done:
            self.poll(published)
            await asyncio.sleep(0.25)


async def feed(plan: Plan, bootstrap: str, topics: Topics, checker: Checker, files: Path) -> None:
    """Publish the runs, at most ``plan.ahead`` of them not yet profiled; then wait for all."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=10,
        max_batch_size=1 << 19,
        max_request_size=MAX_MESSAGE_BYTES,
    )
    await producer.start()
    try:
        sender = Sender(producer)
        for k in range(plan.runs):
            await checker.wait(k - plan.ahead + 1, k)
            await publish_run(sender, topics, plan, k, files)
            print(f"{time.monotonic() - checker.started:7.1f} s  published {plan.run_id(k)}")
        await sender.settle()
    finally:
        await producer.stop()
    await checker.wait(plan.runs, plan.runs)


# -- the soak -------------------------------------------------------------------------------
def compare_with_batch(plan: Plan, out: Path, files: Path) -> list[str]:
    """``ng_reward_profile`` on each compared run's files: the runs whose three files equal
    the stream processor's byte for byte (a difference raises)."""
    equal = []
    for k in sorted(plan.compare):
        run_id = plan.run_id(k)
        folder = files / run_id
        config = ProfileConfig(
            materialized_inputs_jsonl_fpath=folder / f"{STEM}_materialized_inputs.jsonl",
            rollouts_jsonl_fpath=folder / f"{STEM}.jsonl",
            quiet=True,
        )
        run_profile(config)
        for name in (f"{STEM}{suffix}" for suffix in OUTPUT_SUFFIXES):
            if (folder / name).read_bytes() != (out / run_id / name).read_bytes():
                raise SoakError(f"{run_id}: {name} differs from ng_reward_profile's")
        equal.append(run_id)
    return equal


def _proc_status(pid: int, field_name: str) -> float:
    """A ``kB`` field of /proc/<pid>/status, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field_name}:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) / 1024 if m else 0.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"^Model name:\s*(.+)$", out, re.M)
    return f"{m.group(1).strip() if m else '?'}, {os.cpu_count()} vCPUs"


def per_run(samples: list[Sample], done_at: dict[int, float]) -> list[dict[str, float]]:
    """For each run, the processor's RSS between the previous run's final profile and its own:
    peak (while it was consumed and profiled) and trough (after the previous eviction)."""
    rows, since = [], 0.0
    for k in sorted(done_at):
        until = done_at[k]
        window = [s.rss_mib for s in samples if since < s.t <= until + 1.0] or [0.0]
        rows.append({"run": k, "done_s": round(until, 1), "peak_mib": max(window)})
        rows[-1]["trough_mib"] = min(window)
        since = until
    return rows


def soak(
    plan: Plan,
    bootstrap: str,
    work: Path,
    results: Path,
    broker_dir: Path | None = None,
    idle_s: float = 10.0,
) -> dict[str, Any]:
    """Run the soak against ``bootstrap``, then sample ``idle_s`` seconds more (every run
    evicted); returns the summary (raises :class:`SoakError`)."""
    prefix = f"soak-{os.getpid()}-{int(time.time())}"
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(bootstrap, topics, plan.partitions))
    out, files = work / "out", work / "files"
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    processor = Processor(bootstrap, prefix, out, work / "processor.log", checkpoint_every=5.0)
    sampler: Sampler | None = None
    try:
        deadline = time.monotonic() + 120
        while not processor.units():
            if processor.proc.poll() is not None or time.monotonic() > deadline:
                raise SoakError("the processor never got its partitions")
            time.sleep(0.2)
        load_before = os.getloadavg()
        sampler = Sampler(processor, results / "soak-memory.csv", broker_dir)
        checker = Checker(plan, out, processor, started=sampler.started_at)
        sampler.start()
        asyncio.run(feed(plan, bootstrap, topics, checker, files))
        wall = time.monotonic() - sampler.started_at
        time.sleep(idle_s)
        peak_mib = _proc_status(processor.proc.pid, "VmHWM")
        cpu_s = _cpu_seconds(processor.proc.pid)
        sampler.stop()
        processor.kill(signal.SIGTERM)
        if processor.proc.returncode != 0:
            raise SoakError(f"the processor exited with {processor.proc.returncode} on SIGTERM")
    except BaseException:
        log = (work / "processor.log").read_text(errors="replace")[-3000:]
        print(f"--- processor log (tail)\n{log}", file=sys.stderr)
        raise
    finally:
        if sampler is not None:
            sampler.stop()
        if processor.proc.poll() is None:
            processor.kill(signal.SIGKILL)
    equal = compare_with_batch(plan, out, files)
    samples = sampler.samples
    rss = [s.rss_mib for s in samples]
    runs = per_run(samples, checker.done_at)
    quarter = max(1, plan.runs // 4)
    early = max(r["peak_mib"] for r in runs[quarter : 2 * quarter] or runs)
    late = max(r["peak_mib"] for r in runs[-quarter:])
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _cpu_model(),
        "load_before": [round(x, 2) for x in load_before],
        "load_during_mean": round(float(np.mean([s.load1 for s in samples])), 2),
        "rollouts": plan.runs * plan.per_run,
        "runs": plan.runs,
        "tasks_per_run": plan.tasks,
        "repeats": plan.repeats,
        "partitions": plan.partitions,
        "wall_s": round(wall, 1),
        "rollouts_per_s": round(plan.runs * plan.per_run / wall),
        "processor_cpu_s": round(cpu_s, 1),
        "rss_mib": {"min": min(rss), "max": max(rss), "final": rss[-1], "peak_vmhwm": peak_mib},
        "peak_growth_mib": round(late - early, 1),  # last quarter's peak minus the second's
        "steady": late <= early * 1.1 + 32,
        "broker_log_max_mib": max(s.broker_mib for s in samples),
        "equal_to_batch": equal,
        "per_run": runs,
    }
    (results / "soak-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(samples, plan, summary, results / "soak-memory.png")
    return summary


def plot(samples: list[Sample], plan: Plan, summary: dict[str, Any], png: Path) -> None:
    """RSS against rollouts consumed and against time (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return
    t = [s.t for s in samples]
    rss = [s.rss_mib for s in samples]
    consumed = [s.rollouts / 1e6 for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), constrained_layout=True)
    for k in range(1, plan.runs):
        top.axvline(k * plan.per_run / 1e6, color="0.88", linewidth=0.8)
    top.plot(consumed, rss, color="tab:blue", linewidth=1)
    top.set_xlabel("rollouts consumed (millions; grey lines: run boundaries)")
    top.set_ylabel("processor RSS (MiB)")
    top.set_ylim(bottom=0)
    top.set_title(
        f"rewardstream stream, {summary['rollouts']:,} rollouts in {plan.runs} runs of "
        f"{plan.tasks:,} tasks x {plan.repeats}, real Kafka broker ({summary['date']})"
    )
    bottom.plot(t, rss, color="tab:blue", linewidth=1, label="RSS (MiB)")
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("processor RSS (MiB)")
    bottom.set_ylim(bottom=0)
    twin = bottom.twinx()
    twin.plot(t, consumed, color="tab:orange", linewidth=1, label="rollouts consumed (M)")
    twin.set_ylabel("rollouts consumed (millions)")
    twin.set_ylim(bottom=0)
    bottom.legend(loc="upper left")
    twin.legend(loc="lower right")
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so every finally stops what it started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=10_000_000, help="in all (10,000,000)")
    ap.add_argument("--runs", type=int, default=20, help="collections, one after another (20)")
    ap.add_argument("--repeats", type=int, default=5, help="rollouts per task (5)")
    ap.add_argument("--partitions", type=int, default=2, help="per data topic (2)")
    ap.add_argument("--ahead", type=int, default=2, help="runs published, not yet profiled (2)")
    ap.add_argument("--compare", default="first,middle,last", help="runs checked against batch")
    ap.add_argument("--results", type=Path, default=Path("bench/out/soak"))
    ap.add_argument("--bootstrap", default=None, help="an existing broker (retention: yours)")
    a = ap.parse_args()
    tasks = a.rollouts // (a.runs * a.repeats)
    named = {"first": 0, "middle": a.runs // 2, "last": a.runs - 1}
    compare = frozenset(named[x] if x in named else int(x) for x in a.compare.split(",") if x)
    plan = Plan(a.runs, tasks, a.repeats, a.partitions, a.ahead, compare)
    signal.signal(signal.SIGTERM, _interrupted)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rs-soak-")))
        broker_dir = None
        bootstrap = a.bootstrap
        if bootstrap is None:
            broker = stack.enter_context(LocalBroker(extra_properties=RETENTION))
            bootstrap, broker_dir = broker.bootstrap, broker.workdir
        try:
            summary = soak(plan, bootstrap, work, a.results, broker_dir)
        except SoakError as exc:
            raise SystemExit(f"soak failed: {exc}") from None
    print(json.dumps({k: v for k, v in summary.items() if k != "per_run"}, indent=1))
    for row in summary["per_run"]:
        print(
            f"  run {row['run']:3d}: done at {row['done_s']:7.1f} s, RSS peak "
            f"{row['peak_mib']:7.1f} MiB, trough {row['trough_mib']:7.1f} MiB"
        )
    if not summary["steady"]:
        raise SystemExit("memory was not steady (see peak_growth_mib)")


if __name__ == "__main__":
    main()
