"""The agent sequence in dispatch order (:mod:`rewardstream.processors.core.sequence`): folded a
prefix at a time whatever order results come in, cut across parts at their lowest frontier so
the union is a prefix of the run's dispatch order, and exact against a plain :class:`Tally` fed
that prefix; and, through the engine, an interval that right-first arrivals cannot tilt."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract.events import (
    AttemptFailed,
    EarlyStop,
    EventKind,
    RowSkipped,
    RunFinished,
    RunStarted,
    Topics,
    decode_control,
    encode,
)
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.sequence import (
    WIRE_ENTRIES,
    Ladder,
    SequenceFold,
    cut,
    dispatch_keys,
    final_tallies,
)
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.engine.live import AgentLive
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.inprocess import PipelineSink
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.units import Units
from rewardstream.producers.events import input_event, rollout_event
from rewardstream.producers.gym.collect import CollectConfig, collect
from tests.gym import serve, write_problems

AGENT = "arithmetic_simple_agent"  # write_problems' rows name it


def _row(task: int, rollout: int, agent: str = "a") -> dict[str, object]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": agent}}


def _result(state: ProfileState, task: int, rollout: int, reward: float) -> None:
    result = {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward}
    state.add_record(task, rollout, extract_result(result, task, rollout), "a")


def _partitioned(lines: int, parts: int) -> list[ProfileState]:
    """``lines`` rows (task = line, one rollout each), task ``t`` in part ``t % parts``."""
    states = [ProfileState() for _ in range(parts)]
    for line in range(lines):
        states[line % parts].add_input(_row(line, 0), 0, line)
    return states


@settings(deadline=None, max_examples=60)
@given(
    st.integers(1, 4),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
    st.randoms(use_true_random=False),
)
def test_the_cut_is_the_tally_of_the_dispatch_prefix(
    parts: int, rewards: list[float], rng: object
) -> None:
    """Whatever order the results come in, after each one the parts cut at their lowest
    frontier sum to per-part tallies fed, in line order, the rows below the first row still
    waiting; with floors fed back, as processors do, every later cut stays exact."""
    states = _partitioned(len(rewards), parts)
    folds = [SequenceFold(False) for _ in range(parts)]
    order = list(range(len(rewards)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    came: set[int] = set()
    floors: dict[str, float] = {}
    for line in order:
        _result(states[line % parts], line, 0, rewards[line])
        came.add(line)
        ladders = []
        for fold, state in zip(folds, states, strict=True):
            fold.update(state, state, rows_known=True)
            ladders.append(fold.ladders(floors).get("a") or Ladder(None))
        got = cut(ladders)
        assert got is not None
        tally, at = got
        waiting = min(set(range(len(rewards))) - came, default=None)
        assert at == (math.inf if waiting is None else waiting)
        expected = Tally()
        for p in range(parts):
            mine = Tally()
            for i in range(p, len(rewards), parts):
                if i < at:
                    mine.add(rewards[i])
            expected.merge(mine)
        assert (tally.n, tally.outside) == (expected.n, 0)
        assert math.isclose(tally.total, expected.total, abs_tol=1e-9)
        assert math.isclose(tally.spread, expected.spread, abs_tol=1e-9)
        floors["a"] = at


def test_rows_that_never_get_a_result_hold_nothing_back() -> None:
    """A row failed for good, a row an early stop skipped, and (once complete) any row left
    without a result are passed over; a row merely waiting holds its part's frontier."""
    (state,) = _partitioned(6, 1)
    for line in (0, 2, 4, 5):
        _result(state, line, 0, 1.0)
    fold = SequenceFold(False)
    fold.update(state, state, rows_known=True)
    assert fold.ladders()["a"].frontier == 1 and fold.ladders()["a"].at(math.inf)[0] == 1
    fold.update(state, state, gone=[(1, 0)], rows_known=True)
    assert fold.ladders()["a"].frontier == 3
    fold.update(state, state, gone=[(1, 0), (3, 0)], rows_known=True)
    ladder = fold.ladders()["a"]
    assert ladder.frontier is None and ladder.at(math.inf)[0] == 4
    late = SequenceFold(False)
    late.update(state, state, complete=True)
    assert late.ladders()["a"].at(math.inf)[0] == 4


