"""A rollout whose (task, rollout) key is no materialized row of its run (issue 24, finding 3).

Such a *foreign* rollout never counts toward the run's completeness: the run finishes when
every row has its real rollout, with the batch profile of the real files, byte for byte, and
the foreign one is a dead letter (``unknown-key``) exactly once. Inputs and rollouts travel on
different topics, so a rollout may come before its row: it is held, uncounted, until its row
comes, or until every row of the run is known (then it is foreign).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson
import pytest

from rewardstream.contract.events import EventKind, RunFinished, Topics, encode
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.engine.live import AgentLive, of_state
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.inprocess import finish
from tests.golden import (
    assert_batch_files,
    file_events,
    generated_collection,
    partial_batch_profile,
)
from tests.processes import Processor
from tests.test_live import _close
from tests.test_poison import _create_topics as create_topics
from tests.test_poison import dead_letters, keyed, metrics, send
from tests.test_snapshot import take

if TYPE_CHECKING:
    from rewardstream.processors.engine.pipeline import Stray

TASKS, REPEATS = 6, 3
Where = Literal["task", "rollout"]  # a task index past the last, a rollout index past repeats
When = Literal["before", "after"]  # the foreign rollout before / after the last real one


def collection(folder: Path) -> tuple[list[tuple[EventKind, bytes]], Path]:
    """A generated collection as events (inputs, rollouts, RunStarted) and its batch profile's
    folder."""
    inputs, rollouts = generated_collection(folder, TASKS, REPEATS, seed=5, text_bytes=20)
    return file_events(inputs, rollouts, "run", "r", finish=False), folder


def foreign(events: list[tuple[EventKind, bytes]], where: Where) -> bytes:
    """A well-formed rollout of the run whose key is none of its rows'."""
    event = orjson.loads(next(raw for kind, raw in events if kind == "rollout"))
    if where == "task":
        event["task"] = TASKS  # the tasks are 0..TASKS-1
    else:
        event["rollout"] = REPEATS  # the rollouts of a task are 0..REPEATS-1
    return orjson.dumps(event)


def with_foreign(
    events: list[tuple[EventKind, bytes]], odd: bytes, when: When
) -> list[tuple[EventKind, bytes]]:
    """Rows, RunStarted, then the rollouts with ``odd`` before or after the last one."""
    rows = [e for e in events if e[0] != "rollout"]
    rollouts = [e for e in events if e[0] == "rollout"]
    at = len(rollouts) - 1 if when == "before" else len(rollouts)
    return [*rows, *rollouts[:at], ("rollout", odd), *rollouts[at:]]


def unit_of(kind: EventKind, raw: bytes) -> str | None:
    """Two partitions per data topic, by task parity (both topics keyed by task)."""
    if kind == "control":
        return None
    event = orjson.loads(raw)
    return f"{kind}-{event.get('task', event.get('row', {}).get('_ng_task_index')) % 2}"


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("where", ["task", "rollout"])
def test_a_foreign_rollout_is_parked_and_the_run_ends_with_the_batch_profile(
    tmp_path: Path, where: Where, when: When
) -> None:
    events, batch = collection(tmp_path / "data")
    odd = foreign(events, where)
    with Pipeline(tmp_path / "out") as pipeline:
        rejected = pipeline.rejected
        for kind, raw in with_foreign(events, odd, when):
            run = pipeline.handle(kind, raw, unit_of(kind, raw))
            assert run is None or run.expected is None or run.rollouts <= run.expected
            assert run is None or run.local_rollouts <= (run.expected or run.local_rollouts)
            if run is not None:
                finish(pipeline, run)
        run = pipeline.runs["run"]
        assert run.done and run.error is None
    assert [(r.kind, r.reason, r.raw) for r in rejected] == [("rollout", "unknown-key", odd)]
    task, rollout = orjson.loads(odd)["task"], orjson.loads(odd)["rollout"]
    assert f"run 'run': rollout key (task {task}, rollout {rollout})" in rejected[0].detail
    assert_batch_files(tmp_path / "out" / "run", batch)


