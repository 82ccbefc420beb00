"""Processors as separate hosts: each in a mount namespace of its own with a private disk
(docs/engine-on-kafka.md §Several hosts on one machine), sharing nothing but the broker. Exactly
one final profile, byte-identical to batch, from ``rewardstream profiles get``; snapshots from
either member cover the whole run; a member lost with its disk is rebuilt from Kafka."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from rewardstream.commands.cli import main
from rewardstream.contract.events import Topics
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.sinks.topics.profiles import ensure_topics
from tests.golden import (
    assert_batch_files,
    file_events,
    generated_collection,
    partial_batch_profile,
)
from tests.processes import Processor, Runs, make_topics, run_detail, send_events

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(os.geteuid() != 0, reason="private mounts need root (unshare -m)"),
]

PARTITIONS = 4


def _units(p: Processor) -> set[str]:
    try:
        with urllib.request.urlopen(f"{p.url}/healthz", timeout=5) as r:
            return set(orjson.loads(r.read()).get("units") or ())
    except OSError:
        return set()


def _start(
    bootstrap: str,
    prefix: str,
    tmp_path: Path,
    names: list[str],
    processors: list[Processor],
    others: tuple[Processor, ...] = (),
) -> list[Processor]:
    """Members on private disks, once they and ``others`` own every partition together."""
    log = tmp_path / "processors.log"
    members = [
        Processor(bootstrap, prefix, tmp_path / "unused", log, private_disk=tmp_path / name)
        for name in names
    ]
    processors.extend(members)
    for p in members:
        p.wait(
            lambda _: len(set.union(*(_units(m) for m in [*members, *others]))) == 2 * PARTITIONS
        )
    return members


def _owns_every_partition(p: Processor) -> Callable[[Runs], bool]:
    """The lone member of its group: both topics' two partitions are its."""
    return lambda _: len(_units(p)) == 4


def _done(run_id: str) -> Callable[[Runs], bool]:
    return lambda runs: runs.get(run_id, {}).get("done") is True


def _get(bootstrap: str, prefix: str, out: Path) -> None:
    argv = ["profiles", "get", "--bootstrap", bootstrap, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", "run", "--out", str(out), "--timeout", "60"]) == 0


def test_two_hosts_write_exactly_one_final_equal_to_batch(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=2000, repeats=4, seed=11)
    prefix = unique_name("rs")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), PARTITIONS))
    a, b = _start(kafka_bootstrap, prefix, tmp_path, ["a", "b"], processors)
    assert not (tmp_path / "a" / "state").exists()  # private: not on this host's disk

    pub = tmp_path / "pub"  # the collection's folder as a NeMo Gym user has it
    pub.mkdir()
    for path in (inputs, rollouts):
        shutil.copy(path, pub / path.name)
    argv = ["publish", "--inputs", str(pub / inputs.name), "--rollouts", str(pub / rollouts.name)]
    argv += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "run"]
    assert main([*argv, "--quiet", "--wait-profile", "--wait-timeout", "60"]) == 0
    assert_batch_files(pub, inputs.parent)  # where ng_reward_profile would have put them
    for p in (a, b):
        p.wait(_done("run"))
    _get(kafka_bootstrap, prefix, tmp_path / "final")
    assert_batch_files(tmp_path / "final", inputs.parent)
    mirrors = [p for p in (a, b) if p.seen(tmp_path / p.disk.name / "out" / "run").exists()]  # type: ignore[union-attr]
    assert len(mirrors) == 1  # written once, by the leader, on its own disk
    assert main(["profiles", "list", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]) == 0
    for p in (a, b):  # a done run's snapshot from any member is its final
        snap = tmp_path / f"snap-{id(p)}"
        assert main(["snapshot", "--url", p.url, "--run-id", "run", "--out", str(snap)]) == 0
        assert_batch_files(snap, inputs.parent)
    for p in (a, b):
        p.kill(signal.SIGTERM)
        assert p.proc.returncode == 0


def test_snapshots_cover_every_partition_and_a_lost_host_is_rebuilt_from_kafka(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=400, repeats=3, seed=12)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    consumed = 500
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, PARTITIONS))
    a, b = _start(kafka_bootstrap, prefix, tmp_path, ["a", "b"], processors)
    send_events(kafka_bootstrap, topics, [*events[: n_in + consumed], events[-1]], "run")
    for p in (a, b):
        p.wait(lambda runs: runs.get("run", {}).get("rollouts") == consumed)
        p.wait(lambda runs: runs["run"]["expected_rollouts"] is not None)  # RunStarted read
    lines = rollouts.read_bytes().splitlines(keepends=True)[:consumed]
    partial_batch_profile(inputs, lines, tmp_path / "batch", "r")
    for p in (a, b):  # either member answers for the whole run
        snap = tmp_path / f"snap-{id(p)}"
        assert main(["snapshot", "--url", p.url, "--run-id", "run", "--out", str(snap)]) == 0
        assert_batch_files(snap, tmp_path / "batch")

    b.kill(signal.SIGKILL)  # pod lost with its disk: its tmpfs goes with its namespace
    (c,) = _start(kafka_bootstrap, prefix, tmp_path, ["c"], processors, (a,))
    send_events(kafka_bootstrap, topics, events[n_in + consumed : -1], "run")
    for p in (a, c):
        p.wait(_done("run"))
    _get(kafka_bootstrap, prefix, tmp_path / "final")
    assert_batch_files(tmp_path / "final", inputs.parent)


