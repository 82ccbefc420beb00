"""``rewardstream replay``: the embedded pipeline writes the batch profiler's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardstream.commands.cli import main
from tests.golden import GOLDEN, OUTPUT_SUFFIXES, GoldenCase, golden_cases

# Streaming finishes incomplete runs with the partial rule, so strict-mode error cases are
# compared with their allow_partial expectation; duplicates are dropped, extras stay an error.
CASES = (
    [c for c in golden_cases() if not c.name.endswith("+allow_partial")] if GOLDEN.exists() else []
)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_replay_equals_batch(
    case: GoldenCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = case.copy_inputs(tmp_path)
    out = tmp_path / "out"
    argv = [
        "replay",
        "--inputs",
        str(inputs),
        "--rollouts",
        str(rollouts),
        "--output-dir",
        str(out),
    ]
    expected = case.expected
    if case.name == "duplicate_result":  # a result's key again, other content: a conflict
        assert main(argv) == 2
        assert "(conflict): run 'rollouts' task 0 rollout 0" in capsys.readouterr().err
        assert not out.exists() or not any(out.rglob("*_reward_profiling.jsonl"))
        return
    if case.name == "extra_row":  # a result without an input row stays an error
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "(unknown-key)" in err and "no matching materialized input row" in err
        return
    if (expected / "error.txt").exists():
        expected = expected / "allow_partial"
    assert main(argv) == 0
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (out / case.stem / name).read_bytes() == (expected / name).read_bytes(), name


def test_replay_names_a_bad_run_id_or_stem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "my run_materialized_inputs.jsonl"
    rollouts = tmp_path / "my run.jsonl"
    inputs.write_bytes(b'{"_ng_task_index":0,"_ng_rollout_index":0}\n')
    rollouts.write_bytes(b'{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":0}\n')
    argv = ["replay", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    argv += ["--output-dir", str(tmp_path / "out")]
    assert main([*argv, "--run-id", "../x"]) == 2
    assert "invalid run_id '../x'" in capsys.readouterr().err
    assert main(argv) == 2  # the stem has a space: not a valid output stem
    assert "invalid output_stem 'my run'" in capsys.readouterr().err
