"""``ng_e2e_collect_rollouts``: the split a config declares prepared, its servers started, the
collection run on the prepared file, the servers stopped; 0.7.0's refusals, before anything is
written. (The prepared file and its materialized rows against 0.7.0's own:
``tests/test_nemo_interop.py``.)"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.kafka.local import free_port
from rewardstream.producers.gym.e2e import main
from tests.gym import POLICY, fast, read_jsonl

CONFIG = f"+config_paths=[{BUNDLED_CONFIG}]"


def _e2e(*overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rewardstream.producers.gym.e2e", CONFIG, *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_it_prepares_serves_collects_and_stops(tmp_path: Path) -> None:
    port = free_port()
    run = ["+split=train", "+output_jsonl_fpath=out/r.jsonl", "+limit=6", "+num_repeats=2"]
    run += [f"+head_server.port={port}", *fast(f"{POLICY}.seed=3")]
    done = _e2e(*run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    prepared = tmp_path / "out" / "r" / "preprocessed_datasets" / "train.jsonl"
    assert (
        "2. Dataset file used for rollout collection: out/r/preprocessed_datasets/train.jsonl"
        in done.stdout
    )
    rows = read_jsonl(prepared)
    assert len(rows) == 300 and {r["task_source"] for r in rows} == {"arithmetic_simple_agent"}
    assert all("agent_ref" not in r for r in rows)
    inputs = read_jsonl(tmp_path / "out" / "r_materialized_inputs.jsonl")
    assert len(inputs) == 12
    assert all(r["agent_ref"] == {"name": "arithmetic_simple_agent"} for r in inputs)
    assert len(read_jsonl(tmp_path / "out" / "r.jsonl")) == 12
    assert (tmp_path / "out" / "r_aggregate_metrics.json").exists()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the servers stopped with it
    before = prepared.stat().st_mtime_ns
    again = _e2e(*run, "+reuse_existing_data_preparation=true", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Skipping data preparation since `reuse_existing_data_preparation=true`" in again.stdout
    assert prepared.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+split=example"], "`--split example` is not runnable end-to-end"),
        (["+split=valid"], "invalid configuration 'split'"),
        (["+split=train", "+input_jsonl_fpath=x.jsonl"], "`input_jsonl_fpath` (-i/--input)"),
        (["+split=validation"], "No dataset of type `validation` is declared in this config"),
        (["+split=train", "+output_jsonl_fpath=o/r.jsonl", "+num_repeats=0"], "num_repeats"),
    ],
)
def test_what_it_refuses_leaves_nothing(
    overrides: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    output = [] if any("output" in o for o in overrides) else ["+output_jsonl_fpath=o/r.jsonl"]
    assert main([CONFIG, *overrides, *output]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert list(tmp_path.iterdir()) == []
