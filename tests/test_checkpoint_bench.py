"""bench/checkpoint_bench.py can fail: against a real broker, checkpoints the processor's
Changelog writes restore to the replayed state exactly (columns, digests, counts, held
rollouts, keys), also among another group's records; a checkpoint with a chunk missing or
corrupted is refused, never restored; a restored part keeping its checkpoint in memory is
found."""

from __future__ import annotations

from pathlib import Path

from bench.checkpoint_bench import planted


def test_checkpoints_restore_exactly_and_broken_ones_are_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    outcomes = planted(kafka_bootstrap, tmp_path / "work")
    assert outcomes[""] == ([], []), outcomes[""]
    assert outcomes["foreign"] == ([], []), outcomes["foreign"]
    refused, found = outcomes["missing"]
    assert refused and all("records are there" in line for line in refused), refused
    assert found, "a refused unit is reported as not restored"
    refused, found = outcomes["corrupt"]
    assert any("CRC-32" in line for line in refused), refused
    assert found
    refused, found = outcomes["view"]
    assert not refused and any("in memory" in line for line in found), found
