"""The processors' early-stop decisions (docs/early-stop.md §The processors' decisions): each
one sound (checked against the rule restated here, on the rollouts it was made after), none
too early, none for a run without an early stop, none contradicted after a restart."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rewardstream.commands.cli import main
from rewardstream.contract.decisions import Decision, decisions_topic, decode_decision
from rewardstream.contract.events import (
    EarlyStop,
    EventKind,
    RunFinished,
    RunStarted,
    Topics,
    encode,
)
from rewardstream.processors.core import stopping
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.engine import stops as stops_module
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.producers.events import input_event, rollout_event
from tests.golden import OUTPUT_SUFFIXES, partial_batch_profile
from tests.processes import Processor, read_topic, run_detail, send_events
from tests.test_stream import Running, running

__all__ = ["running"]  # the fixture, shared with the stream tests

R = 4  # repeats per task and agent
BAND = (0.3, 0.7)
HERE = Path("collection.jsonl")

Rewards = dict[tuple[str, int], list[Any]]  # (agent, task) -> its rewards, in rollout order
"""A reward that is None is left out of its result (no reward); a string is not a number."""

# task 0 below the band after 3, task 1 above after 3, task 2 never placed early, task 3 out of
# the range (never decided), task 4 with a result that has no reward, task 5 masked
REWARDS: Rewards = {
    ("a", 0): [0, 0, 0, 1],
    ("a", 1): [1, 1, 1, 0],
    ("a", 2): [0, 1, 0, 1],
    ("a", 3): [0, 2, 0, 0],
    ("a", 4): [0, None, 0, 0],
    ("a", 5): [0, 0, "masked", 0],
    # fan-out: a second agent on the same tasks, decided apart
    ("b", 0): [1, 1, 1, 1],
    ("b", 1): [0.5, 0.5, 0.5, 0.5],
    ("b", 2): [0, 0, 0, 0],
}


DECIDED = {("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)}  # after 3 repeats
SKIPPED: dict[Any, int] = {"below-band": 2, "above-band": 2, "inside-band": 1}  # their 4th


def _key(result: dict[str, Any]) -> tuple[str, int]:
    return result["agent_ref"]["name"], result["_ng_task_index"]


def _left(tail: list[tuple[EventKind, bytes]], decided: set[Any]) -> list[tuple[EventKind, bytes]]:
    """The last repeat's rollouts a collector still sends once ``decided`` are skipped."""
    last = len(REWARDS) * (R - 1)
    rows = _rows(REWARDS)
    return [
        e for e, (_, res) in zip(tail[last:], rows[last:], strict=True) if _key(res) not in decided
    ]


def _rows(rewards: Rewards) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(materialized row, result) pairs, repeat-major as an early-stopping collector sends
    them; agent k's repeats are rollouts k*R .. k*R + R - 1 of their task."""
    agents = sorted({agent for agent, _ in rewards})
    out = []
    for repeat in range(R):
        for (agent, task), values in rewards.items():
            index = agents.index(agent) * R + repeat
            row = {"_ng_task_index": task, "_ng_rollout_index": index, "agent_ref": {"name": agent}}
            value, result = values[repeat], dict(row)
            if value == "masked":
                result |= {"reward": 0, "mask_sample": True}
            elif value is not None:
                result["reward"] = value
            out.append((row | {"q": f"{task}"}, result))
    return out


def _events(
    run_id: str, rewards: Rewards, early: EarlyStop | None
) -> tuple[list[tuple[EventKind, bytes]], list[tuple[EventKind, bytes]]]:
    """The run's inputs and RunStarted, and its rollouts in sending order."""
    rows = _rows(rewards)
    head: list[tuple[EventKind, bytes]] = [
        ("input", input_event(row, run_id, HERE, i + 1).value) for i, (row, _) in enumerate(rows)
    ]
    started = RunStarted(
        run_id=run_id, expected_rollouts=len(rows), output_stem="r", early_stop=early
    )
    head.append(("control", encode(started)))
    tail: list[tuple[EventKind, bytes]] = [
        ("rollout", rollout_event(result, run_id, HERE, i + 1).value)
        for i, (_, result) in enumerate(rows)
    ]
    return head, tail


