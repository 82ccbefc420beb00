"""bench/checkpoint_bench.py can fail: against a real broker, part checkpoints written to a
compacted topic restore to the replayed state exactly (columns, digests, counts), also beside
the leftover chunk of an older checkpoint; a checkpoint with a chunk missing or corrupted is
refused, never restored."""

from __future__ import annotations

from pathlib import Path

from bench.checkpoint_bench import planted


def test_checkpoints_restore_exactly_and_broken_ones_are_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    outcomes = planted(kafka_bootstrap, tmp_path / "work")
    assert outcomes[""] == ([], []), outcomes[""]
    assert outcomes["leftover"] == ([], []), outcomes["leftover"]
    refused, found = outcomes["missing"]
    assert refused and all("chunks" in line for line in refused), refused
    assert found, "a refused part is reported as not restored"
    refused, found = outcomes["corrupt"]
    assert any("CRC-32 differs" in line for line in refused), refused
    assert found
