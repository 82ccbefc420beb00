"""``gym``: 0.7.0's command names, each flag turned into its override, against the real
commands (a golden profile, shards, the bundled servers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewardstream.commands.gym_cli import main
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.kafka.local import free_port
from tests.golden import OUTPUT_SUFFIXES, profiled_cases
from tests.gym import NgRun, fast, read_jsonl, write_problems

GYM = str(Path(sys.executable).parent / "gym")


def test_eval_profile_is_ng_reward_profile(tmp_path: Path) -> None:
    case = profiled_cases()[0]
    for name in (f"{case.stem}.jsonl", f"{case.stem}_materialized_inputs.jsonl"):
        (tmp_path / name).write_bytes((case.source / name).read_bytes())
    inputs = tmp_path / f"{case.stem}_materialized_inputs.jsonl"
    rollouts = tmp_path / f"{case.stem}.jsonl"
    assert main(["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts)]) == 0
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (tmp_path / name).read_bytes() == (case.expected / name).read_bytes(), name


def test_eval_run_and_aggregate_against_the_servers(tmp_path: Path) -> None:
    src = write_problems(tmp_path / "p.jsonl", 6)
    run = NgRun(*fast())
    try:
        head = f"+head_server_url={run.head_url}"
        args = ["eval", "run", "--no-serve", "-i", str(src), "-o", str(tmp_path / "r-0.jsonl")]
        args += ["--num-repeats", "2", "--concurrency", "4", "--disable-aggregation"]
        assert main([*args, "--no-health-check", head]) == 0
    finally:
        run.stop()
    assert len(read_jsonl(tmp_path / "r-0.jsonl")) == 12
    assert not (tmp_path / "r-0_aggregate_metrics.json").exists()
    out = tmp_path / "all" / "r.jsonl"
    assert main(["eval", "aggregate", "-i", f"{tmp_path}/r-*.jsonl", "-o", str(out)]) == 0
    assert len(read_jsonl(out)) == 12 and (tmp_path / "all" / "r_aggregate_metrics.json").exists()


def test_env_start_is_ng_run() -> None:
    port = free_port()
    argv = [GYM, "env", "start", "--config", str(BUNDLED_CONFIG), f"+head_server.port={port}"]
    with subprocess.Popen(
        [*argv, *fast()], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 60
            line = ""
            while not line.startswith("All "):
                line = proc.stdout.readline()
                assert line or proc.poll() is None
                assert time.monotonic() < deadline
            ready = f"All 4 servers ready! Head server: http://127.0.0.1:{port}"
            assert line.startswith(ready)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "run", "--no-serve", "--benchmark", "aime"], "unrecognized arguments"),
        (["eval", "nothing"], "invalid choice"),
    ],
)
def test_what_it_does_not_know_is_an_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_serving_end_to_end_takes_no_input(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --no-serve it is ng_e2e_collect_rollouts, whose input is always the prepared
    split (0.7.0's refusal)."""
    assert main(["eval", "run", "--split", "train", "-i", "x", "-o", "o.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "`input_jsonl_fpath` (-i/--input) is not supported when serving end-to-end" in err
