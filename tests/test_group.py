"""Several processors in one consumer group, as real processes: they split the partitions,
snapshots and the final profile merge every unit's part, and a member killed with ``kill -9``
and brought back loses and double-counts nothing."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import orjson
import pytest

from rewardstream.commands.cli import main
from rewardstream.contract.events import Topics
from tests.golden import (
    assert_batch_files,
    file_events,
    generated_collection,
    partial_batch_profile,
)
from tests.processes import Processor, Runs, make_topics, send_events

pytestmark = pytest.mark.kafka

PARTITIONS = 4


def _health(p: Processor) -> dict[str, object]:
    """The member's ``/healthz`` (leader, owned units), or {} while it is starting."""
    try:
        with urllib.request.urlopen(f"{p.url}/healthz", timeout=5) as r:
            body = orjson.loads(r.read())
    except OSError:
        return {}
    assert isinstance(body, dict)
    return body


def _rejected(p: Processor, reason: str) -> int:
    """The member's dead letters of ``reason``, from its ``/metrics``."""
    with urllib.request.urlopen(f"{p.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("rewardstream_events_rejected_total{") and f'reason="{reason}"' in line
    )


def _done(run_id: str) -> Callable[[Runs], bool]:
    return lambda runs: runs.get(run_id, {}).get("done") is True


class Group(NamedTuple):
    prefix: str
    topics: Topics
    members: list[Processor]
    out: Path
    log: Path


@pytest.fixture
def start_group(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> Callable[[], Group]:
    """Factory: fresh topics and two processors of one group, once both own partitions."""

    def start() -> Group:
        prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processors.log"
        topics = Topics.for_prefix(prefix)
        asyncio.run(make_topics(kafka_bootstrap, topics, PARTITIONS))
        members = [Processor(kafka_bootstrap, prefix, out, log) for _ in range(2)]
        processors.extend(members)

        def split() -> bool:
            units = [set(_health(p).get("units") or ()) for p in members]  # type: ignore[call-overload]
            return all(units) and len(set.union(*units)) == 2 * PARTITIONS

        for p in members:
            p.wait(lambda _: split())
        return Group(prefix, topics, members, out, log)

    return start


def test_two_processors_split_partitions_and_write_the_batch_profile(
    kafka_bootstrap: str, tmp_path: Path, start_group: Callable[[], Group]
) -> None:
    inputs, rollouts = generated_collection(
        tmp_path / "data", tasks=5000, repeats=4, seed=5
    )  # 20,000 rollouts
    prefix, _, group, out, log = start_group()
    assert sorted(bool(_health(p)["leader"]) for p in group) == [False, True]

    argv = ["publish", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    argv += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "run"]
    assert main([*argv, "--quiet"]) == 0
    for p in group:  # the non-leader learns it from the final mark
        p.wait(_done("run"))
    assert_batch_files(out / "run", inputs.parent)

    # exactly one final profile, on the leader's disk and in Kafka
    fetched = tmp_path / "fetched"
    argv_get = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    assert main([*argv_get, "--run-id", "run", "--out", str(fetched), "--timeout", "30"]) == 0
    assert_batch_files(fetched, inputs.parent)

    # republishing the same files changes nothing: the run's final holds their content, so
    # nothing is sent; events that still come after it (a race, another producer) are dead
    # letters (run-final)
    assert main([*argv, "--quiet"]) == 0
    assert sum(_rejected(p, "run-final") for p in group) == 0
    late = file_events(inputs, rollouts, "run", "r", finish=False)[:100]
    send_events(kafka_bootstrap, Topics.for_prefix(prefix), late, "run")

    def parked(_: Runs) -> bool:
        return sum(_rejected(p, "run-final") for p in group) == 100

    group[0].wait(parked)
    assert_batch_files(out / "run", inputs.parent)

    # any member's snapshot merges both members' parts: here, the whole run
    follower = next(p for p in group if not _health(p)["leader"])
    snap = tmp_path / "snap"
    argv = ["snapshot", "--url", follower.url, "--run-id", "run", "--out", str(snap)]
    assert main(argv) == 0
    assert_batch_files(snap, inputs.parent)
    for p in group:
        p.kill(signal.SIGTERM)
        assert p.proc.returncode == 0, log.read_text()[-2000:]


def test_member_killed_and_brought_back_counts_every_rollout_once(
    kafka_bootstrap: str,
    tmp_path: Path,
    processors: list[Processor],
    start_group: Callable[[], Group],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=500, repeats=4, seed=5)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    thirds = [n_in + i * (len(events) - n_in - 1) // 3 for i in (1, 2)]  # RunStarted is last
    prefix, topics, group, out, log = start_group()
    send_events(kafka_bootstrap, topics, events[: thirds[0]], "run")
    group[0].wait(lambda runs: runs.get("run", {}).get("rollouts") == thirds[0] - n_in)
    group[1].kill(signal.SIGKILL)  # its partitions move to the survivor, rebuilt from Kafka
    send_events(kafka_bootstrap, topics, events[thirds[0] : thirds[1]], "run")
    back = Processor(kafka_bootstrap, prefix, out, log)  # rejoins: a second rebalance
    processors.append(back)
    send_events(kafka_bootstrap, topics, events[thirds[1] :], "run")
    for p in (group[0], back):
        p.wait(_done("run"))
    assert_batch_files(out / "run", inputs.parent)
    runs = {**group[0].runs()["run"]}
    assert runs["rollouts"] == runs["expected_rollouts"] == 2000


def test_snapshot_mid_run_merges_the_members_parts(
    kafka_bootstrap: str, tmp_path: Path, start_group: Callable[[], Group]
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=300, repeats=2, seed=5)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    consumed = 250
    _, topics, group, _, _ = start_group()
    send_events(kafka_bootstrap, topics, [*events[: n_in + consumed], events[-1]], "run")
    for p in group:  # member records say at once what each holds, so each sees the other's share
        p.wait(lambda runs: runs.get("run", {}).get("rollouts") == consumed)
        p.wait(lambda runs: runs["run"]["expected_rollouts"] is not None)  # RunStarted read

    snap = tmp_path / "snap"
    assert main(["snapshot", "--url", group[1].url, "--run-id", "run", "--out", str(snap)]) == 0
    lines = rollouts.read_bytes().splitlines(keepends=True)[:consumed]
    partial_batch_profile(inputs, lines, tmp_path / "batch", "r")
    assert_batch_files(snap, tmp_path / "batch")
