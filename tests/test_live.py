"""Whole-run live summaries (:mod:`rewardstream.processors.engine.live`): the summaries of a run's
parts, merged, equal the summary of the run held in one part; they survive the member record's
wire form; failed attempts are counted once each; the history stays bounded."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import orjson
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rewardstream.contract.engine import (
    AgentProgress,
    FinalRecord,
    MemberRecord,
    UnitProgress,
    decode_final,
    decode_member,
    encode_record,
)
from rewardstream.contract.events import AttemptFailed, RunFinished, encode
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.profile import TOKEN_BINS
from rewardstream.processors.engine.live import (
    AgentLive,
    History,
    final_agents,
    final_figures,
    of_state,
)
from rewardstream.processors.engine.pipeline import Pipeline, RemoteUnit
from rewardstream.processors.engine.runs import FIGURES_EVERY, Counts, Done, merge_parts
from rewardstream.processors.http.page import LiveView
from rewardstream.processors.inprocess import finish
from rewardstream.sinks.metrics import Metrics
from tests.golden import file_events, generated_collection


def _pipeline(tmp_path: Path, name: str, units: int) -> Pipeline:
    """A generated run fed into ``units`` units, split by task as Kafka partitions it."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=60, repeats=5, seed=3)
    pipeline = Pipeline(tmp_path / name)
    for kind, raw in file_events(inputs, rollouts, "r", "r", False):
        if kind == "control":
            pipeline.handle(kind, raw)
            continue
        body = orjson.loads(raw)
        task = body["task"] if kind == "rollout" else body["row"]["_ng_task_index"]
        pipeline.handle(kind, raw, f"{kind}-{task % units}")
    return pipeline


def _close(a: AgentLive, b: AgentLive, sequence: bool = True) -> None:
    """``a`` and ``b`` show the same figures; with ``sequence``, the same count and total in
    their confidence sequences (without: ``a`` is a live view mid-run, whose sequence stops at
    the first row still waiting, so it holds at most ``b``'s)."""
    assert (a.rollouts, a.tasks, a.single, a.scored, a.zero_variance) == (
        b.rollouts,
        b.tasks,
        b.single,
        b.scored,
        b.zero_variance,
    )
    assert (a.histogram, a.below, a.above) == (b.histogram, b.below, b.above)
    assert a.reward.count == b.reward.count
    for field in ("mean", "m2", "min", "max"):
        assert math.isclose(getattr(a.reward, field), getattr(b.reward, field), rel_tol=1e-12)
    assert a.passes.keys() == b.passes.keys()
    for k, (total, n) in a.passes.items():
        assert n == b.passes[k][1] and math.isclose(total, b.passes[k][0], rel_tol=1e-12)
    assert a.tokens.keys() == b.tokens.keys()
    for bin_, (n, total) in a.tokens.items():
        assert n == b.tokens[bin_][0] and math.isclose(total, b.tokens[bin_][1], rel_tol=1e-12)
    # the sequence's sums: the variance process depends on the order folded, not the rest
    if not sequence:
        assert a.tally.n <= b.tally.n == b.rollouts and a.tally.outside == b.tally.outside == 0
        return
    assert (a.tally.n, a.tally.outside) == (b.tally.n, b.tally.outside) == (a.rollouts, 0)
    assert math.isclose(a.tally.total, b.tally.total, rel_tol=1e-12)


def test_parts_merged_equal_the_run_in_one_part(tmp_path: Path) -> None:
    with _pipeline(tmp_path, "one", 1) as one, _pipeline(tmp_path, "four", 4) as four:
        whole, merged = one.runs["r"].whole(0.0), four.runs["r"].whole(0.0)
        assert len(four.runs["r"].parts) == 8  # inputs and rollouts of four units
        assert whole.keys() == merged.keys() and len(whole) == 3
        for agent in whole:
            _close(whole[agent], merged[agent])
            assert whole[agent].tasks == 20 and whole[agent].passes[4][1] == 20