def test_two_groups_and_two_prefixes_never_read_each_others_state(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Two groups profile one prefix side by side, each to exactly one final of its own; a
    second prefix with the same run id gets its own; an ``--output-dir`` already holding
    another group's finals is refused with one line."""
    first, _ = generated_collection(tmp_path / "one", tasks=150, repeats=2, seed=21)
    other, _ = generated_collection(tmp_path / "two", tasks=120, repeats=3, seed=22)
    prefixes = [unique_name("rs"), unique_name("rs")]
    for prefix in prefixes:
        asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 2))
    log, out = tmp_path / "processors.log", tmp_path / "out"
    members = [
        Processor(kafka_bootstrap, prefixes[0], out, log, extra=["--group-id", "g1"]),
        Processor(kafka_bootstrap, prefixes[0], tmp_path / "out2", log, extra=["--group-id", "g2"]),
        Processor(kafka_bootstrap, prefixes[1], tmp_path / "out3", log),
    ]
    processors.extend(members)
    for p in members:
        p.wait(_owns_every_partition(p))
    for prefix, data in zip(prefixes, (first, other), strict=True):
        argv = ["publish", "--inputs", str(data), "--rollouts", str(data.parent / "r.jsonl")]
        argv += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "run"]
        assert main([*argv, "--quiet"]) == 0
    for p in members:
        p.wait(_done("run"))
    for group, data in (("g1", first), ("g2", first)):
        got = tmp_path / f"get-{group}"
        argv = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefixes[0]]
        argv += ["--group-id", group, "--run-id", "run", "--out", str(got)]
        assert main(argv) == 0
        assert_batch_files(got, data.parent)
    _get(kafka_bootstrap, prefixes[1], tmp_path / "get-other")
    assert_batch_files(tmp_path / "get-other", other.parent)
    assert_batch_files(out / "run", first.parent)
    assert_batch_files(tmp_path / "out3" / "run", other.parent)

    intruder = Processor(kafka_bootstrap, prefixes[1], out, log)  # g1's folder
    processors.append(intruder)
    assert intruder.proc.wait(60) == 2
    assert f"--output-dir {out} holds the final profiles of group 'g1'" in log.read_text()