def replayed(
    pipeline: Pipeline, feed: list[tuple[EventKind, bytes, str | None, int | None]]
) -> Iterator[Stray]:
    """Apply ``feed`` (kind, raw, unit, offset) and yield the strays the engine hands over,
    parked by the transport as :class:`~rewardstream.processors.stream.StreamProcessor` does."""
    raws = {(unit, offset): raw for _, raw, unit, offset in feed}
    for kind, raw, unit, offset in feed:
        run = pipeline.handle(kind, raw, unit, offset)
        strays, pipeline.strays = pipeline.strays, []
        for stray in strays:
            pipeline.reject_stray(stray, raws[stray.unit, stray.offset])
            yield stray
        if run is not None:
            finish(pipeline, run)


def offsets(
    events: list[tuple[EventKind, bytes]],
) -> list[tuple[EventKind, bytes, str | None, int | None]]:
    """Each event with its unit and its offset there."""
    at: dict[str, int] = {}
    out: list[tuple[EventKind, bytes, str | None, int | None]] = []
    for kind, raw in events:
        unit = unit_of(kind, raw)
        offset = None if unit is None else at.setdefault(unit, 0)
        if unit is not None:
            at[unit] += 1
        out.append((kind, raw, unit, offset))
    return out


@pytest.mark.parametrize("where", ["task", "rollout"])
def test_rollouts_before_their_rows_wait_and_a_replay_parks_the_foreign_one_once(
    tmp_path: Path, where: Where
) -> None:
    """Rollouts first (rows on another topic, read later): none counts and none is judged
    until every row is known; then only the foreign one is parked, once. A rebuild of the
    units from the same offsets (a restart, or a new owner after a rebalance) with the parked
    offsets its last owner committed parks it no more, and both finish with the batch files."""
    events, batch = collection(tmp_path / "data")
    odd = foreign(events, where)
    rows = [e for e in events if e[0] == "input"]
    started = [e for e in events if e[0] == "control"]
    rollouts = [e for e in events if e[0] == "rollout"]
    real_last = rollouts.pop(random.Random(1).randrange(len(rollouts)))
    # a real rollout is missing while the foreign one and every row are in: not complete
    order = [*started, ("rollout", odd), *rollouts, *rows]
    feed = offsets([*order, real_last])
    with Pipeline(tmp_path / "a") as first:
        rejected = first.rejected
        parked = list(replayed(first, feed[: len(order)]))
        run = first.runs["run"]
        assert run.expected is not None and run.inputs == run.expected
        assert run.rollouts == run.expected - 1 and not run.complete and not run.done
        assert [r.reason for r in rejected] == ["unknown-key"] and rejected[0].raw == odd
        assert len(parked) == 1
        committed = {n: set(u.parked) for n, u in first.units.items()}
        assert committed[parked[0].unit] == {parked[0].offset}
        list(replayed(first, feed[len(order) :]))
        assert first.runs["run"].done
    assert_batch_files(tmp_path / "a" / "run", batch)
    with Pipeline(tmp_path / "b") as second:
        again = second.rejected
        for name, held in committed.items():  # what the commit's metadata gives a new owner
            second.unit(name).parked |= held
        assert not list(replayed(second, feed)) and again == []
        assert second.runs["run"].done
    assert_batch_files(tmp_path / "b" / "run", batch)


def test_a_rollout_before_its_row_is_held_uncounted_then_counts(tmp_path: Path) -> None:
    events, _ = collection(tmp_path / "data")
    rows = [e for e in events if e[0] == "input"]
    started = [e for e in events if e[0] == "control"]
    rollouts = [e for e in events if e[0] == "rollout"]
    with Pipeline(tmp_path / "out") as pipeline:
        rejected = pipeline.rejected
        for kind, raw in [*started, *rollouts]:
            pipeline.handle(kind, raw, unit_of(kind, raw))
        run = pipeline.runs["run"]
        assert run.rollouts == 0 and not run.complete and not run.rows_known
        for kind, raw in rows:
            pipeline.handle(kind, raw, unit_of(kind, raw))
        assert run.complete and rejected == []