def assert_sound(decision: Decision, rewards: Rewards, early: EarlyStop) -> None:
    """The decision follows from the rollouts it was made after (the first ``rollouts`` of
    its task and agent, in the order they were sent), by the rule restated here: every
    reward a number in the range, and the final mean's every possible value on the side of
    the band it names. A decision made one rollout too early fails here."""
    lo, hi = early.reward_range
    seen = rewards[decision.agent, decision.task or 0][: decision.rollouts]
    assert decision.task is not None and 0 < len(seen) == decision.rollouts < early.repeats
    assert all(isinstance(x, int | float) and lo <= x <= hi for x in seen), decision
    left = early.repeats - len(seen)
    least = (sum(seen) + left * lo) / early.repeats
    most = (sum(seen) + left * hi) / early.repeats
    assert early.band is not None
    edge_lo, edge_hi = early.band
    holds = {
        "below-band": most < edge_lo,
        "above-band": least > edge_hi,
        "inside-band": edge_lo <= least and most <= edge_hi,
    }
    assert holds[decision.reason], decision


def _decided(topic_records: list[Any], run_id: str) -> list[Decision]:
    decisions = [decode_decision(r.value) for r in topic_records]
    return [d for d in decisions if d.run_id == run_id]


# -- the engine alone: when a decision comes -------------------------------------------------
def _feed_one_by_one(pipeline: Pipeline, run_id: str, early: EarlyStop) -> list[Decision]:
    """Every rollout on its own, the decisions after each, as the wire records."""
    head, tail = _events(run_id, REWARDS, early)
    for kind, raw in head:
        pipeline.handle(kind, raw, None if kind == "control" else "input-0")
    made = []
    for _, raw in tail:
        pipeline.handle("rollout", raw, "rollout-0")
        for run, v in pipeline.decide():
            made.append(Decision(group="g", run_id=run, agent=v.agent, task=v.task, **_of(v)))
    return made


def _of(verdict: Any) -> dict[str, Any]:
    return {"reason": verdict.reason, "rollouts": verdict.rollouts}


def test_a_task_is_decided_the_moment_the_rule_allows_once_and_soundly(tmp_path: Path) -> None:
    early = EarlyStop(repeats=R, band=BAND)
    with Pipeline(tmp_path) as pipeline:
        made = _feed_one_by_one(pipeline, "r", early)
    for decision in made:
        assert_sound(decision, REWARDS, early)
    got = {(d.agent, d.task): (d.reason, d.rollouts) for d in made}
    assert len(got) == len(made)  # once each
    # at the first rollout the rule allows, 3 of 4 (after 2 the last two could still move
    # each across an edge); none for the tasks it cannot place or must not
    assert got == {
        ("a", 0): ("below-band", 3),
        ("a", 1): ("above-band", 3),
        ("b", 0): ("above-band", 3),
        ("b", 1): ("inside-band", 3),
        ("b", 2): ("below-band", 3),
    }