class _Counted(list[tuple[int, int]]):
    """A ``gone`` list that counts the items read out of it."""

    read = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        self.read += len(self)
        return super().__iter__()

    def __getitem__(self, at: Any) -> Any:
        got = super().__getitem__(at)
        self.read += len(got) if isinstance(at, slice) else 1
        return got


def test_gone_rows_are_read_once_not_at_every_update() -> None:
    """``gone`` only grows at its end: an update reads the items added since the last one,
    so an update with nothing new costs nothing per gone row (it was ~92 ms per partition
    and agent with 100,000 of them, every window of every update); a pair whose row comes
    later still passes it."""
    (state,) = _partitioned(4000, 1)
    gone = _Counted((line, 0) for line in range(1, 3000))
    _result(state, 3000, 0, 1.0)
    fold = SequenceFold(False)
    fold.update(state, state, gone, rows_known=True)
    assert fold.ladders()["a"].frontier == 0 and gone.read == len(gone)
    for _ in range(3):
        fold.update(state, state, gone, rows_known=True)
    assert gone.read == len(gone)  # no item read again
    _result(state, 0, 0, 0.0)
    fold.update(state, state, gone, rows_known=True)
    assert fold.ladders()["a"].frontier == 3001 and fold.ladders()["a"].at(math.inf)[0] == 2
    gone.append((4001, 0))  # its row comes after
    gone.append((3001, 0))
    fold.update(state, state, gone)
    assert gone.read == len(gone) and fold.ladders()["a"].frontier == 3002
    state.add_input(_row(4001, 0), 0, 4001)
    _result(state, 4000, 0, 1.0)
    fold.update(state, state, gone)
    assert fold.ladders()["a"].frontier == 3002  # (3002..3999) wait
    for line in range(3002, 4000):
        _result(state, line, 0, 1.0)
    fold.update(state, state, gone, rows_known=True)
    assert fold.ladders()["a"].frontier is None  # 4001 passed: gone before it came


def test_a_result_for_a_row_passed_over_is_not_counted_out_of_order() -> None:
    """A row passed as gone whose result comes after all (a resumed collection retried it)
    is not folded then, behind the rows after it: the sequence stays in dispatch order."""
    (state,) = _partitioned(3, 1)
    _result(state, 1, 0, 1.0)
    _result(state, 2, 0, 1.0)
    fold = SequenceFold(False)
    fold.update(state, state, [(0, 0)], rows_known=True)
    assert fold.ladders()["a"].at(math.inf) == (2, 2.0, fold.ladders()["a"].at(math.inf)[2])
    _result(state, 0, 0, 0.0)
    fold.update(state, state, [(0, 0)], rows_known=True)
    assert fold.ladders()["a"].at(math.inf)[:2] == (2, 2.0)


def test_a_part_whose_rows_may_still_come_bounds_the_cut_at_its_last_row() -> None:
    """Rows come in line order: with every row here done but more to come, a part's frontier
    is just past its last line (a row yet to come is after it); repeat-major rows may sort
    anywhere, so nothing is folded until every row of the run is known."""
    (state,) = _partitioned(3, 1)
    for line in range(3):
        _result(state, line, 0, 0.0)
    fold = SequenceFold(False)
    fold.update(state, state)
    assert fold.ladders()["a"].frontier == 3
    repeat_major = SequenceFold(True)
    repeat_major.update(state, state)
    assert repeat_major.ladders()["a"].frontier == 0
    repeat_major.update(state, state, rows_known=True)
    assert repeat_major.ladders()["a"].frontier is None


def test_repeat_major_keys_order_by_rollout_then_task() -> None:
    tasks, rollouts = np.array([0, 1, 0, 1, -1]), np.array([0, 0, 1, 1, 0])
    keys = dispatch_keys(tasks, rollouts, np.arange(5), True)
    assert list(np.argsort(keys[:4])) == [0, 1, 2, 3] and keys[4] == -1
    assert list(dispatch_keys(tasks, rollouts, np.arange(5), False)) == [0, 1, 2, 3, 4]


def test_a_part_that_went_back_gives_no_cut_until_it_catches_up() -> None:
    """A part rebuilt from its start has a frontier below the others' floors: no exact cut
    exists (None: no interval is shown) rather than a wrong one."""
    ahead = Ladder(frontier=50, floor=40, base=(40, 20.0, 10.0))
    assert cut([ahead, Ladder(frontier=10)]) is None
    assert cut([ahead, Ladder(frontier=45)]) is not None