@pytest.mark.kafka
def test_a_real_processor_parks_each_foreign_rollout_once_and_writes_the_batch_files(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Four runs on real Kafka, each with one foreign rollout (a task past the last, a rollout
    index past the repeats; before or after the last real rollout). The runs whose last real
    rollout is held back stay open, counting only real rollouts; their processor stops and a
    new one takes the partitions over, rebuilding them from Kafka: it parks nothing again. Every
    run ends with the batch files, and each foreign rollout is one ``unknown-key`` dead letter."""
    prefix = unique_name("keys")
    topics = Topics.for_prefix(prefix)
    asyncio.run(create_topics(kafka_bootstrap, topics))
    events, batch = collection(tmp_path / "data")
    cases: dict[str, tuple[Where, When]] = {
        "task-before": ("task", "before"),
        "task-after": ("task", "after"),
        "rollout-before": ("rollout", "before"),
        "rollout-after": ("rollout", "after"),
    }
    odd: dict[str, bytes] = {}
    first: list[tuple[EventKind, bytes, bytes]] = []
    held: list[tuple[EventKind, bytes, bytes]] = []  # the last real rollouts of "before" runs
    for run_id, (where, when) in cases.items():
        mine = [
            (k, raw.replace(b'"run_id":"run"', f'"run_id":"{run_id}"'.encode()))
            for k, raw in events
        ]
        odd[run_id] = foreign(mine, where)
        sent = keyed(with_foreign(mine, odd[run_id], when), run_id)
        if when == "before":
            held.append(sent.pop())
        first += sent
    logs = [tmp_path / "one.log", tmp_path / "two.log"]
    one = Processor(kafka_bootstrap, prefix, tmp_path / "out", logs[0])
    processors.append(one)
    send(kafka_bootstrap, topics, first)
    expected = len([e for e in events if e[0] == "input"])
    try:
        one.wait(lambda runs: all(runs.get(r, {}).get("done") for r in cases if "after" in r))
        letters = asyncio.run(dead_letters(kafka_bootstrap, topics.dead_letters, len(cases)))
        for run_id in (r for r in cases if "before" in r):
            run = one.runs()[run_id]
            assert (run["rollouts"], run["inputs"], run["done"]) == (expected - 1, expected, False)
        scraped = metrics(one.url)
        ratios = {
            dict(labels)["run_id"]: value
            for (name, labels), value in scraped.items()
            if name == "rewardstream_run_completion_ratio"
        }
        for run_id in cases:  # never counting the foreign rollout, never above 1
            full = expected - ("before" in run_id)
            assert ratios[run_id] == full / expected
        rejected = (
            "rewardstream_events_rejected_total",
            (("kind", "rollout"), ("reason", "unknown-key")),
        )
        assert scraped[rejected] == len(cases)
        one.kill(signal.SIGTERM)  # leaves the group, committing where to rebuild from
        two = Processor(kafka_bootstrap, prefix, tmp_path / "out", logs[1])
        processors.append(two)
        two.wait(lambda runs: all(r in runs for r in cases))
        send(kafka_bootstrap, topics, held)
        two.wait(lambda runs: all(runs[r]["done"] for r in cases))
        letters = asyncio.run(dead_letters(kafka_bootstrap, topics.dead_letters, len(cases)))
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n" + "\n".join(p.read_text()[-3000:] for p in logs if p.exists())
        ) from None
    for run_id in cases:
        assert_batch_files(tmp_path / "out" / run_id, batch)
    headers = [dict(r.headers) for r in letters]
    assert sorted(r.value for r in letters) == sorted(odd.values())  # each once
    assert {(h["reason"], h["kind"]) for h in headers} == {(b"unknown-key", b"rollout")}
    for run_id, raw in odd.items():
        (detail,) = [
            h["detail"].decode() for h, r in zip(headers, letters, strict=True) if r.value == raw
        ]
        event = orjson.loads(raw)
        assert (
            f"run '{run_id}': rollout key (task {event['task']}, rollout {event['rollout']})"
            in detail
        )
    assert metrics(two.url)[rejected] == 0  # the rebuild parked nothing again


def _snapshot_figures(pipeline: Pipeline, run_id: str) -> tuple[dict[str, AgentLive], int]:
    """Per agent the figures and the complete tasks a snapshot of the run shows now."""
    state = pipeline.snapshot_source(run_id, {}, {}).merged.state
    column = ProfileState.column
    rows = set(zip(column(state.in_task).tolist(), column(state.in_rollout).tolist(), strict=True))
    results = set(
        zip(column(state.res_task).tolist(), column(state.res_rollout).tolist(), strict=True)
    )
    tasks = {t for t, _ in rows}
    complete = [t for t in tasks if all(k in results for k in rows if k[0] == t)]
    return of_state(state), len(complete)


def _same_figures(pipeline: Pipeline, run_id: str, now: float) -> None:
    """The run's live figures (member summaries and the page: ``whole``, its task figures
    renewed at ``now``; the gauges: ``live`` and ``tasks_complete``) are a snapshot's."""
    run = pipeline.runs[run_id]
    expected, complete = _snapshot_figures(pipeline, run_id)
    whole = run.whole(now)
    assert {a: s.rollouts for a, s in whole.items() if s.rollouts} == {
        a: s.rollouts for a, s in expected.items()
    }
    for agent, live in expected.items():
        _close(whole[agent], live, sequence=False)  # a live view: its sequence may trail
        gauge = run.live()[agent].columns["reward"]
        assert (gauge.count, gauge.min, gauge.max) == (
            live.reward.count,
            live.reward.min,
            live.reward.max,
        )
        assert math.isclose(gauge.mean, live.reward.mean, rel_tol=1e-12)
    assert run.tasks_complete() == complete