def test_reward_by_output_tokens_is_read_from_the_results(tmp_path: Path) -> None:
    """Each rollout lands in its power-of-two bin of ``response.usage.output_tokens``, with its
    reward: the same sums computed here from the rollouts file."""
    expected: dict[str, dict[int, list[float]]] = {}
    with _pipeline(tmp_path, "one", 1) as one:
        for line in (tmp_path / "data" / "r.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            tokens = row["response"]["usage"]["output_tokens"]
            bin_ = 0 if tokens < 1 else min(int(math.log2(tokens)) + 1, TOKEN_BINS - 1)
            held = expected.setdefault(row["agent_ref"]["name"], {}).setdefault(bin_, [0, 0.0])
            held[0] += 1
            held[1] += row["reward"]
        whole = one.runs["r"].whole(0.0)
        for agent, bins in expected.items():
            got = whole[agent].tokens
            assert got.keys() == bins.keys() and len(bins) > 1
            for bin_, (n, total) in bins.items():
                assert got[bin_][0] == n and math.isclose(got[bin_][1], total, rel_tol=1e-12)
            shown = whole[agent].view(0.95)["reward_by_output_tokens"]
            assert sum(b["rollouts"] for b in shown) == whole[agent].rollouts


def test_a_done_run_shows_its_final_figures_exactly(tmp_path: Path) -> None:
    """The final carries the whole run's figures from the merged state, so a done run's view
    is exact (no part's figures, renewed every few seconds, stand in for them)."""
    with _pipeline(tmp_path, "one", 4) as pipeline:
        run = pipeline.runs["r"]
        expected = of_state(merge_parts(run.parts[n] for n in sorted(run.parts)).state)
        pipeline.handle("control", encode(RunFinished(run_id="r")))
        assert finish(pipeline, run) is not None and run.terminal is not None
        assert run.terminal.agents is not None
        whole = run.whole(0.0)
        assert whole.keys() == expected.keys()
        for agent, live in expected.items():
            _close(whole[agent], live)


def test_a_summary_survives_the_member_record(tmp_path: Path) -> None:
    with _pipeline(tmp_path, "one", 1) as one:
        for live in one.runs["r"].whole(0.0).values():
            wire = AgentProgress.model_validate_json(orjson.dumps(live.to_wire().model_dump()))
            _close(AgentLive.from_wire(wire), live)


def test_the_mean_interval_is_the_sequence_over_the_rows_in_dispatch_order(
    tmp_path: Path,
) -> None:
    """The rollouts are folded in the order their rows were dispatched (the materialized
    inputs' lines), not as they came, each partition on its own (its centres are its own
    running mean): over four units the whole run's tally is the sum of a :class:`Tally` per
    partition fed its rows' rewards in line order, and the view shows its interval."""
    with _pipeline(tmp_path, "four", 4) as four:
        run = four.runs["r"]
        partition = {
            int(task): name
            for name, part in run.parts.items()
            if name.startswith("input-")
            for task in part.state.in_task
        }
        rewards = {}
        for line in (tmp_path / "data" / "r.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            rewards[row["_ng_task_index"], row["_ng_rollout_index"]] = float(row["reward"])
        parts: dict[tuple[str, str], Tally] = {}
        for line in (tmp_path / "data" / "r_materialized_inputs.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            key = (row["_ng_task_index"], row["_ng_rollout_index"])
            agent = row["agent_ref"]["name"]
            parts.setdefault((agent, partition[key[0]]), Tally()).add(rewards[key])
        expected: dict[str, Tally] = {}
        for (agent, _), tally in sorted(parts.items()):
            expected.setdefault(agent, Tally()).merge(tally)
        assert len({name for _, name in parts}) == 4
        whole = run.whole(0.0)
        assert whole.keys() == expected.keys()
        for agent, tally in expected.items():
            got = whole[agent].tally
            assert (got.n, got.outside) == (tally.n, 0) and whole[agent].cut_at == math.inf
            assert math.isclose(got.total, tally.total, rel_tol=1e-12)
            assert math.isclose(got.spread, tally.spread, rel_tol=1e-9)
            reward = whole[agent].view(0.95)["reward"]
            interval = reward["interval"]
            assert interval["level"] == 0.95 and interval["range"] == [0.0, 1.0]
            assert interval["lower"] < reward["mean"] < interval["upper"]


def test_a_reward_outside_the_range_withdraws_the_interval(tmp_path: Path) -> None:
    live = AgentLive(tally=Tally())
    live.tally.add_many(np.array([0.0, 1.0, 0.5]))
    assert live.interval(0.95)["lower"] is not None
    live.tally.add(2.5)
    assert live.interval(0.95) | {"range": None} == {
        "level": 0.95,
        "range": None,
        "lower": None,
        "upper": None,
        "outside": 1,
        "sums": [3, 1.5, live.tally.spread],
    }


def test_the_sums_rebuild_the_interval_at_any_level() -> None:
    """``sums`` with ``range`` and ``outside`` are the whole tally: a client's rebuilt one
    gives the view's interval, and one at another level (what ``rewardstream compare`` does)."""
    live = AgentLive(tally=Tally(lo=-1.0, hi=2.0))
    live.tally.add_many(np.array([0.0, 1.5, 0.5, -1.0, 2.0, 0.25]))
    shown = orjson.loads(orjson.dumps(live.interval(0.95)))
    (lo, hi), (n, total, spread) = shown["range"], shown["sums"]
    rebuilt = Tally(lo, hi, n, total, spread, shown["outside"])
    assert rebuilt == live.tally
    assert rebuilt.interval() == (shown["lower"], shown["upper"])
    assert rebuilt.interval(0.975) == live.tally.interval(0.975)


def test_an_older_processors_summary_has_no_interval_sums() -> None:
    """A member record of a processor without confidence sequences reads as an empty tally."""
    raw = AgentLive(rollouts=3).to_wire().model_dump()
    del raw["tally"]
    read = AgentLive.from_wire(AgentProgress.model_validate(raw))
    assert read.tally == Tally() and read.interval(0.95)["lower"] is None


def test_figures_are_computed_again_at_most_every_few_seconds(tmp_path: Path) -> None:
    with _pipeline(tmp_path, "one", 1) as one:
        part = one.runs["r"].parts["rollout-0"]
        first = part.summary(100.0)
        part._figures = (0, 100.0, part._figures[2])  # as if rollouts came since
        assert part.summary(100.0 + FIGURES_EVERY / 2) == first  # the same figures, kept
        assert part._figures[0] == 0
        part.summary(100.0 + FIGURES_EVERY)
        assert part._figures[0] == part.rollouts


def test_failed_attempts_count_once_each(tmp_path: Path) -> None:
    with _pipeline(tmp_path, "one", 1) as pipeline:
        events = [
            AttemptFailed(run_id="r", task=1, rollout=0, agent="a", failure_class="x"),
            AttemptFailed(run_id="r", task=1, rollout=0, attempt=1, agent="a", failure_class="x"),
            AttemptFailed(run_id="r", task=2, rollout=0, failure_class="agent_request_failed"),
        ]
        for event in [*events, events[0]]:  # redelivered: once
            pipeline.handle("control", encode(event))
        run = pipeline.runs["r"]
        assert run.failures == {"a": {"x": 2}, "": {"agent_request_failed": 1}}
        assert run.failed_attempts == 3
        bad = orjson.dumps(orjson.loads(encode(events[0])) | {"failure_class": "no spaces"})
        assert pipeline.handle("control", bad) is None  # rejected with its reason


def test_history_is_bounded_and_thinned() -> None:
    history = History(every=1.0, limit=10)
    assert history.add(0.0, {"rollouts": 0}) and not history.add(0.5, {"rollouts": 1})
    for t in range(1, 100):
        history.add(float(t), {"rollouts": t})
    assert len(history.points) <= 10 and history.every > 1.0
    ats = [p["at"] for p in history.points]
    assert ats == sorted(ats) and ats[0] == 0.0 and ats[-1] >= 90


def test_peers_summaries_join_the_view_and_gaps_are_named(tmp_path: Path) -> None:
    """A peer's unit with a summary joins the whole-run view; one whose owner holds rollouts
    but sent no summary is named in the view, never silently left out; once the run is done,
    its final record's figures are the view (the peers' records drop the run)."""
    with _pipeline(tmp_path, "one", 1) as pipeline:
        run = pipeline.runs["r"]
        mine = run.whole(0.0)
        peer = {agent: AgentLive.from_wire(s.to_wire()) for agent, s in mine.items()}
        pipeline.set_remote(
            {
                "rollout-1": RemoteUnit(5, {"r": Counts(0, 300)}, {"r": peer}),
                "rollout-2": RemoteUnit(5, {"r": Counts(0, 7)}, {}),
            }
        )
        view = LiveView(pipeline).detail(run)
        assert view["partitions_missing"] == ["rollout-2"]
        agent = next(iter(mine))
        assert view["agents"][agent]["rollouts"] == 2 * mine[agent].rollouts
        final = {a: AgentLive.from_wire(s.to_wire()) for a, s in run.whole(0.0).items()}
        run.terminal = Done(0, 0, {}, {}, "r", False, final)
        pipeline.set_remote({})  # the peers' records no longer carry the done run
        assert run.whole(0.0)[agent].rollouts == 2 * mine[agent].rollouts


class _Clock:
    """The engine's clock, moved by hand: states change without waiting for real time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_replayed_run_is_dated_by_its_events_but_not_evicted_for_their_age(
    tmp_path: Path,
) -> None:
    """A restarted processor replays a live run from its oldest events: their Kafka times date
    the run (stalled, its last event two hours ago), but eviction counts from when this
    process read them (a live run older than ``--evict-after`` was evicted by the first
    replayed batch, and never got a final)."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=5, repeats=2, seed=4)
    *data, started = file_events(inputs, rollouts, "r", "r", False)
    clock = _Clock()
    two_hours_ago = int((time.time() - 7200) * 1000)  # a Kafka timestamp, ms since the epoch
    with Pipeline(tmp_path / "out", stall_after=60.0, clock=clock) as pipeline:
        for offset, (kind, raw) in enumerate([started, *data]):
            pipeline.handle(kind, raw, None, offset, two_hours_ago)
        run = pipeline.runs["r"]
        assert pipeline.state(run) == "stalled" and pipeline.idle(run) >= 7200
        assert pipeline.idle_runs(3600) == []  # read just now: not idle here
        clock.now += 3601
        assert pipeline.idle_runs(3600) == [run]  # nothing read for an hour: evictable


def test_a_run_without_events_stalls_and_resumes(tmp_path: Path) -> None:
    """An open run with no event for ``stall_after`` seconds is stalled (rate 0, no ETA, its
    age in /metrics) until an event of it comes, or a peer says it consumed some; a finished
    run never stalls."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=20, repeats=2, seed=4)
    *data, started = file_events(inputs, rollouts, "r", "r", False)
    clock = _Clock()
    with Pipeline(tmp_path / "out", stall_after=30.0, clock=clock) as pipeline:
        view = LiveView(pipeline)
        metrics = Metrics(lambda: pipeline.runs, clock=clock)
        for kind, raw in [started, *data[:-5]]:
            pipeline.handle(kind, raw)
        run = pipeline.runs["r"]

        def shown() -> tuple[str, float | None, float | None, int | None]:
            s = view.summary(run)
            return s["state"], s["rate"], s["eta_seconds"], s["last_event_seconds"]

        def age() -> float | None:
            name = "rewardstream_run_last_event_age_seconds"
            return metrics.registry.get_sample_value(name, {"run_id": "r"})

        assert shown()[0] == "open" and shown()[3] == 0 and age() == 0.0
        clock.now += 29.5
        assert shown()[0] == "open"
        clock.now += 0.5
        assert shown() == ("stalled", 0.0, None, 30) and age() == 30.0
        pipeline.handle(*data[-5])  # events resume
        assert shown()[0] == "open" and age() == 0.0
        clock.now += 45
        assert shown()[0] == "stalled"
        pipeline.set_remote({"rollout-1": RemoteUnit(3, {"r": Counts(0, 3)}, {})})  # a peer's
        assert shown()[0] == "open"
        clock.now += 30
        pipeline.set_remote({"rollout-1": RemoteUnit(3, {"r": Counts(0, 3)}, {})})  # the same
        assert shown()[0] == "stalled"
        pipeline.handle("control", encode(RunFinished(run_id="r")))
        clock.now += 3600
        assert shown()[0] == "finished"


def test_a_final_runs_metrics_are_its_final_records_whatever_parts_are_held(
    tmp_path: Path,
) -> None:
    """Completion, reward gauges, tasks and duplicates of a final run are the final's, the
    same after this processor lost units of it (or never held any) as before."""
    with _pipeline(tmp_path, "one", 4) as pipeline:
        run = pipeline.runs["r"]
        pipeline.handle("control", encode(RunFinished(run_id="r")))
        assert finish(pipeline, run) is not None and run.terminal is not None
        assert run.terminal.agents is not None
        metrics = Metrics(lambda: pipeline.runs)

        def sample(name: str, **labels: str) -> float | None:
            return metrics.registry.get_sample_value(name, {"run_id": "r", **labels})

        final = {a: live.reward for a, live in run.terminal.agents.items()}
        intervals = {a: live.interval(0.95) for a, live in run.terminal.agents.items()}
        for name in ("input-1", "rollout-1", "input-2", "rollout-2"):
            pipeline.release(name)  # lost in a rebalance: a quarter of the run is left here
        assert 0 < run.local_rollouts < run.rollouts
        assert sample("rewardstream_run_completion_ratio") == 1.0
        assert sample("rewardstream_run_tasks_complete") == 60
        for agent, reward in final.items():
            assert sample("rewardstream_reward_mean", agent=agent) == reward.mean
            assert sample("rewardstream_reward_count", agent=agent) == reward.count
            assert sample("rewardstream_tasks", agent=agent, kind="scored") == 20
            for side in ("lower", "upper"):
                got = sample(f"rewardstream_reward_mean_{side}", agent=agent, level="0.95")
                assert got == intervals[agent][side]
            assert intervals[agent]["lower"] < reward.mean < intervals[agent]["upper"]
        assert LiveView(pipeline).summary(run)["duplicates_dropped"] == 0


def test_a_final_run_keeps_every_task_series_it_showed_while_open(tmp_path: Path) -> None:
    """Task difficulty by kind (all_max and all_min included) and the per-task mean reward
    histogram of a final run are what one processor holding the whole run showed while it was
    open (the final's, exact), after it lost units of the run, and as a processor that never
    held any reads them from the final record's wire form."""
    with _pipeline(tmp_path, "one", 4) as pipeline:
        run = pipeline.runs["r"]
        metrics = Metrics(lambda: pipeline.runs)

        def tasks(registry: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            text = generate_latest(registry.registry).decode()
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                if family.name in ("rewardstream_tasks", "rewardstream_task_mean_reward")
                for s in family.samples
            }

        shown = tasks(metrics)
        kinds = {labels for name, labels in shown if name == "rewardstream_tasks"}
        assert {dict(k)["kind"] for k in kinds} >= {"all_max", "all_min"}
        assert any(name == "rewardstream_task_mean_reward_bucket" for name, _ in shown)
        pipeline.handle("control", encode(RunFinished(run_id="r")))
        assert finish(pipeline, run) is not None and run.terminal is not None
        assert tasks(metrics) == shown
        for name in ("input-1", "rollout-1", "input-2", "rollout-2"):
            pipeline.release(name)
        assert tasks(metrics) == shown
        assert run.terminal.agents is not None
        record = FinalRecord(
            prefix="p",
            group="g",
            run_id="r",
            state="final",
            stem="r",
            partial=False,
            inputs=run.inputs,
            rollouts=run.rollouts,
            expected=run.expected,
            units={},
            written_by="m",
            at=0.0,
            **final_figures(run.terminal.agents),
        )
        wire = decode_final(encode_record(record), "p")
        with Pipeline(tmp_path / "none") as other:
            other.mark_final("r", Done(0, 0, {}, {}, "r", agents=final_agents(wire)))
            assert tasks(Metrics(lambda: other.runs)) == shown
        older = {k: v for k, v in orjson.loads(encode_record(record)).items() if k != "spread"}
        agents = final_agents(decode_final(orjson.dumps(older), "p"))  # an older processor's
        assert agents is not None and all(a.spread is None for a in agents.values())


def test_member_records_carry_duplicates_and_older_ones_are_read() -> None:
    """A unit's per-run counts are [inputs, rollouts, duplicates]; a record of an older
    processor, [inputs, rollouts], is read with no duplicates."""
    unit = UnitProgress(position=9, runs={"r": (4, 5, 2)})
    record = MemberRecord(
        prefix="p", group="g", member="m", generation=1, url=None, units={}, at=0.0
    )
    raw = orjson.loads(encode_record(record.model_copy(update={"units": {"input-0": unit}})))
    assert Counts(*decode_member(orjson.dumps(raw), "p").units["input-0"].runs["r"]) == (4, 5, 2)
    raw["units"]["input-0"]["runs"]["r"] = [4, 5]
    older = decode_member(orjson.dumps(raw), "p").units["input-0"].runs["r"]
    assert Counts(*older) == Counts(4, 5, 0)
