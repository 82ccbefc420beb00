"""``rewardstream demo``: its profile equals ``ng_reward_profile`` on the files it wrote."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rewardstream.commands.cli import main, ng_reward_profile
from tests.golden import OUTPUT_SUFFIXES
from tests.gym import keys, read_jsonl


def _check(out: Path, work: Path, rows: int) -> None:
    inputs, rollouts = out / "rollouts_materialized_inputs.jsonl", out / "rollouts.jsonl"
    assert len(read_jsonl(inputs)) == rows
    assert sorted(keys(read_jsonl(rollouts))) == sorted(keys(read_jsonl(inputs)))
    batch = work / "batch"
    batch.mkdir()
    shutil.copy(inputs, batch / inputs.name)
    shutil.copy(rollouts, batch / rollouts.name)
    args = [f"+materialized_inputs_jsonl_fpath={batch / inputs.name}"]
    args += [f"+rollouts_jsonl_fpath={batch / rollouts.name}", "+quiet=true"]
    assert ng_reward_profile(args) == 0
    for suffix in OUTPUT_SUFFIXES:
        name = f"rollouts{suffix}"
        assert (out / name).read_bytes() == (batch / name).read_bytes(), name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no state left behind


def test_demo_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), "--limit", "60", "--repeats", "3"]) == 0
    stdout = capsys.readouterr().out
    assert "demo: 180 rollouts of 180 rows collected" in stdout
    _check(out, tmp_path, 180)


@pytest.mark.kafka
def test_demo_through_kafka(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "demo"
    argv = ["demo", "--output-dir", str(out), "--limit", "40", "--repeats", "2"]
    argv += ["--bootstrap", kafka_bootstrap, "--topic-prefix", unique_name("demo")]
    assert main(argv) == 0
    assert "demo: 80 rollouts of 80 rows collected" in capsys.readouterr().out
    _check(out, tmp_path, 80)