@pytest.mark.parametrize("where", ["task", "rollout"])
def test_live_figures_count_only_rollouts_with_their_row(tmp_path: Path, where: Where) -> None:
    """A rollout waiting for its row moves no live figure until the row comes; a foreign one
    (reward 1000, the largest by far) never does, before or after it is judged: at every step
    the live figures are what a snapshot shows then."""
    events, _ = collection(tmp_path / "data")
    event = orjson.loads(foreign(events, where))
    event["record"]["values"][0] = 1000.0  # its reward
    odd = orjson.dumps(event)
    rows = [e for e in events if e[0] == "input"]
    started = [e for e in events if e[0] == "control"]
    rollouts = [e for e in events if e[0] == "rollout"]
    with Pipeline(tmp_path / "out") as pipeline:
        steps = itertools.count(step=1000.0)  # every step past the figures' renewal time
        for kind, raw in [*started, ("rollout", odd), *rollouts, *rows[:-2]]:
            pipeline.handle(kind, raw, unit_of(kind, raw))
            _same_figures(pipeline, "run", next(steps))
        run = pipeline.runs["run"]
        assert 0 < run.rollouts < run.expected - 1 and not run.rows_known  # type: ignore[operator]
        for kind, raw in rows[-2:]:  # the last rows: the run's rows are known, odd is foreign
            pipeline.handle(kind, raw, unit_of(kind, raw))
            _same_figures(pipeline, "run", next(steps))
        assert run.complete and sum(p.foreign for p in run.parts.values()) == 1
        assert max(s.reward.max for s in run.whole(0.0).values()) <= 1.0


