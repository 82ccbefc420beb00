"""bench/sequence_bench.py: it runs, and a fold that stalls (a planted fault) is reported."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench import sequence_bench
from rewardstream.processors.core.sequence import SequenceFold

# A summary every 1,000: the floor's batch then costs 3-6x an idle update (0.17-0.29x measured),
# where every 100 left 1.8x (0.55x), within what three test workers on two cores do to one
# timing against another (1.09x seen once): the judge's bound is the bench's, unchanged.
EVERY = ["--tasks", "300", "--every", "1000", "--runs", "1"]


def test_the_bench_folds_every_rollout(capsys: pytest.CaptureFixture[str]) -> None:
    assert sequence_bench.main(EVERY) == 0
    assert "dispatch-order fold" in capsys.readouterr().out


def test_a_stalled_fold_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    passable = SequenceFold._passable

    def stalled(self: SequenceFold, rows: np.ndarray, *args: object) -> np.ndarray:
        out: np.ndarray = passable(self, rows, *args)  # type: ignore[arg-type]
        out[rows == 7] = False  # row 7's result never counts: the fold stops there
        return out

    monkeypatch.setattr(SequenceFold, "_passable", stalled)
    assert sequence_bench.main(["--tasks", "300", "--every", "100", "--runs", "1"]) == 1
    assert "FINDING: the fold saw 7 of 2400" in capsys.readouterr().err


def test_a_costly_idle_update_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An update with nothing new is timed against the floor; one that costs what is gone
    (planted: 2 ms per window, as rebuilding the gone rows' arrays cost) is a finding."""
    assert sequence_bench.main(EVERY) == 0
    assert "an update with nothing new, 2,399 rows gone" in capsys.readouterr().out
    passable = SequenceFold._passable

    def costly(self: SequenceFold, rows: np.ndarray, *args: object) -> np.ndarray:
        time.sleep(0.002)
        out: np.ndarray = passable(self, rows, *args)  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(SequenceFold, "_passable", costly)
    assert sequence_bench.main(EVERY) == 1
    assert "FINDING: a no-op update costs more" in capsys.readouterr().err
