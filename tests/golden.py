"""The NeMo Gym goldens (``tests/data/golden``, a copy of the project's shared goldens: their
README says where each file comes from) as test cases; ``REWARDSTREAM_GOLDEN`` points
elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

from bench.generate import generate
from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import EventKind, RunFinished, RunStarted, encode
from rewardstream.producers.events import input_events, rollout_events

GOLDEN = Path(
    os.environ.get("REWARDSTREAM_GOLDEN", Path(__file__).resolve().parent / "data" / "golden")
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


def file_events(
    inputs: Path, rollouts: Path, run_id: str, stem: str, finish: bool
) -> list[tuple[EventKind, bytes]]:
    """A collection as wire events: inputs, rollouts, RunStarted, and RunFinished if ``finish``."""
    out = [(e.kind, e.value) for e in input_events(inputs, run_id)]
    n_inputs = len(out)
    out += [(e.kind, e.value) for e in rollout_events(rollouts, run_id)]
    started = RunStarted(run_id=run_id, expected_rollouts=n_inputs, output_stem=stem)
    out.append(("control", encode(started)))
    if finish:
        out.append(("control", encode(RunFinished(run_id=run_id))))
    return out


def golden_events(case: GoldenCase, run_id: str, finish: bool) -> list[tuple[EventKind, bytes]]:
    """A golden case as wire events (see :func:`file_events`)."""
    inputs = case.source / f"{case.stem}_materialized_inputs.jsonl"
    return file_events(inputs, case.source / f"{case.stem}.jsonl", run_id, case.stem, finish)


def generated_collection(
    folder: Path, tasks: int, repeats: int, seed: int, text_bytes: int = 100
) -> tuple[Path, Path]:
    """A generated collection (``folder/r*.jsonl``, three agents) and its batch profile next to
    it, the reference the stream's files are compared with."""
    generate(tasks=tasks, repeats=repeats, out=folder / "r", text_bytes=text_bytes, seed=seed)
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, "+quiet=true"]) == 0
    return inputs, rollouts


def assert_batch_files(folder: Path, data: Path, stem: str = "r") -> None:
    """The three profile files in ``folder`` equal those in ``data``, byte for byte."""
    for suffix in OUTPUT_SUFFIXES:
        name = f"{stem}{suffix}"
        assert (folder / name).read_bytes() == (data / name).read_bytes(), name


def partial_batch_profile(inputs: Path, rollout_lines: list[bytes], out: Path, stem: str) -> None:
    """``ng_reward_profile ++allow_partial_rollouts=True`` on ``rollout_lines`` (a consumed
    prefix), in a new folder ``out``: what a snapshot of those rollouts must equal."""
    out.mkdir()
    shutil.copy(inputs, out / f"{stem}_materialized_inputs.jsonl")
    (out / f"{stem}.jsonl").write_bytes(b"".join(rollout_lines))
    argv = [
        f"+materialized_inputs_jsonl_fpath={out / f'{stem}_materialized_inputs.jsonl'}",
        f"+rollouts_jsonl_fpath={out / f'{stem}.jsonl'}",
        "++allow_partial_rollouts=True",
        "+quiet=true",
    ]
    assert ng_reward_profile(argv) == 0


def profiled_cases() -> list[GoldenCase]:
    """The golden cases that profile (no expected error), none when the goldens are absent."""
    if not GOLDEN.exists():
        return []
    return [c for c in golden_cases() if not (c.expected / "error.txt").exists()]