def test_a_snapshot_holds_the_rollouts_of_rows_come_and_never_a_foreign_one(
    tmp_path: Path,
) -> None:
    """A snapshot equals ``ng_reward_profile ++allow_partial_rollouts=True`` on the rows come
    and their real rollouts: first while a task's rows have not come (its rollouts wait; two
    foreign ones are held), then once every row has come (they are foreign, parked)."""
    events, data = collection(tmp_path / "data")
    row_lines = (data / "r_materialized_inputs.jsonl").read_bytes().splitlines(keepends=True)
    lines = (data / "r.jsonl").read_bytes().splitlines(keepends=True)
    rows = [e for e in events if e[0] == "input"]
    started = [e for e in events if e[0] == "control"]
    rollouts = [e for e in events if e[0] == "rollout"]
    late = TASKS - 1  # the task whose rows come last
    task_of = [orjson.loads(raw)["task"] for _, raw in rollouts]
    first = [i for i in range(len(rollouts)) if i < len(rollouts) // 2 or task_of[i] == late]
    odd: list[tuple[EventKind, bytes]] = [
        ("rollout", foreign(events, "task")),
        ("rollout", foreign(events, "rollout")),
    ]
    row_task = [orjson.loads(raw)["row"]["_ng_task_index"] for _, raw in rows]
    early_rows = [i for i in range(len(rows)) if row_task[i] != late]
    with Pipeline(tmp_path / "out") as pipeline:
        rejected = pipeline.rejected
        fed = [*started, *(rows[i] for i in early_rows), odd[0], *(rollouts[i] for i in first)]
        for kind, raw in [*fed, odd[1]]:
            pipeline.handle(kind, raw)
        come = [i for i in first if task_of[i] != late]
        head = take(pipeline, "run", tmp_path / "snap1")
        assert head.rollouts == len(come) and rejected == []
        subset = tmp_path / "rows_come.jsonl"
        subset.write_bytes(b"".join(row_lines[i] for i in early_rows))
        partial_batch_profile(subset, [lines[i] for i in come], tmp_path / "batch1", "r")
        assert_batch_files(tmp_path / "snap1", tmp_path / "batch1", "r")
        for i in range(len(rows)):  # the late task's rows: every row has come
            if i not in early_rows:
                pipeline.handle(*rows[i])
        assert [r.reason for r in rejected] == ["unknown-key"] * 2
        head = take(pipeline, "run", tmp_path / "snap2")
    assert head.rollouts == len(first)
    partial_batch_profile(
        data / "r_materialized_inputs.jsonl", [lines[i] for i in first], tmp_path / "batch2", "r"
    )
    assert_batch_files(tmp_path / "snap2", tmp_path / "batch2", "r")


def test_a_stale_copy_of_a_unit_never_parks_the_rollouts_its_final_holds(tmp_path: Path) -> None:
    """A member paused while its units moved (a zombie), or one whose rollouts' rows are on
    another partition, holds rollouts waiting for rows that came elsewhere. When it reads the
    final, the final's own count of the unit's rollouts is above what it matched: those are
    the final's, and it parks none of them as ``unknown-key`` (a zombie trial parked 848 real
    rollouts so, each counted in the final and dead-lettered). The unit's owner at the final,
    whose count is the final's, still parks a foreign one."""
    events, _ = collection(tmp_path / "data")
    rows = [e for e in events if e[0] == "input"]
    started = [e for e in events if e[0] == "control"]
    rollouts = [e for e in events if e[0] == "rollout"]
    odd = foreign(events, "rollout")
    with Pipeline(tmp_path / "owner") as owner:  # every row and rollout: it writes the final
        for kind, raw in [*started, *rows, *rollouts]:
            run = owner.handle(kind, raw, unit_of(kind, raw))
            if run is not None:
                finish(owner, run)
        terminal = owner.runs["run"].terminal
    assert terminal is not None
    # the rows of input-1 but task 1's came after the zombie stopped, to the unit's new owner
    half = [e for e in rows if unit_of(*e) == "input-0" or b'"_ng_task_index":1,' in e[1]]
    with Pipeline(tmp_path / "zombie") as zombie:
        rejected = zombie.rejected
        for kind, raw in [*started, *half, *rollouts]:
            zombie.handle(kind, raw, unit_of(kind, raw))
        held = zombie.runs["run"].parts["rollout-1"].unmatched
        assert len(held) == 2 * REPEATS  # tasks 3 and 5: waiting for rows that came elsewhere
        zombie.mark_final("run", terminal)
    assert rejected == [] and zombie.strays == []
    # the owner of a unit at the final parks a foreign rollout
    with Pipeline(tmp_path / "foreign") as alone:
        parked = alone.rejected
        for kind, raw in [*started, *rows, *rollouts, ("rollout", odd)]:
            alone.handle(kind, raw, unit_of(kind, raw))
        alone.mark_final("run", terminal)
    assert [r.reason for r in parked] == ["unknown-key"] and parked[0].raw == odd


def test_a_late_rollout_after_the_final_says_what_is_known_of_its_key(tmp_path: Path) -> None:
    """After the final, a rollout is ``unknown-key`` only where that is proved (its key outside
    the final's rows' ranges); otherwise it is ``run-final`` (true whatever its key), and its
    detail says whether its key is a row: yes (the rows filled their ranges), maybe not (they
    did not), or not checked (a processor that never held the rows)."""
    events, _ = collection(tmp_path / "data")
    rows = [e for e in events if e[0] == "input"]
    rollouts = [e for e in events if e[0] == "rollout"]
    gap = next(i for i, (_, raw) in enumerate(rows) if b'"_ng_task_index":2,' in raw)
    key = orjson.loads(rows[gap][1])["row"]
    no_row = next(
        raw
        for _, raw in rollouts
        if (orjson.loads(raw)["task"], orjson.loads(raw)["rollout"])
        == (key["_ng_task_index"], key["_ng_rollout_index"])
    )
    others = [e for e in rollouts if e[1] != no_row]
    finished: tuple[EventKind, bytes] = ("control", encode(RunFinished(run_id="run")))
    for name, sent, late, said in [
        ("dense", [*rows, *rollouts], rollouts[0][1], "is one of its rows"),
        ("sparse", [*rows[:gap], *rows[gap + 1 :], *others, finished], no_row, "may be no row"),
    ]:
        with Pipeline(tmp_path / name) as pipeline:
            rejected = pipeline.rejected
            for kind, raw in [*(e for e in events if e[0] == "control"), *sent]:
                run = pipeline.handle(kind, raw)
                if run is not None:
                    finish(pipeline, run)
            assert pipeline.runs["run"].done, name
            pipeline.handle("rollout", late)
            terminal = pipeline.runs["run"].terminal
        assert [r.reason for r in rejected] == ["run-final"], name
        assert said in rejected[0].detail, (name, rejected[0].detail)
        with Pipeline(tmp_path / f"{name}-fresh") as other:
            fresh = other.rejected  # a processor that learns of the final, holding no rows
            assert terminal is not None
            other.mark_final("run", terminal)
            other.handle("rollout", late)
        assert [r.reason for r in fresh] == ["run-final"]
        assert "its key was not checked: the run's rows are not held here" in fresh[0].detail


@pytest.mark.kafka
def test_a_dead_letter_parked_again_after_kill_9_is_the_same_source(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A processor SIGKILLed right after a foreign rollout's dead letter is acknowledged and
    before the commit that keeps its offset (the test hook of ``DeadLetters.park_strays``): its
    successor parks it again, a copy with the same key and ``source``, which the chaos checker's
    count (each source once) counts once; the run ends with the batch files."""
    from bench.chaos import _reasons
    from rewardstream.processors.stream import KILL_AFTER_PARK

    prefix = unique_name("keys9")
    topics = Topics.for_prefix(prefix)
    asyncio.run(create_topics(kafka_bootstrap, topics))
    events, batch = collection(tmp_path / "data")
    odd = foreign(events, "task")
    sent = keyed(with_foreign(events, odd, "before"), "run")
    held = sent.pop()  # the last real rollout: the run stays open
    logs = [tmp_path / "one.log", tmp_path / "two.log"]
    monkeypatch.setenv(KILL_AFTER_PARK, "1")
    one = Processor(kafka_bootstrap, prefix, tmp_path / "out", logs[0])
    processors.append(one)
    monkeypatch.delenv(KILL_AFTER_PARK)
    send(kafka_bootstrap, topics, sent)
    try:
        assert one.proc.wait(timeout=120) == -signal.SIGKILL  # in the window, by the hook
        two = Processor(kafka_bootstrap, prefix, tmp_path / "out", logs[1])
        processors.append(two)
        letters = asyncio.run(dead_letters(kafka_bootstrap, topics.dead_letters, 2))
        send(kafka_bootstrap, topics, [held])
        two.wait(lambda runs: bool(runs.get("run", {}).get("done")))
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n" + "\n".join(p.read_text()[-3000:] for p in logs if p.exists())
        ) from None
    assert [r.value for r in letters] == [odd, odd]  # parked again: at least once
    sources = {dict(r.headers)["source"] for r in letters}
    assert len(sources) == 1 and {r.key for r in letters} == sources
    assert _reasons(letters) == {"unknown-key": 1}
    assert_batch_files(tmp_path / "out" / "run", batch)
