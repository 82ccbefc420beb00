"""The shared NeMo Gym goldens (``../shared/golden``) as test cases."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import orjson

from processors.pipeline import EventKind
from processors.records import agent_of, slim_result
from processors.state import row_key
from rewardstream.contract import InputEvent, RolloutEvent, RunFinished, RunStarted, encode

GOLDEN = Path(
    os.environ.get("REWARDSTREAM_GOLDEN", Path(__file__).resolve().parents[2] / "shared" / "golden")
)
OUTPUT_SUFFIXES = ("_reward_profiling.jsonl", "_agent_metrics.json", "_repeat_level_metrics.json")


class GoldenCase(NamedTuple):
    """One golden set: where its two inputs live, their stem, and the expected folder."""

    name: str
    source: Path
    stem: str
    expected: Path

    def copy_inputs(self, dest: Path) -> tuple[Path, Path]:
        """Copy the two inputs into ``dest``; returns (materialized inputs, rollouts)."""
        inputs = dest / f"{self.stem}_materialized_inputs.jsonl"
        rollouts = dest / f"{self.stem}.jsonl"
        shutil.copy(self.source / inputs.name, inputs)
        shutil.copy(self.source / rollouts.name, rollouts)
        return inputs, rollouts


def golden_cases() -> list[GoldenCase]:
    """Every (set, mode) pair with an expectation in ``expected_pypi_0.7.0``."""
    cases = []
    sets = [
        (
            name,
            GOLDEN / name / "upstream",
            "example_rollouts",
            GOLDEN / name / "expected_pypi_0.7.0",
        )
        for name in ("blackjack", "longmt_eval", "circle_click", "asr_with_pc")
    ]
    edge = GOLDEN / "edge_cases"  # callers check GOLDEN exists
    sets += [
        (c.name, c, "rollouts", c / "expected_pypi_0.7.0")
        for c in sorted(edge.iterdir())
        if edge.exists()
    ]
    for name, source, stem, expected in sets:
        cases.append(GoldenCase(name, source, stem, expected))
        if (expected / "allow_partial").exists():
            cases.append(
                GoldenCase(f"{name}+allow_partial", source, stem, expected / "allow_partial")
            )
    return cases


def golden_events(case: GoldenCase, run_id: str, finish: bool) -> list[tuple[EventKind, bytes]]:
    """The case as wire events: inputs, rollouts, RunStarted, and RunFinished when ``finish``."""
    inputs = (case.source / f"{case.stem}_materialized_inputs.jsonl").read_bytes().splitlines()
    results = (case.source / f"{case.stem}.jsonl").read_bytes().splitlines()
    out: list[tuple[EventKind, bytes]] = [
        ("input", encode(InputEvent(run_id=run_id, line=i, row=orjson.loads(r))))
        for i, r in enumerate(inputs)
    ]
    for line in results:
        result = orjson.loads(line)
        task, rollout = row_key(result)
        event = RolloutEvent(
            run_id=run_id,
            task=task,
            rollout=rollout,
            agent=agent_of(result),
            result=slim_result(result),
            published_at=time.time(),
        )
        out.append(("rollout", encode(event)))
    started = RunStarted(run_id=run_id, expected_rollouts=len(inputs), output_stem=case.stem)
    out.append(("control", encode(started)))
    if finish:
        out.append(("control", encode(RunFinished(run_id=run_id))))
    return out
