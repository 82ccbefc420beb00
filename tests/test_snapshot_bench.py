"""bench/snapshot_bench.py: it runs end to end, and ``--stages`` times each stage of the
snapshot's work."""

from __future__ import annotations

import re

import pytest

from bench import snapshot_bench


def test_the_bench_times_each_stage(capsys: pytest.CaptureFixture[str]) -> None:
    snapshot_bench.main(["--tasks", "200", "--repeats", "4", "--runs", "1", "--stages"])
    out = capsys.readouterr().out
    stages = re.search(r"stages \(CPU, serial\): build \S+ s, 200 task rows .* us a row", out)
    assert stages is not None, out
    assert "snapshot in process" in out
    assert re.search(r"rewardstream snapshot of 600: ", out), out
