"""The agent sequence in dispatch order (:mod:`rewardstream.processors.core.sequence`): folded a
prefix at a time whatever order results come in, cut across parts at their lowest frontier so
the union is a prefix of the run's dispatch order, and exact against a plain :class:`Tally` fed
that prefix; and, through the engine, an interval that right-first arrivals cannot tilt."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract.events import RunStarted, encode
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.sequence import (
    Ladder,
    SequenceFold,
    cut,
    dispatch_keys,
    final_tallies,
)
from rewardstream.processors.core.state import ProfileState
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.producers.events import input_event, rollout_event


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
    """A row failed for good, a task an early stop skipped, and (once complete) any row left
    without a result are passed over; a row merely waiting holds its part's frontier."""
    (state,) = _partitioned(6, 1)
    for line in (0, 2, 4, 5):
        _result(state, line, 0, 1.0)
    fold = SequenceFold(False)
    fold.update(state, state, rows_known=True)
    assert fold.ladders()["a"].frontier == 1 and fold.ladders()["a"].at(math.inf)[0] == 1
    fold.update(state, state, gone={(1, 0)}, rows_known=True)
    assert fold.ladders()["a"].frontier == 3
    fold.update(state, state, gone={(1, 0)}, gone_tasks={3}, rows_known=True)
    ladder = fold.ladders()["a"]
    assert ladder.frontier is None and ladder.at(math.inf)[0] == 4
    late = SequenceFold(False)
    late.update(state, state, complete=True)
    assert late.ladders()["a"].at(math.inf)[0] == 4


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
