"""``kill -9`` of a real processor process mid-run, then a restart: same files as no fault."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.generate import generate
from rewardstream.cli import ng_reward_profile
from rewardstream.contract import Topics
from tests.golden import OUTPUT_SUFFIXES, file_events
from tests.processes import Processor, committed, send_events

pytestmark = pytest.mark.kafka


def test_kill_9_mid_run_then_restart(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    data = tmp_path / "data"
    generate(tasks=250, repeats=4, out=data / "r", text_bytes=200, seed=3)
    inputs, rollouts = data / "r_materialized_inputs.jsonl", data / "r.jsonl"
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    body = events[: n_in + 1000]
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)

    first = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(first)
    send_events(kafka_bootstrap, topics, body[: n_in + 600], "run")
    first.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)
    committed(kafka_bootstrap, f"{prefix}-profiler", topics.rollouts)  # a commit covers some
    send_events(kafka_bootstrap, topics, body[n_in + 600 :], "run")
    first.kill(signal.SIGKILL)  # mid-consumption of the last 400

    second = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(second)
    send_events(kafka_bootstrap, topics, events[n_in + 1000 :], "run")
    second.wait(lambda runs: runs.get("run", {}).get("done") is True)
    second.kill(signal.SIGTERM)
    assert second.proc.returncode == 0, log.read_text()[-2000:]

    assert (
        ng_reward_profile(
            [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
        )
        == 0
    )
    for suffix in OUTPUT_SUFFIXES:
        assert (out / "run" / f"r{suffix}").read_bytes() == (data / f"r{suffix}").read_bytes(), (
            suffix
        )