def test_the_final_tallies_equal_the_fold_with_every_result_in() -> None:
    rng = np.random.default_rng(1)
    (state,) = _partitioned(50, 1)
    for line in rng.permutation(50).tolist():
        if line % 7:  # some rows never get a result
            _result(state, line, 0, float(rng.random()))
    fold = SequenceFold(False)
    fold.update(state, state, complete=True)
    n, total, spread = fold.ladders()["a"].at(math.inf)
    final = final_tallies(state, False)["a"]
    assert final.n == n and math.isclose(final.total, total) and math.isclose(final.spread, spread)


def test_right_first_arrivals_do_not_tilt_the_live_interval(tmp_path: Path) -> None:
    """400 rows of one agent, true mean 0.5 (rows alternate right and wrong); every right
    rollout comes before any wrong one, as when wrong ones are slower. The arrival order's
    sequence misses 0.5 (the planted fault the fold in dispatch order exists for); the
    engine's interval holds it after every rollout."""
    pipeline = Pipeline(tmp_path / "p")
    pipeline.handle(
        "control", encode(RunStarted(run_id="r", expected_rollouts=400, output_stem="r"))
    )
    path = tmp_path / "r.jsonl"
    for line in range(400):
        event = input_event(_row(line, 0), "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "input-0")
    arrival, missed = Tally(), False
    for line in [*range(0, 400, 2), *range(1, 400, 2)]:
        reward = float(line % 2 == 0)
        result = {**_row(line, 0), "reward": reward}
        event = rollout_event(result, "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "rollout-0")
        arrival.add(reward)
        now = arrival.interval()
        missed = missed or (now is not None and not now.lower <= 0.5 <= now.upper)
        live = pipeline.runs["r"].whole(0.0)["a"].tally.interval()
        assert live is None or live.lower <= 0.5 <= live.upper
    assert missed
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 400


def _two_units(tmp_path: Path, expected: int) -> Pipeline:
    """A pipeline of a group whose input topic has two partitions (others may hold one)."""
    pipeline = Pipeline(tmp_path / "p")
    pipeline.set_input_units(frozenset({"input-0", "input-1"}))
    pipeline.handle(
        "control", encode(RunStarted(run_id="r", expected_rollouts=expected, output_stem="r"))
    )
    return pipeline


def _feed(pipeline: Pipeline, tmp_path: Path, line: int, agent: str, result: bool) -> None:
    """Row ``line`` (task = line, in unit ``input-<line % 2>``) of ``agent``, and its
    result (reward: line even) when ``result``."""
    path, unit = tmp_path / "r.jsonl", line % 2
    event = input_event(_row(line, 0, agent), "r", path, line + 1)
    pipeline.handle(event.kind, event.value, f"input-{unit}")
    if result:
        outcome = {**_row(line, 0, agent), "reward": float(line % 2 == 0)}
        event = rollout_event(outcome, "r", path, line + 1)
        pipeline.handle(event.kind, event.value, f"rollout-{unit}")


def test_a_partition_not_read_yet_holds_the_cut_at_its_start(tmp_path: Path) -> None:
    """The even lines (partition 0) all done, partition 1 not read at all: its rows may be
    any of the odd lines, so no row can be in the cut (before the fix: the ten even lines, a
    tally of right answers only)."""
    pipeline = _two_units(tmp_path, 20)
    for line in range(0, 20, 2):
        _feed(pipeline, tmp_path, line, "a", True)
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 0
    _feed(pipeline, tmp_path, 1, "a", False)  # line 1 read, no result: lines 0 only
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 1
    for line in range(1, 20, 2):
        _feed(pipeline, tmp_path, line, "a", True)
    whole = pipeline.runs["r"].whole(0.0)["a"]
    assert whole.tally.n == 20 and whole.tally.total == 10


def test_an_agent_not_seen_in_a_partition_is_bounded_by_what_it_read(tmp_path: Path) -> None:
    """Agent b has rows only in partition 0 so far; partition 1 has read line 1 (agent a):
    a row of b may still come to it at line 3, so b's cut stops at line 2 (before the fix:
    past line 4)."""
    pipeline = _two_units(tmp_path, 10)
    _feed(pipeline, tmp_path, 0, "a", True)
    _feed(pipeline, tmp_path, 1, "a", True)
    _feed(pipeline, tmp_path, 2, "b", True)
    _feed(pipeline, tmp_path, 4, "b", True)
    assert pipeline.runs["r"].whole(0.0)["b"].tally.n == 0
    _feed(pipeline, tmp_path, 3, "a", True)
    assert pipeline.runs["r"].whole(0.0)["b"].tally.n == 1  # line 2; line 5 may be b's
    for line in (5, 6, 7, 8, 9):
        _feed(pipeline, tmp_path, line, "a", True)
    # every row known: partition 1 has none of b's, b's cut is its own
    assert pipeline.runs["r"].whole(0.0)["b"].tally.n == 2


def test_units_not_known_yet_hold_every_cut(tmp_path: Path) -> None:
    """A processor of a group that does not know its topics' partitions yet shows no row in
    a cut (any unit may hold the earliest rows), until every row of the run is known."""
    pipeline = _two_units(tmp_path, 2)
    pipeline.set_input_units(frozenset())
    _feed(pipeline, tmp_path, 0, "a", True)
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 0
    _feed(pipeline, tmp_path, 1, "a", True)
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 2


def test_many_ladders_fit_one_member_record(tmp_path: Path) -> None:
    """A member record holds a summary and a ladder per partition, open run and agent: with
    240 of them, each folded past what a record carries, their entries are cut down until the
    record fits its 512 KiB with every summary in (each ladder still exact: its frontier
    lowered to the first entry left out)."""
    pipeline = Pipeline(tmp_path / "p")
    path = tmp_path / "r.jsonl"
    rng = np.random.default_rng(2)
    for run in range(60):
        run_id = f"r{run}"
        started = RunStarted(run_id=run_id, expected_rollouts=1200, output_stem="r")
        pipeline.handle("control", encode(started))
        for line in range(1200):
            unit = line % 4
            event = input_event(_row(line, 0), run_id, path, line + 1)
            pipeline.handle(event.kind, event.value, f"input-{unit}")
            if line != 3:  # awaited: every cut stays at 3, every ladder holds its entries
                result = {**_row(line, 0), "reward": float(rng.random())}
                event = rollout_event(result, run_id, path, line + 1)
                pipeline.handle(event.kind, event.value, f"rollout-{unit}")
    membership = Membership(pipeline, Units(Topics.for_prefix("t")), "t.members", "t", "g", "m")
    record, raw = membership.record()
    assert len(raw) <= 512 << 10
    sent = [
        progress.sequence
        for name, unit in record.units.items()
        for agents in unit.live.values()
        for progress in agents.values()
        if name.startswith("input-")  # a rollout unit's summary has figures, no ladder
    ]
    assert len(sent) == 240
    for sequence in sent:
        assert sequence is not None
        frontier, _, _, keys, *_ = sequence
        if frontier == 3:  # unit 3's ladder waits there, with no entry
            assert keys == []
        else:  # the others' are cut down, their frontiers to the first entry left out
            assert 0 < len(keys) < WIRE_ENTRIES and frontier is not None and frontier > keys[-1]


def test_a_decided_tasks_row_in_flight_waits_for_its_result(tmp_path: Path) -> None:
    """Under an early stop, task 1 is decided while its third row is in flight: that row's
    result still comes, and the sequence waits for it, so whether it counts does not depend
    on its latency (wrong ones being slower, passing it over would lean high); the row the
    collector skipped (``row_skipped``) holds nothing back."""
    pipeline = Pipeline(tmp_path / "p")
    early = EarlyStop(repeats=4, band=(0.2, 0.8))
    started = RunStarted(run_id="r", expected_rollouts=8, output_stem="r", early_stop=early)
    pipeline.handle("control", encode(started))
    path = tmp_path / "r.jsonl"
    for line, (task, rollout) in enumerate((t, r) for t in range(2) for r in range(4)):
        event = input_event(_row(task, rollout), "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "input-0")

    def result(task: int, rollout: int, reward: float) -> None:
        event = rollout_event({**_row(task, rollout), "reward": reward}, "r", path, 1)
        pipeline.handle(event.kind, event.value, "rollout-0")

    for task, rollout, reward in ((0, 0, 1.0), (1, 0, 0.0), (0, 1, 1.0), (1, 1, 1.0)):
        result(task, rollout, reward)
    assert {v.task for _, v in pipeline.decide()} == {1}  # its mean is within [1/4, 3/4]
    skipped = RowSkipped(run_id="r", task=1, rollout=3, agent="a", reason="inside-band")
    pipeline.handle("control", encode(skipped))
    result(0, 2, 1.0)
    result(0, 3, 1.0)
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 5  # up to (1, 2), in flight
    result(1, 2, 0.0)
    tally = pipeline.runs["r"].whole(0.0)["a"].tally
    assert tally.n == 7 and tally.total == 5.0  # every row but the skipped one


# ------------------------------------------------- rows that will never have a result, live


def _collection(tmp_path: Path, url: str, problems: int) -> CollectConfig:
    """A collection of ``problems`` generated problems, two repeats each, from ``url``."""
    src = write_problems(tmp_path / "problems.jsonl", problems)
    return CollectConfig.model_validate(
        {
            "input_jsonl_fpath": src,
            "output_jsonl_fpath": tmp_path / "out" / "r.jsonl",
            "agent_url": url,
            "num_repeats": 2,
            "disable_aggregation": True,
            "retry_backoff_s": 0,
            "quiet": True,
        }
    )


class _LiveAtFinish(PipelineSink):
    """The in-process pipeline, and the run's live view just before ``run_finished`` is read:
    every other event of the run is in then."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__(pipeline)
        self.live: dict[str, AgentLive] | None = None
        self.failed: list[AttemptFailed] = []

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        if kind == "control":
            event = decode_control(value)
            if isinstance(event, RunFinished):
                self.live = self.pipeline.runs[event.run_id].whole(0.0)
            elif isinstance(event, AttemptFailed):
                self.failed.append(event)
        return await super().send(kind, key, value, where)


async def test_every_row_without_a_result_is_gone_before_the_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Task 0's rows fail every attempt (HTTP 500, retried), task 1's agent replies with a
    failure result (``_ng_failure_class``), task 2's with one written nowhere
    (``_ng_no_persist``): none will have a result, and each is known gone, so the live
    sequence folds every result there is before the run ends (it stopped at line 0 until the
    final). Task 3's rows fail once and then succeed: no event calls them gone."""
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "2")
    tried: set[tuple[int, int]] = set()

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        first = key not in tried
        tried.add(key)
        if key[0] == 0 or (key[0] == 3 and first):
            return web.json_response({"error": "busy"}, status=500)
        reply = {"response": {}, "reward": 1.0} | row
        if key[0] == 1:
            reply["_ng_failure_class"] = "tool_crashed"
        elif key[0] == 2:
            reply["_ng_no_persist"] = True
        return web.json_response(reply)

    runner, url = await serve({"/run": run})
    cfg = _collection(tmp_path, url, 6)
    try:
        with Pipeline(tmp_path / "state") as pipeline:
            sink = _LiveAtFinish(pipeline)
            report = await collect(cfg, sink)
    finally:
        await runner.cleanup()
    assert report.completed == 6 * 2 - 3 * 2
    assert sink.live is not None
    tally = sink.live[AGENT].tally
    assert tally.n == report.completed and tally.total == report.completed
    terminal = {(e.task, e.rollout, e.failure_class) for e in sink.failed if e.terminal}
    assert terminal == {
        *((0, r, "agent_run_error") for r in range(2)),
        *((1, r, "tool_crashed") for r in range(2)),
        *((2, r, "no_persist") for r in range(2)),
    }
    assert {(e.task, e.terminal) for e in sink.failed if e.task == 3} == {(3, False)}


def test_a_finished_run_passes_every_row_once_its_events_are_in(tmp_path: Path) -> None:
    """A row whose result never came and that no event calls gone (a collector of an older
    version): once ``run_finished`` is read and every event is in, none will come, and the
    live sequence folds every result there is, as the final will."""
    pipeline = Pipeline(tmp_path / "p")
    started = RunStarted(run_id="r", expected_rollouts=3, output_stem="r")
    pipeline.handle("control", encode(started))
    path = tmp_path / "r.jsonl"
    for line in range(3):
        event = input_event(_row(line, 0), "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "input-0")
    for line in (1, 2):
        event = rollout_event({**_row(line, 0), "reward": 1.0}, "r", path, line)
        pipeline.handle(event.kind, event.value, "rollout-0")
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 0  # row 0 may still come
    pipeline.handle("control", encode(RunFinished(run_id="r")))
    assert pipeline.runs["r"].whole(0.0)["a"].tally.n == 2


def _gone_then_run(tmp_path: Path, resume: bool) -> list[int]:
    """Six rows; row 2's attempt fails for good (as a collection with one attempt says), the
    others' results come; then (``resume``: a resumed collection's ``run_started``, with more
    attempts) row 2 is run after all. The live count after each step."""
    pipeline = _two_units(tmp_path, 6)
    pipeline.set_input_units(frozenset({"input-0"}))
    path, counts = tmp_path / "r.jsonl", []
    for line in range(6):
        event = input_event(_row(line, 0), "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "input-0")
    failed = AttemptFailed(run_id="r", task=2, rollout=0, failure_class="x", terminal=True)
    pipeline.handle("control", encode(failed))

    def result(line: int) -> None:
        event = rollout_event({**_row(line, 0), "reward": 1.0}, "r", path, line + 1)
        pipeline.handle(event.kind, event.value, "rollout-0")

    for line in (0, 1, 3, 4, 5):
        result(line)
    counts.append(pipeline.runs["r"].whole(0.0)["a"].tally.n)
    if resume:
        again = RunStarted(run_id="r", expected_rollouts=6, output_stem="r")
        pipeline.handle("control", encode(again))
        counts.append(pipeline.runs["r"].whole(0.0)["a"].tally.n)
    result(2)
    counts.append(pipeline.runs["r"].whole(0.0)["a"].tally.n)
    return counts


def test_a_resume_starts_the_sequences_over(tmp_path: Path) -> None:
    """What the first part said gone may be run by the resume: from its ``run_started`` on,
    row 2 is awaited again (before: passed over for good, and its result never counted)."""
    assert _gone_then_run(tmp_path, resume=True) == [5, 2, 6]


def test_a_result_for_a_row_passed_over_rebuilds_the_fold(tmp_path: Path) -> None:
    """Without a new ``run_started`` (another producer): the fold that passed row 2 is built
    again once its result comes, so the result counts."""
    assert _gone_then_run(tmp_path, resume=False) == [5, 6]


def test_parts_in_different_orders_are_never_summed() -> None:
    """A processor that has not read a resume's ``run_started`` yet folds in the old order:
    its ladders and the others' have keys of different kinds, so no cut is made."""
    assert cut([Ladder(5, order=True), Ladder(5, order=False)]) is None
    assert cut([Ladder(5, order=True), Ladder(0)]) is not None  # a bound fits either


def test_an_early_stops_run_started_refolds_in_its_order(tmp_path: Path) -> None:
    """Data and control topics are not ordered with each other: before ``run_started`` the
    rows are folded in line order (a fixed order: a valid sequence); once it says the rows
    went out repeat-major, the sequences start over in that order, their floors too."""
    pipeline = Pipeline(tmp_path / "p")
    for line in range(4):
        _feed(pipeline, tmp_path, line, "a", line != 1)
    run = pipeline.runs["r"]
    assert run.whole(0.0)["a"].tally.n == 1 and run.ladders()["input-0"]["a"].order is False
    early = EarlyStop(repeats=1, band=(0.2, 0.8))
    started = RunStarted(run_id="r", expected_rollouts=4, output_stem="r", early_stop=early)
    pipeline.handle("control", encode(started))
    ladder = run.ladders()["input-0"]["a"]
    assert ladder.order is True and ladder.floor == 0
    assert run.whole(0.0)["a"].tally.n == 1


def test_an_agent_whose_rows_are_all_left_out_still_bounds_nothing_forever() -> None:
    """A partition whose rows of an agent all have keys the sequence leaves out (a negative
    task index) still has a ladder for it: with every row known it holds no cut back (before:
    no ladder, so every merge bounded the other agents there at 0 until the final)."""
    state = ProfileState()
    state.add_input(_row(-1, 0, "b"), 0, 0)
    fold = SequenceFold(False)
    fold.update(state, state, rows_known=True)
    assert fold.ladders()["b"].frontier is None


class _Killed(PipelineSink):
    """The in-process pipeline, as a collector killed before its end leaves it: every event
    but ``run_finished``."""

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        if kind == "control" and isinstance(decode_control(value), RunFinished):
            return True
        return await super().send(kind, key, value, where)

    async def close(self, finished: bool) -> None:
        await super().close(False)  # no final: the run is open


async def test_a_resume_says_again_which_rows_stay_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection whose task 0 fails every attempt is killed before its end, then resumed:
    its ``run_started`` starts the sequences over, and the rows that stay without a result
    are said gone again, so the live sequence folds every result before the run ends (before:
    it stopped at task 0's first row until the final)."""
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "1")

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        if row["_ng_task_index"] == 0:
            return web.json_response({"error": "busy"}, status=500)
        return web.json_response({"response": {}, "reward": 1.0} | row)

    runner, url = await serve({"/run": run})
    cfg = _collection(tmp_path, url, 6)
    try:
        with Pipeline(tmp_path / "state") as pipeline:
            await collect(cfg, _Killed(pipeline))
            sink = _LiveAtFinish(pipeline)
            await collect(cfg.model_copy(update={"resume_from_cache": True}), sink)
    finally:
        await runner.cleanup()
    assert sink.live is not None
    assert sink.live[AGENT].tally.n == 10
    assert {(e.task, e.terminal) for e in sink.failed} == {(0, True)}


class _Refusing(_LiveAtFinish):
    """As :class:`_LiveAtFinish`, refusing task 1's rollouts, as Kafka refuses one too large."""

    async def send(self, kind: EventKind, key: bytes, value: bytes, where: str = "") -> bool:
        if kind == "rollout" and key == b"1":
            return False
        return await super().send(kind, key, value, where)


async def test_a_result_the_processors_will_never_have_holds_nothing_back(
    tmp_path: Path,
) -> None:
    """A result written but not published (its event refused) is said gone (``unpublished``),
    so the live sequence folds every result the processors have before the run ends."""

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        return web.json_response({"response": {}, "reward": 1.0} | row)

    runner, url = await serve({"/run": run})
    cfg = _collection(tmp_path, url, 4)
    try:
        with Pipeline(tmp_path / "state") as pipeline:
            sink = _Refusing(pipeline)
            await collect(cfg, sink)
    finally:
        await runner.cleanup()
    assert sink.live is not None and sink.live[AGENT].tally.n == 6
    assert {(e.task, e.failure_class, e.terminal) for e in sink.failed} == {
        (1, "unpublished", True)
    }


def test_parts_of_different_collections_are_never_summed(tmp_path: Path) -> None:
    """A resume's ``run_started`` starts a new epoch (its control-topic offset, the same on
    every processor): a peer that has not read it yet still passes rows the resume will run,
    so its ladders and the others' give no cut."""
    assert cut([Ladder(5, order=False, epoch=0), Ladder(5, order=False, epoch=7)]) is None
    pipeline = Pipeline(tmp_path / "p")
    started = RunStarted(run_id="r", expected_rollouts=1, output_stem="r")
    pipeline.handle("control", encode(started), offset=3)
    _feed(pipeline, tmp_path, 0, "a", True)
    assert pipeline.runs["r"].ladders()["input-0"]["a"].epoch == 0
    pipeline.handle("control", encode(started), offset=9)
    assert pipeline.runs["r"].ladders()["input-0"]["a"].epoch == 9


def test_ladders_cut_to_one_entry_still_reach_every_row() -> None:
    """Two processors whose records carry one entry per ladder (a crowded record): each
    record moves the cuts up, and once every row is done both reach it (before: a part done
    kept its last entries, lowering its frontier to one of them, and the other stayed a row
    short for good)."""
    states = _partitioned(12, 2)
    folds = [SequenceFold(False) for _ in states]
    floors: list[dict[str, float]] = [{}, {}]
    for part, state in enumerate(states):
        for line in range(part, 12, 2):
            _result(state, line, 0, float(line % 3 == 0))
        folds[part].update(state, state, rows_known=True)
    for _ in range(20):
        local = [fold.ladders(floor)["a"] for fold, floor in zip(folds, floors, strict=True)]
        sent = [Ladder(*ladder.plain(1)) for ladder in local]
        for me in (0, 1):
            whole = cut([local[me], sent[1 - me]])
            assert whole is not None
            floors[me]["a"] = max(whole[1], floors[me].get("a", -math.inf))
    local = [fold.ladders(floor)["a"] for fold, floor in zip(folds, floors, strict=True)]
    for me in (0, 1):
        whole = cut([local[me], Ladder(*local[1 - me].plain(1))])
        assert whole is not None and whole[1] == math.inf and whole[0].n == 12
