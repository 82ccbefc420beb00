"""A run's lifecycle as users meet it, end to end through a real broker and processor: a slow
model under ``publish --follow`` never gets a partial "final", and a second collection written
to the same path is a run of its own."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rewardstream.commands.cli import main
from rewardstream.contract.events import RunStarted, Topics, encode
from tests.golden import assert_batch_files, generated_collection
from tests.processes import Processor, Runs, make_topics, send_events

pytestmark = pytest.mark.kafka

PAUSE_S = 45.0  # longer than the 30 s idle timeout that used to end a followed run


@pytest.fixture
def lone(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> tuple[str, Processor]:
    """A topic prefix and one processor owning its two partitions."""
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 2))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    p.wait(lambda _: len(p.units()) == 4)
    return prefix, p


def _done(run_id: str) -> Callable[[Runs], bool]:
    return lambda runs: runs.get(run_id, {}).get("done") is True


def _get(bootstrap: str, prefix: str, run_id: str, out: Path) -> None:
    argv = ["profiles", "get", "--bootstrap", bootstrap, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", run_id, "--out", str(out), "--timeout", "60"]) == 0


def test_a_pause_longer_than_the_old_idle_timeout_keeps_the_run_open(
    kafka_bootstrap: str, lone: tuple[str, Processor], tmp_path: Path
) -> None:
    prefix, processor = lone
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=40, repeats=3, seed=31)
    live = tmp_path / "live"
    live.mkdir()
    (live / inputs.name).write_bytes(inputs.read_bytes())
    lines = rollouts.read_bytes().splitlines(keepends=True)
    (live / "r.jsonl").write_bytes(b"".join(lines[:60]))
    cmd = [sys.executable, "-m", "rewardstream.commands.cli", "publish", "--follow", "--quiet"]
    cmd += ["--inputs", str(live / inputs.name), "--rollouts", str(live / "r.jsonl")]
    cmd += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "slow"]
    publisher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        processor.wait(lambda runs: runs.get("slow", {}).get("rollouts") == 60)
        time.sleep(PAUSE_S)  # the model is slow: nothing new for 45 s
        run = processor.runs()["slow"]
        assert (run["finished"], run["done"], publisher.poll()) == (False, False, None)
        with (live / "r.jsonl").open("ab") as fh:
            fh.writelines(lines[60:])
        out, err = publisher.communicate(timeout=60)
    finally:
        if publisher.poll() is None:
            publisher.kill()
    assert publisher.returncode == 0, err
    assert b"published run_id=slow inputs=120 rollouts=120" in out
    processor.wait(lambda runs: runs.get("slow", {}).get("done") is True)
    _get(kafka_bootstrap, prefix, "slow", tmp_path / "final")
    assert_batch_files(tmp_path / "final", inputs.parent)


def test_a_second_collection_at_the_same_path_is_a_new_run(
    kafka_bootstrap: str,
    lone: tuple[str, Processor],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix, processor = lone
    at = tmp_path / "collection"
    finals = []
    for seed, tasks in ((41, 30), (42, 25)):  # the second collection rewrites both files
        data, _ = generated_collection(tmp_path / f"seed{seed}", tasks=tasks, repeats=2, seed=seed)
        at.mkdir(exist_ok=True)
        for name in ("r_materialized_inputs.jsonl", "r.jsonl"):
            target = at / name
            target.unlink(missing_ok=True)  # a new file, as the collector writes it
            target.write_bytes((data.parent / name).read_bytes())
        argv = ["publish", "--inputs", str(at / "r_materialized_inputs.jsonl")]
        argv += ["--rollouts", str(at / "r.jsonl"), "--bootstrap", kafka_bootstrap]
        assert main([*argv, "--topic-prefix", prefix, "--quiet"]) == 0
        found = re.search(r"published run_id=(\S+)", capsys.readouterr().out)
        assert found is not None
        run_id = found.group(1)
        processor.wait(_done(run_id))
        _get(kafka_bootstrap, prefix, run_id, tmp_path / f"final-{seed}")
        assert_batch_files(tmp_path / f"final-{seed}", data.parent)
        finals.append(run_id)
    assert finals[0] != finals[1]


def test_a_member_with_no_partition_says_so(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """One partition per topic and two members: the idle one warns instead of sitting there
    silently (the local broker used to create every topic with one partition)."""
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 1))
    log = tmp_path / "processors.log"
    members = [Processor(kafka_bootstrap, prefix, tmp_path / "out", log) for _ in range(2)]
    processors.extend(members)
    deadline = time.monotonic() + 60
    while "owns no partition" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    assert "has more members than the data topics have partitions (1)" in log.read_text()


def test_profiles_get_says_at_once_that_no_such_run_was_published_and_names_an_open_one(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A mistyped run id is said before the timeout, not after it as if the run were open; an
    open run is named as one."""
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    started = encode(RunStarted(run_id="open", expected_rollouts=4, output_stem="r"))
    send_events(kafka_bootstrap, topics, [("control", started)], "open")
    argv = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    out = tmp_path / "get"
    begun = time.monotonic()
    assert main([*argv, "--run-id", "nope", "--out", str(out), "--timeout", "600"]) == 2
    assert time.monotonic() - begun < 300  # long before the timeout, on any machine
    err = capsys.readouterr().err
    assert f"no run 'nope' under the topic prefix '{prefix}'" in err, err
    assert main([*argv, "--run-id", "open", "--out", str(out), "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "run 'open' has no final profile yet" in err and "still open after 1 s" in err, err
    assert not out.exists()
