"""Benchmark ``rewardstream publish`` against a real broker: rollouts per second.

    python -m bench.publish_bench [--data /tmp/pubbench/r] [--bootstrap HOST:PORT] [--runs 3]

Publishes ``<data>_materialized_inputs.jsonl`` and ``<data>.jsonl`` (generated with
bench/generate.py when missing: ``--tasks``/``--repeats``) to fresh topics per run. Without
``--bootstrap`` it starts its own broker (:class:`rewardstream.kafka.local.LocalBroker`) and
also reports the broker's CPU time, since on a small machine the broker competes with the
publisher for the same cores. Publisher CPU counts its encoder processes too (shown apart).

The overall rate counts the whole publish (inputs included, acknowledgements awaited). Each run
is followed by the parse floor (:func:`bench.profile_bench.floor`: one process ``orjson.loads``
every line of both files) and reported as a ratio to it: whatever publishes a line parses it. A run
with an empty rollouts file measures the inputs alone; the rollouts-phase rate divides by the
difference. Warm-up runs (not reported) let the broker's JIT settle, as a long-lived broker has.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.profile_bench import floor
from rewardstream.contract.events import Topics
from rewardstream.kafka.local import LocalBroker
from rewardstream.producers.publisher.publish import PublishReport, publish_files

HERE = Path(__file__).resolve().parent


def _children_cpu() -> float:
    """User + system CPU of this process's reaped children (the publisher's encoders)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its reaped children so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _run(inputs: Path, rollouts: Path, bootstrap: str) -> PublishReport:
    topics = Topics.for_prefix(f"bench-{uuid.uuid4().hex[:8]}")
    return asyncio.run(publish_files(inputs, rollouts, bootstrap, topics=topics))


class _Meter:
    """Wall, publisher CPU and (when we own it) broker CPU of one publish."""

    def __init__(self, broker: LocalBroker | None) -> None:
        self.pid = broker.pid if broker else None

    def run(self, inputs: Path, rollouts: Path, bootstrap: str) -> tuple[PublishReport, str]:
        load = os.getloadavg()[0]
        broker_cpu = _cpu_seconds(self.pid) if self.pid else 0.0
        cpu, encoders = time.process_time(), _children_cpu()
        report = _run(inputs, rollouts, bootstrap)
        cpu, encoders = time.process_time() - cpu, _children_cpu() - encoders
        text = f"publisher cpu {cpu + encoders:.1f} s ({encoders:.1f} s in encoders)"
        if self.pid:
            text += f", broker cpu {_cpu_seconds(self.pid) - broker_cpu:.1f} s"
        return report, f"{text}; load before {load:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/pubbench/r"), help="file stem")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unreported full runs first")
    a = ap.parse_args()
    rollouts = a.data.with_name(a.data.name + ".jsonl")
    inputs = a.data.with_name(a.data.name + "_materialized_inputs.jsonl")
    if not rollouts.exists():
        a.data.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(HERE / "generate.py"), "--tasks", str(a.tasks)]
        cmd += ["--repeats", str(a.repeats), "--out", str(a.data)]
        subprocess.run(cmd, check=True)
    size = (rollouts.stat().st_size + inputs.stat().st_size) / 1e6
    print(f"data: {rollouts} + inputs, {size:.0f} MB; {os.cpu_count()} cores")
    with contextlib.ExitStack() as stack:
        broker: LocalBroker | None = None
        bootstrap = a.bootstrap
        if bootstrap is None:
            broker = stack.enter_context(LocalBroker())
            bootstrap = broker.bootstrap
        meter = _Meter(broker)
        for _ in range(a.warmup):
            _run(inputs, rollouts, bootstrap)
        empty = Path(stack.enter_context(tempfile.TemporaryDirectory())) / rollouts.name
        empty.touch()
        alone, usage = meter.run(inputs, empty, bootstrap)
        print(
            f"inputs alone: {alone.inputs_sent} in {alone.seconds:.2f} s = "
            f"{alone.inputs_sent / alone.seconds:,.0f}/s; {usage}"
        )
        for i in range(a.runs):
            r, usage = meter.run(inputs, rollouts, bootstrap)
            phase = r.rollouts_sent / max(r.seconds - alone.seconds, 1e-9)
            parse = floor(inputs, rollouts).wall_s
            print(
                f"run {i + 1}: {r.rollouts_sent} rollouts + {r.inputs_sent} inputs in "
                f"{r.seconds:.2f} s = {r.rollouts_sent / r.seconds:,.0f} rollouts/s overall "
                f"({(r.rollouts_sent + r.inputs_sent) / r.seconds:,.0f} events/s), "
                f"rollouts phase ~{phase:,.0f}/s; {usage}; parse floor {parse:.2f} s, "
                f"ratio {r.seconds / parse:.2f}"
            )


if __name__ == "__main__":
    main()