def test_the_soundness_check_catches_a_decision_one_rollout_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the engine places a task as if one more rollout were in (so one rollout
    before the rule allows); :func:`assert_sound` refuses what it publishes."""
    real = stopping.task_place

    def early_by_one(total: float, n: int, rule: Any) -> Any:
        return real(total + (rule.lo if total < n / 2 else rule.hi), n + 1, rule)

    monkeypatch.setattr(stops_module, "task_place", early_by_one)
    early = EarlyStop(repeats=R, band=BAND)
    with Pipeline(tmp_path) as pipeline:
        made = _feed_one_by_one(pipeline, "r", early)
    assert made
    failed = 0
    for decision in made:
        try:
            assert_sound(decision, REWARDS, early)
        except AssertionError:
            failed += 1
    assert failed == len(made)


def test_rollouts_before_their_rows_and_a_late_run_started_count_once_the_rows_come(
    tmp_path: Path,
) -> None:
    early = EarlyStop(repeats=R, band=BAND)
    head, tail = _events("r", {("a", 0): [0, 0, 0, 1]}, early)
    *inputs, (_, started) = head
    with Pipeline(tmp_path) as pipeline:
        for _, raw in tail[:3]:
            pipeline.handle("rollout", raw, "rollout-0")  # held: no row yet
        pipeline.handle("control", started)
        assert pipeline.decide() == []
        for _, raw in inputs[:2]:
            pipeline.handle("input", raw, "input-0")
        assert pipeline.decide() == []  # two rollouts count: not placed yet
        pipeline.handle("input", inputs[2][1], "input-0")
        [(_, verdict)] = pipeline.decide()
    assert (verdict.task, verdict.reason, verdict.rollouts) == (0, "below-band", 3)


def test_no_decision_is_made_or_paid_for_without_an_early_stop(tmp_path: Path) -> None:
    head, tail = _events("r", REWARDS, None)
    with Pipeline(tmp_path) as pipeline:
        for kind, raw in [*head, *tail]:
            pipeline.handle(kind, raw, None if kind == "control" else f"{kind}-0")
        assert pipeline.stops == {} and pipeline.decide() == []


# -- the stream processor against a real broker ----------------------------------------------
async def test_decisions_on_the_topic_and_the_early_final_says_why(
    running: Running, tmp_path: Path
) -> None:
    """A run with a band, fanned out over two agents, beside one without an early stop on the
    same topics: the first run's decisions, each sound, none for an unplaceable task, none
    for the second run; its final, partial, carries what the collector skipped, in
    ``/runs/<id>`` and ``profiles list``, and its files are the batch profile of what came."""
    early = EarlyStop(repeats=R, band=BAND)
    topics = running.processor.topics
    head, tail = _events("early", REWARDS, early)
    plain_head, plain_tail = _events("plain", REWARDS, None)
    await running.send(plain_head + head, "early")
    per_round = len(REWARDS)
    await running.send(tail[: 3 * per_round] + plain_tail, "early")  # three repeats each
    records = await read_topic(running.processor.bootstrap, decisions_topic(topics), at_least=5)
    decided = _decided(records, "early")
    for decision in decided:
        assert decision.group == running.processor.group_id
        assert_sound(decision, REWARDS, early)
    keys = {(d.agent, d.task) for d in decided}
    assert keys == DECIDED
    # the collector skips the decided rows' last repeat and finishes early
    await running.send(_left(tail, keys), "early")
    finished = RunFinished(run_id="early", skipped=SKIPPED)
    await running.send([("control", encode(finished))], "early")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "early" in runs and runs["early"].done)
    await running.wait(lambda: "plain" in runs and runs["plain"].done)
    records = await read_topic(running.processor.bootstrap, decisions_topic(topics))
    assert _decided(records, "plain") == []
    assert len(_decided(records, "early")) == len(decided)  # each once

    detail = await asyncio.to_thread(run_detail, running.url, "early")
    assert detail["skipped"] == SKIPPED
    assert (await asyncio.to_thread(run_detail, running.url, "plain"))["skipped"] is None
    metrics = await asyncio.to_thread(_get, f"{running.url}/metrics")
    for reason, n in SKIPPED.items():
        assert f'rewardstream_run_skipped_rows{{reason="{reason}",run_id="early"}} {n}.0' in metrics
    skipped_series = [x for x in metrics.splitlines() if x.startswith("rewardstream_run_skipped_")]
    assert len(skipped_series) == len(SKIPPED)  # none for the run that did not end early
    # the final is partial, as any final missing rows is, and its files are NeMo Gym's
    rows = _rows(REWARDS)
    came = [res for i, (_, res) in enumerate(rows) if i < 3 * per_round or _key(res) not in keys]
    inputs = tmp_path / "r_materialized_inputs.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row, _ in rows))
    reference = tmp_path / "reference"
    partial_batch_profile(inputs, [orjson.dumps(r) + b"\n" for r in came], reference, "r")
    final = running.processor.pipeline.output_dir / "early"
    for suffix in OUTPUT_SUFFIXES:
        assert (final / f"r{suffix}").read_bytes() == (reference / f"r{suffix}").read_bytes()


async def test_the_agent_rule_is_decided_once_by_the_leader_from_the_whole_run(
    running: Running,
) -> None:
    """Agent ``a``, every reward 1 over 60 tasks, settles its interval to +-0.1 at a count
    fixed by the rule (its rewards are all alike, so the order they are folded in changes
    nothing); ``b``, with 4 tasks, never does. The decision comes after at least that count
    (never before the interval is that narrow) and once."""
    early = EarlyStop(repeats=R, half_width=0.1)
    rewards: Rewards = {("a", t): [1] * R for t in range(60)} | {
        ("b", t): [1] * R for t in range(4)
    }
    settles = next(n for n in range(1, 60 * R + 1) if _half_width([1.0] * n) <= 0.1)
    head, tail = _events("agents", rewards, early)
    await running.send(head + tail, "agents")
    topics = running.processor.topics
    [record] = await read_topic(running.processor.bootstrap, decisions_topic(topics), at_least=1)
    decision = decode_decision(record.value)
    assert (decision.agent, decision.task, decision.reason) == ("a", None, "half-width")
    assert settles <= decision.rollouts <= 60 * R
    assert _half_width([1.0] * decision.rollouts) <= 0.1
    await running.send([("control", encode(RunFinished(run_id="agents")))], "agents")
    runs = running.processor.pipeline.runs
    await running.wait(lambda: "agents" in runs and runs["agents"].done)
    records = await read_topic(running.processor.bootstrap, decisions_topic(topics))
    assert [decode_decision(r.value).agent for r in records] == ["a"]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _half_width(rewards: list[float]) -> float:
    tally = Tally()
    for x in rewards:
        tally.add(x)
    interval = tally.interval()
    assert interval is not None
    return (interval.upper - interval.lower) / 2


def test_a_restarted_processor_neither_loses_nor_contradicts_a_decision(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three repeats each, a processor killed (-9) once it decided, a new one for the last
    repeat: the decisions of the first stand, any the second makes again agree with them,
    each is sound, and the final record and ``profiles list`` say what was skipped."""
    early = EarlyStop(repeats=R, band=BAND)
    prefix, out, log = unique_name("rs"), tmp_path / "out", tmp_path / "processor.log"
    topics = Topics.for_prefix(prefix)
    head, tail = _events("run", REWARDS, early)
    per_round = len(REWARDS)

    first = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(first)
    send_events(kafka_bootstrap, topics, head + tail[: 3 * per_round], "run")
    before = asyncio.run(read_topic(kafka_bootstrap, decisions_topic(topics), at_least=4))
    first.kill(signal.SIGKILL)

    second = Processor(kafka_bootstrap, prefix, out, log)
    processors.append(second)
    skipped = {(d.agent, d.task) for d in _decided(before, "run")}
    finished = RunFinished(run_id="run", skipped=SKIPPED)
    send_events(
        kafka_bootstrap, topics, [*_left(tail, skipped), ("control", encode(finished))], "run"
    )
    second.wait(lambda runs: runs.get("run", {}).get("done") is True)
    second.kill(signal.SIGTERM)
    assert second.proc.returncode == 0, log.read_text()[-2000:]

    decided = _decided(asyncio.run(read_topic(kafka_bootstrap, decisions_topic(topics))), "run")
    places: dict[tuple[str, int | None], str] = {}
    for decision in decided:
        assert_sound(decision, REWARDS, early)
        assert (
            places.setdefault((decision.agent, decision.task), decision.reason) == decision.reason
        )
    assert set(places) == skipped == DECIDED

    assert main(["profiles", "list", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert "\tpartial\t" in line, line
    assert line.endswith("\tskipped=above-band:2,below-band:2,inside-band:1"), line