def test_a_processor_refuses_state_of_a_format_it_does_not_read(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A member record of a newer format in the group's topics: the older processor stops with
    one line instead of loading it (mixed versions cannot share state safely)."""
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    newer = {
        "format": "rewardstream.member",
        "v": 2,
        "prefix": prefix,
        "group": f"{prefix}-profiler",
        "member": "future",
    }

    async def plant() -> None:  # into a members topic of one partition, as processors make it
        await ensure_topics(kafka_bootstrap, KafkaSecurity(), topics, "processor")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(f"{prefix}.members", orjson.dumps(newer), key=b"future")
        finally:
            await producer.stop()

    asyncio.run(plant())
    log = tmp_path / "processor.log"
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", log)
    processors.append(p)
    assert p.proc.wait(60) == 2
    errors = [line for line in log.read_text().splitlines() if "error:" in line]
    assert errors == [
        "rewardstream: error: a member record of format version 2, which this processor "
        "(version 1) does not read; run one rewardstream version per group"
    ]


def test_a_run_that_never_finishes_is_evicted_and_its_late_events_are_parked(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=30, repeats=2, seed=23)
    events = file_events(inputs, rollouts, "stale", "r", finish=False)
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    log = tmp_path / "processor.log"
    extra = ["--evict-after", "3"]
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", log, extra=extra)
    processors.append(p)
    p.wait(_owns_every_partition(p))
    send_events(kafka_bootstrap, topics, events[:-10], "stale")  # never complete, never finished
    p.wait(lambda runs: runs.get("stale", {}).get("state") == "evicted", timeout=60)
    assert "run stale: no event for 3s, evicting it unfinished" in log.read_text()
    with urllib.request.urlopen(f"{p.url}/metrics", timeout=5) as r:
        assert b'run_id="stale"' not in r.read()
    send_events(kafka_bootstrap, topics, events[-10:-1], "stale")  # late: parked, counted

    def parked(_: Runs) -> bool:
        with urllib.request.urlopen(f"{p.url}/metrics", timeout=5) as r:
            text = r.read().decode()
        return 'reason="run-evicted"} 9.0' in text.replace('kind="rollout",', "")

    p.wait(parked)
    argv = ["profiles", "get", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
    assert main([*argv, "--run-id", "stale", "--out", str(tmp_path / "get")]) == 2


def _figures(p: Processor, run_id: str) -> dict[str, Any]:
    """What ``p`` says of a run on every channel: ``/metrics`` (completion ratio, reward mean
    per agent, as text: the exact float) and ``/runs/<id>``."""
    with urllib.request.urlopen(f"{p.url}/metrics", timeout=10) as r:
        families = text_string_to_metric_families(r.read().decode())
    completion, means, spread = None, {}, {}
    for family in families:
        for sample in family.samples:
            if sample.labels.get("run_id") != run_id:
                continue
            if sample.name == "rewardstream_run_completion_ratio":
                completion = sample.value
            elif sample.name == "rewardstream_reward_mean":
                means[sample.labels["agent"]] = sample.value
            elif sample.name == "rewardstream_task_mean_reward_count" or (
                sample.name == "rewardstream_tasks" and sample.labels["kind"] == "all_max"
            ):
                spread[sample.name, sample.labels["agent"]] = sample.value
    detail = run_detail(p.url, run_id)
    return {"completion": completion, "means": means, "spread": spread, "detail": detail}


def _the_finals(figures: dict[str, Any], batch: dict[str, Any], expected: int) -> bool:
    """Every figure is the final's: complete, the batch profile's means, /runs/<id> agreeing
    with /metrics to the bit."""
    detail = figures["detail"]
    if detail["state"] != "final" or figures["completion"] != 1.0:
        return False
    agents = detail["agents"]
    if figures["means"].keys() != batch.keys() or agents.keys() != batch.keys():
        return False
    if sum(a["rollouts"] for a in agents.values()) != expected or detail["rollouts"] != expected:
        return False
    # the series that need the whole run (all_max, the per-task mean histogram) are there too
    spread = figures["spread"]
    if any(("rewardstream_tasks", name) not in spread for name in batch) or any(
        spread.get(("rewardstream_task_mean_reward_count", name)) != a["tasks"]["tasks"]
        for name, a in agents.items()
    ):
        return False
    return all(
        math.isclose(figures["means"][name], row["mean/reward"], rel_tol=1e-12)
        and figures["means"][name] == agents[name]["reward"]["mean"]
        for name, row in batch.items()
    )


def test_every_member_shows_the_finals_figures_after_members_join_and_leave(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A member that held every partition, lost half to a joining member before the final
    and got them back when it left (replaying nothing of the done run), and a member that
    joined after the final: each one's ``/metrics`` and ``/runs/<id>`` are the final's
    figures, equal to ``ng_reward_profile``'s agent metrics."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=300, repeats=4, seed=31)
    batch = {
        row["agent_ref"]["name"]: row
        for row in orjson.loads((inputs.parent / "r_agent_metrics.json").read_bytes())
    }
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    half = n_in + 600
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, PARTITIONS))
    (a,) = _start(kafka_bootstrap, prefix, tmp_path, ["a"], processors)
    send_events(kafka_bootstrap, topics, [*events[:half], events[-1]], "run")
    a.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)

    def split(p: Processor, q: Processor) -> Callable[[Runs], bool]:
        return lambda _: bool(_units(q)) and len(_units(p) | _units(q)) == 2 * PARTITIONS

    b = Processor(kafka_bootstrap, prefix, tmp_path / "unused", a.log, private_disk=tmp_path / "b")
    processors.append(b)
    b.wait(split(a, b), timeout=120)
    for p in (a, b):
        p.wait(lambda runs: runs.get("run", {}).get("rollouts") == 600)
    send_events(kafka_bootstrap, topics, events[half:-1], "run")  # complete: the final comes
    for p in (a, b):
        p.wait(_done("run"))

    def until_final(members: tuple[Processor, ...]) -> None:
        deadline = time.monotonic() + 60
        while not all(_the_finals(_figures(p, "run"), batch, 1200) for p in members):
            assert time.monotonic() < deadline, [_figures(p, "run") for p in members]
            time.sleep(0.3)

    until_final((a, b))
    b.kill(signal.SIGTERM)  # leaves: its partitions come back to a, which skips the done run
    a.wait(lambda _: len(_units(a)) == 2 * PARTITIONS)
    c = Processor(kafka_bootstrap, prefix, tmp_path / "unused", a.log, private_disk=tmp_path / "c")
    processors.append(c)  # joins after the final
    c.wait(split(a, c), timeout=120)
    c.wait(_done("run"))
    until_final((a, c))


def test_an_open_runs_duplicates_are_the_whole_runs_on_every_member(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Rollouts published twice, over every partition: each member's ``/runs`` counts the run's
    every duplicate while it is open (its own and its peer's, from the member records), not
    its share."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=100, repeats=2, seed=7)
    events = file_events(inputs, rollouts, "run", "r", finish=False)
    n_in = sum(1 for k, _ in events if k == "input")
    prefix = unique_name("rs")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, PARTITIONS))
    members = _start(kafka_bootstrap, prefix, tmp_path, ["a", "b"], processors)
    body = events[: n_in + 150]  # open: 150 of 200 rollouts
    send_events(kafka_bootstrap, topics, [*body, events[-1], *body[n_in : n_in + 60]], "run")

    def counted(runs: Runs) -> bool:
        run = runs.get("run", {})
        return run.get("rollouts") == 150 and run.get("duplicates_dropped") == 60

    for p in members:
        p.wait(counted)
        assert p.runs()["run"]["done"] is False
