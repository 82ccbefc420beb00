"""Collections that stop early (docs/early-stop.md): the pure rule, and the collector deciding
alone, against a real agent on loopback; the files stay NeMo Gym's and consistent."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import RowSkipped, Topics
from rewardstream.errors import InputError
from rewardstream.processors.core.confseq import Interval, Tally
from rewardstream.processors.core.stopping import (
    DispatchOrder,
    Stopper,
    StopRule,
    Verdict,
    agent_settled,
    task_place,
)
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.inprocess import PipelineSink
from rewardstream.producers.gym.collect import CollectConfig, collect, main
from rewardstream.producers.gym.early_stop import EarlyStopConfig, Skips, dispatch_order
from rewardstream.sinks.curate import Criteria, curate
from tests.gym import read_jsonl, serve, streaming, write_problems
from tests.topics import control_events

BAND = (0.1, 0.9)
AGENT = "arithmetic_simple_agent"  # write_problems' rows name it


# ------------------------------------------------------------------------------ the pure rule


@settings(deadline=None)  # as every property test here: a loaded machine is no failure
@given(
    repeats=st.integers(1, 24),
    data=st.data(),
    band=st.tuples(st.floats(0, 1), st.floats(0, 1)).map(sorted),
)
def test_a_settled_task_ends_on_the_same_side_whatever_the_rest_scores(
    repeats: int, data: st.DataObject, band: list[float]
) -> None:
    """The task rule is exact: once it speaks, every completion of the task has its final
    mean on the side it named (checked on the two extreme completions, which bound all)."""
    rule = StopRule(repeats, band=(band[0], band[1]))
    rewards = data.draw(st.lists(st.floats(0, 1), min_size=repeats, max_size=repeats))
    for n in range(repeats):
        place = task_place(sum(rewards[:n]), n, rule)
        if place is None:
            continue
        for rest in (0.0, 1.0):
            final = (sum(rewards[:n]) + rest * (repeats - n)) / repeats
            keeps = Criteria((band[0], band[1]), None).keeps(final, None)
            assert keeps == (place == "inside-band"), (n, place, final)
            if place == "below-band":
                assert final < band[0]
            if place == "above-band":
                assert final > band[1]


def test_the_rule_speaks_as_soon_as_it_may_and_not_before() -> None:
    """A task of 8 repeats with band [0.1, 0.9]: one right and one wrong answer fix its mean
    inside [1/8, 7/8]; a plant that decides one rollout earlier is caught here."""
    rule = StopRule(8, band=BAND)
    assert task_place(1.0, 1, rule) is None  # 0.125 .. 1.0: could end above 0.9
    assert task_place(1.0, 2, rule) == "inside-band"  # 0.125 .. 0.875
    assert task_place(0.0, 7, rule) is None  # 0 .. 0.125: could end inside
    assert task_place(0.0, 8, rule) is None  # nothing left to skip
    assert task_place(0.0, 1, StopRule(8, band=(0.9, 1.0))) == "below-band"  # at most 7/8
    assert task_place(1.0, 1, StopRule(8, band=(0.0, 0.1))) == "above-band"  # at least 1/8


def test_the_agent_rule_needs_the_interval_not_the_point() -> None:
    tally = Tally()
    rule = StopRule(1, half_width=0.1)
    for _ in range(20):
        tally.add(1.0)
    assert agent_settled(tally, rule) is None  # 20 straight successes: still wide
    tally.add_many(np.ones(2000))
    settled = agent_settled(tally, rule)
    assert settled is not None and (settled.upper - settled.lower) / 2 <= 0.1
    tally.add(7.0)  # outside the declared range: no interval, no stop
    assert agent_settled(tally, rule) is None


def test_a_reward_outside_the_range_keeps_its_task_open() -> None:
    stopper = Stopper(StopRule(4, band=BAND))
    assert stopper.add("a", 0, 1.5, 0) == []
    assert stopper.add("a", 0, 0.0, 1) == []  # 1 right and 1 wrong, but one is out of [0, 1]
    assert stopper.add("a", 1, 1.0, 2) == [] and stopper.add("a", 1, None, 3) == []
    assert stopper.add("a", 2, 1.0, 4) == []
    assert [v.reason for v in stopper.add("a", 2, 0.0, 5)] == ["inside-band"]
    assert stopper.add("a", 2, 0.0, 6) == []  # said once


def test_dispatch_order_lets_out_prefixes_whatever_order_items_come_back_in() -> None:
    order: DispatchOrder[str] = DispatchOrder()
    assert order.put(2, "c") == [] and order.put(1, "b") == [] and order.held == 2
    assert order.put(0, "a") == ["a", "b", "c"] and order.next == 3 and order.held == 0
    assert order.lack(5) == [] and order.put(4, "e") == [] and order.held == 1
    assert order.lack(3) == ["e"] and order.next == 6  # 3 and 5 have none: no wait for them
    assert order.put(1, "again") == [] and order.lack(4) == [] and order.put(6, "f") == ["f"]


def _right_first(block: int) -> list[tuple[int, float]]:
    """A block of rows dispatched alternately to a task always right and one always wrong
    (mean 0.5), back right-first, as when wrong rollouts are slower: (position, reward)."""
    rewards = [float(at % 2 == 0) for at in range(block)]
    arrival = sorted(range(block), key=lambda at: rewards[at] == 0.0)  # the 1s, then the 0s
    return [(at, rewards[at]) for at in arrival]


def _agent_stops(
    results: list[tuple[int, float]], rule: StopRule
) -> list[tuple[int, Interval | None]]:
    """Fold (position, reward) results; (results in, the agent's interval) when the agent rule
    spoke."""
    stopper, stops = Stopper(rule), []
    for i, (at, reward) in enumerate(results):
        if any(v.task is None for v in stopper.add("a", at % 2, reward, at)):
            stops.append((i + 1, stopper.agents["a"].interval(rule.level)))
    return stops


def test_the_agent_rule_does_not_stop_on_the_right_results_that_came_back_first() -> None:
    """The confidence sequence is valid for an order its outcomes do not choose: the agent
    rule folds in dispatch order, so 200 right results back first fold one (the next row
    dispatched is a wrong one, not back yet), and the rule stops, if at all, on the
    interleaved prefix, with the truth 0.5 inside. Folded in arrival order (planted: each
    result given its arrival position as if that were its dispatch position), the rule stops
    after 56 straight 1s on [0.80, 1], which misses 0.5: the old behaviour fails this test."""
    rule = StopRule(2, half_width=0.1)
    results = _right_first(400)
    stops = _agent_stops(results, rule)
    for i, interval in stops:
        assert i > 200, "stopped on the right results that came back first"
        assert interval is not None and interval.lower <= 0.5 <= interval.upper
    early = Stopper(rule)
    for at, reward in results[:200]:
        assert early.add("a", at % 2, reward, at) == []
    assert early.agents["a"].n == 1 and early.waiting("a") == 199

    arrival = [(i, reward) for i, (_, reward) in enumerate(results)]  # the old fold
    ((i, interval),) = _agent_stops(arrival, rule)
    assert i == 56 and interval is not None and not interval.lower <= 0.5 <= interval.upper


def test_skipped_and_failed_rows_do_not_hold_the_agent_fold_back() -> None:
    """The first row dispatched fails for good; later rows are skipped by task decisions.
    Every result waits for the failed row until the collector is done with it; then the fold
    goes on past it and past the skipped rows, and the agent rule stops."""
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "agent_ref": {"name": AGENT}}
        for t in range(60)
        for r in range(20)
    ]
    early = EarlyStopConfig(half_width=0.2, band=BAND).wire(rows)
    skips = Skips(early, local=True, rows=rows)
    assert skips.stopper is not None
    first, *rest = dispatch_order(rows)
    folded = skipped = 0
    for row in rest:
        if skips.skip(row) is not None:
            skipped += 1
            continue
        skips.fold(row, {"reward": reward_of(row["_ng_task_index"], row["_ng_rollout_index"])})
        folded += 1
    assert skipped > 0 and (AGENT, None) not in skips.decided  # all wait for the first row
    assert skips.stopper.agents[AGENT].n == 0 and skips.stopper.waiting(AGENT) == folded
    skips.settled(first)  # its attempts failed for good: no result will come
    assert skips.decided[(AGENT, None)].reason == "half-width"
    assert skips.stopper.waiting(AGENT) == 0 and skips.stopper.agents[AGENT].n == folded


def test_conflicting_decisions_collect_the_key_in_full(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two reasons for one key cannot come from the rule: a processor bug or a foreign
    writer. The key is then never skipped (a skip could be wrong); a repeat is nothing."""
    skips = Skips(EarlyStopConfig(band=BAND).wire([{"_ng_task_index": 0}] * 8), local=False)
    row = {"_ng_task_index": 3, "_ng_rollout_index": 5, "agent_ref": {"name": "a"}}
    skips.take(Verdict("a", 3, "inside-band", 2))
    skips.take(Verdict("a", 3, "inside-band", 4))  # a processor restarted: same decision
    assert skips.skip(row) is not None and capsys.readouterr().err == ""
    skips.take(Verdict("a", 3, "above-band", 4))
    assert skips.skip(row) is None
    assert "conflicting decisions for task 3 of agent 'a'" in capsys.readouterr().err


# ------------------------------------------------------------------------ the collector alone


def reward_of(task: int, rollout: int) -> float:
    """Tasks 0 mod 3 always right, 1 mod 3 always wrong, the rest right on even repeats."""
    kind = task % 3
    return 1.0 if kind == 0 else 0.0 if kind == 1 else float(rollout % 2 == 0)


@pytest.fixture
async def agent() -> AsyncIterator[tuple[str, list[tuple[int, int]]]]:
    calls: list[tuple[int, int]] = []

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        calls.append(key)
        return web.json_response({"response": {}, "reward": reward_of(*key)} | row)

    runner, url = await serve({"/run": run})
    yield url, calls
    await runner.cleanup()


def _cfg(tmp_path: Path, url: str, out: str, **extra: Any) -> CollectConfig:
    src = tmp_path / "problems.jsonl"
    if not src.exists():
        write_problems(src, 30)
    return CollectConfig.model_validate(
        {
            "input_jsonl_fpath": src,
            "output_jsonl_fpath": tmp_path / out / "r.jsonl",
            "agent_url": url,
            "num_repeats": 8,
            "disable_aggregation": True,
            "num_samples_in_parallel": 1,
            "quiet": True,
        }
        | extra
    )


def _profile_and_curate(folder: Path, *flags: str) -> list[bytes]:
    code = ng_reward_profile(
        [
            f"+materialized_inputs_jsonl_fpath={folder / 'r_materialized_inputs.jsonl'}",
            f"+rollouts_jsonl_fpath={folder / 'r.jsonl'}",
            *flags,
        ]
    )
    assert code == 0
    curate(folder / "r_reward_profiling.jsonl", folder / "curated.jsonl", Criteria(BAND, None))
    return (folder / "curated.jsonl").read_bytes().splitlines()


async def test_skipping_settled_tasks_keeps_the_curate_output(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    url, calls = agent
    await collect(_cfg(tmp_path, url, "full"))
    full_calls = len(calls)
    report = await collect(_cfg(tmp_path, url, "early", early_stop={"band": list(BAND)}))
    early = tmp_path / "early"
    rollouts, skipped = read_jsonl(early / "r.jsonl"), read_jsonl(early / "r_skipped.jsonl")
    rows = read_jsonl(early / "r_materialized_inputs.jsonl")

    # every row is either collected or listed as skipped, once
    got = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rollouts + skipped)
    assert got == sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
    assert len(calls) - full_calls == len(rollouts)
    # only the mixed tasks are settled (their mean ends in [1/8, 7/8] after a 1 and a 0),
    # each after its first two repeats (dispatch is repeat-major, one in flight)
    assert {s["_ng_task_index"] % 3 for s in skipped} == {2}
    assert {(s["reason"], s["decided_after"], s["agent"]) for s in skipped} == {
        ("inside-band", 2, AGENT)
    }
    assert len(skipped) == 10 * 6 and report.skipped == {"inside-band": 60}
    # the materialized inputs are NeMo Gym's, in its order, whatever the dispatch order
    full_rows = (tmp_path / "full" / "r_materialized_inputs.jsonl").read_bytes()
    assert (early / "r_materialized_inputs.jsonl").read_bytes() == full_rows

    # a partial profile of what was collected curates exactly as the full collection
    assert _profile_and_curate(tmp_path / "full") == _profile_and_curate(
        early, "++allow_partial_rollouts=True"
    )


async def test_an_agent_known_well_enough_stops(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    url, calls = agent
    cfg = _cfg(tmp_path, url, "a", num_repeats=60, early_stop={"half_width": 0.2})
    report = await collect(cfg)
    skipped = read_jsonl(tmp_path / "a" / "r_skipped.jsonl")
    assert report.completed == len(calls) < 30 * 60
    assert report.completed + len(skipped) == 30 * 60
    assert {s["reason"] for s in skipped} == {"half-width"}
    (after,) = {s["decided_after"] for s in skipped}
    assert after == report.completed  # one in flight: it stopped at once


async def test_an_agent_stops_past_a_row_that_failed_for_good(tmp_path: Path) -> None:
    """The first row dispatched fails terminally (HTTP 400): no result of it will come, and the
    agent's fold, in dispatch order, goes on past it instead of waiting for it forever."""

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        if key == (0, 0):
            return web.json_response({"error": "bad row"}, status=400)
        return web.json_response({"response": {}, "reward": reward_of(*key)} | row)

    runner, url = await serve({"/run": run})
    try:
        cfg = _cfg(tmp_path, url, "f", num_repeats=60, early_stop={"half_width": 0.2})
        report = await collect(cfg)
    finally:
        await runner.cleanup()
    skipped = read_jsonl(tmp_path / "f" / "r_skipped.jsonl")
    assert report.failed == 1 and 0 < report.completed < 30 * 60 - 1
    assert report.completed + len(skipped) + 1 == 30 * 60
    assert {s["reason"] for s in skipped} == {"half-width"}


async def test_a_resume_refolds_its_results_in_dispatch_order(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    """An earlier part got back only its right results (the wrong ones, slower, were in
    flight when it ended): 900 straight 1s in the rollouts file. Refolded in file order they
    would stop the agent at once on an interval near 1 (the truth is 0.5); in dispatch order
    only the first row folds until the wrong rows dispatched between the right ones are in,
    so the resume collects them and stops on an interleaved prefix."""
    url, calls = agent
    await collect(_cfg(tmp_path, url, "p", num_repeats=60))
    rollouts = tmp_path / "p" / "r.jsonl"
    lines = rollouts.read_bytes().splitlines(keepends=True)
    rollouts.write_bytes(b"".join(line for line in lines if orjson.loads(line)["reward"] == 1))
    n = len(calls)
    cfg = _cfg(tmp_path, url, "p", num_repeats=60, early_stop={"half_width": 0.2})
    again = await collect(cfg.model_copy(update={"resume_from_cache": True}))
    skipped = read_jsonl(tmp_path / "p" / "r_skipped.jsonl")
    assert 0 < again.completed == len(calls) - n < 900  # wrong rows collected, then a stop
    assert again.completed + len(skipped) == 900
    assert {s["reason"] for s in skipped} == {"half-width"}
    (after,) = {s["decided_after"] for s in skipped}  # the wrong rows and the right between
    assert again.completed < after <= 900 + again.completed


async def test_the_embedded_pipeline_profiles_what_was_collected(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    """No broker: the in-process pipeline (``rewardstream demo``'s) gets the run, the
    collector decides alone, and the final is the partial profile of the collected rows."""
    url, _ = agent
    with Pipeline(tmp_path / "state") as pipeline:
        sink = PipelineSink(pipeline)
        report = await collect(_cfg(tmp_path, url, "e", early_stop={"band": list(BAND)}), sink)
    assert report.skipped == {"inside-band": 60} and sink.paths is not None
    streamed = sink.paths.reward_profiling.read_bytes()
    _profile_and_curate(tmp_path / "e", "++allow_partial_rollouts=True")
    assert (tmp_path / "e" / "r_reward_profiling.jsonl").read_bytes() == streamed


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("+early_stop.band=[0.9,0.1]", "early_stop.band needs finite LO <= HI"),
        ("+early_stop.half_width=0", "early_stop.half_width"),
        ("+early_stop.level=1.5", "early_stop.level"),
        ("+early_stop.sharpness=2", "early_stop.sharpness"),
    ],
)
def test_a_bad_setting_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, message: str
) -> None:
    src = write_problems(tmp_path / "p.jsonl", 3)
    out = tmp_path / "out" / "r.jsonl"
    code = main(
        [
            f"+input_jsonl_fpath={src}",
            f"+output_jsonl_fpath={out}",
            "+agent_name=a",
            "+agent_url=http://127.0.0.1:9",
            setting,
        ]
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not out.parent.exists()


async def test_unequal_repeats_are_refused_before_anything_is_written(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    url, calls = agent
    repeats = {AGENT: 2, "_default": 3}
    cfg = _cfg(tmp_path, url, "u", num_repeats=repeats, early_stop={"band": [0, 1]})
    src = tmp_path / "mixed.jsonl"
    rows = [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"name": AGENT}},
        {"responses_create_params": {"input": "b"}, "agent_ref": {"name": "other"}},
    ]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cfg = cfg.model_copy(update={"input_jsonl_fpath": src})
    with pytest.raises(InputError, match="same number of repeats"):
        await collect(cfg)
    assert calls == [] and not (tmp_path / "u" / "r.jsonl").exists()


async def test_a_resume_keeps_the_skips_or_collects_them_when_told(
    agent: tuple[str, list[tuple[int, int]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, calls = agent
    cfg = _cfg(tmp_path, url, "r", early_stop={"band": list(BAND)})
    await collect(cfg)
    folder = tmp_path / "r"
    skipped = (folder / "r_skipped.jsonl").read_bytes()
    n = len(calls)
    again = await collect(cfg.model_copy(update={"resume_from_cache": True}))
    assert len(calls) == n and again.completed == 0  # nothing to run: the skips stand
    assert (folder / "r_skipped.jsonl").read_bytes() == skipped
    assert "60 skipped by the early stop" in capsys.readouterr().err

    # another band would not guarantee what the skips did: refused, nothing changed
    other = EarlyStopConfig(band=(0.2, 0.8))
    with pytest.raises(
        InputError, match=r"r_skipped.jsonl: its rows were skipped under early_stop"
    ):
        await collect(cfg.model_copy(update={"resume_from_cache": True, "early_stop": other}))
    assert (folder / "r_skipped.jsonl").read_bytes() == skipped and len(calls) == n

    full = await collect(cfg.model_copy(update={"resume_from_cache": True, "early_stop": None}))
    assert full.completed == 60 and len(calls) == n + 60
    assert not (folder / "r_skipped.jsonl").exists()
    assert (folder / "r_skipped.jsonl.~1~").read_bytes() == skipped
    assert len(read_jsonl(folder / "r.jsonl")) == 30 * 8


# ------------------------------------------------------------------- the processors decide


@pytest.mark.kafka
async def test_the_processors_decide_and_the_collector_honours_it(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real processor decides from what it folded and publishes on ``<prefix>.decisions``;
    the collector skips what it covers. Rows of the third repeat on wait until the collector
    said it holds a decision, so at least the first decided task is skipped from there."""
    said: list[str] = []

    async def decided() -> None:
        async with asyncio.timeout(120):
            while not any("early stop: first decision" in line for line in said):
                said.extend(capsys.readouterr().err.splitlines())
                await asyncio.sleep(0.05)

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        if row["_ng_rollout_index"] >= 2:
            await decided()
        reward = reward_of(row["_ng_task_index"], row["_ng_rollout_index"])
        return web.json_response({"response": {}, "reward": reward} | row)

    runner, url = await serve({"/run": run})
    prefix = unique_name("stop")
    try:
        async with streaming(kafka_bootstrap, tmp_path / "profiles", prefix, 120) as (_, kafka):
            early = {"early_stop": {"band": list(BAND)}}
            report = await collect(_cfg(tmp_path, url, "k", **kafka, **early))
        folder = tmp_path / "k"
        rollouts, skipped = read_jsonl(folder / "r.jsonl"), read_jsonl(folder / "r_skipped.jsonl")
        rows = read_jsonl(folder / "r_materialized_inputs.jsonl")
        got = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rollouts + skipped)
        assert got == sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
        assert len(skipped) >= 6  # the first decided task's third to eighth repeats, at least
        assert {(s["reason"], s["agent"], s["_ng_task_index"] % 3) for s in skipped} == {
            ("inside-band", AGENT, 2)
        }
        assert all(s["decided_after"] >= 2 for s in skipped)
        assert report.skipped == {"inside-band": len(skipped)}
        # each skipped row is published, so the processors' sequences go on past it
        control = await control_events(kafka_bootstrap, Topics.for_prefix(prefix))
        published = [e for e in control if isinstance(e, RowSkipped)]
        assert sorted((e.task, e.rollout, e.agent, e.reason) for e in published) == sorted(
            (s["_ng_task_index"], s["_ng_rollout_index"], s["agent"], s["reason"]) for s in skipped
        )
        # the streamed final is the profile of what was collected, partial, and says why
        assert report.profile is not None
        batch = tmp_path / "batch"
        batch.mkdir()
        for name in ("r.jsonl", "r_materialized_inputs.jsonl"):
            shutil.copy(folder / name, batch / name)
        _profile_and_curate(batch, "++allow_partial_rollouts=True")
        streamed = report.profile.reward_profiling.read_bytes()
        assert (batch / "r_reward_profiling.jsonl").read_bytes() == streamed
    finally:
        await runner.cleanup()


async def test_a_repeat_major_runs_interval_advances_while_it_is_collected(
    agent: tuple[str, list[tuple[int, int]]], tmp_path: Path
) -> None:
    """Repeat-major, a part folds nothing until every row of the run is known: the collector
    sends every materialized row before ``run_started`` (skipped ones too, on a resume
    as well), so every row is known from the first result on and the live interval moves
    with the results, not only at the final."""
    url, _ = agent
    seen: list[tuple[bool, int]] = []  # per result sent: rows known, the tally's n

    class Watching(PipelineSink):
        async def send(self, kind: Any, key: bytes, value: bytes, where: str = "") -> bool:
            sent = await super().send(kind, key, value, where)
            if kind == "rollout" and self.run is not None:
                seen.append((self.run.rows_known, self.run.whole(0.0)[AGENT].tally.n))
            return sent

    with Pipeline(tmp_path / "state") as pipeline:
        cfg = _cfg(tmp_path, url, "w", early_stop={"band": list(BAND)})
        report = await collect(cfg, Watching(pipeline))
    assert all(known for known, _ in seen) and len(seen) == report.completed
    counts = [n for _, n in seen]
    assert counts == sorted(counts) and counts[-1] == report.completed  # one in flight
