"""Fast fault-injection trials (``bench/chaos.py``): every fault kind once, on small
collections, with real processes (each a separate host: a mount namespace and a private disk
of its own) and a real broker, 4 partitions. The full runs are in RELIABILITY.md.

The harness's self-test comes first: a trial with a planted finding must be reported by the
sweep's own judge (``run_trial``, then ``summary``), and a clean one must not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.chaos import FAST, PLANTS, Result, run_trial, summary

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(os.geteuid() != 0, reason="private mounts need root (unshare -m)"),
]


def _row(result: Result) -> dict[str, str]:
    """The trial's row of the sweep's table, by column."""
    head, _, *rows = summary([result]).splitlines()
    names = [c.strip() for c in head.strip("|").split("|")]
    (row,) = [r for r in rows if r.startswith(f"| {result.fault} |")]
    return dict(zip(names, (c.strip() for c in row.strip("|").split("|")), strict=True))


def test_a_clean_trial_reports_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    result = run_trial("baseline", 0, kafka_bootstrap, tmp_path / "trial", FAST)
    assert result.ok, result.line()
    row = _row(result)
    assert (row["lost"], row["double-counted"], row["wrong bytes (files)"]) == ("0", "0", "0")
    assert row["trials with a finding"] == "none"


@pytest.mark.parametrize("plant", PLANTS)
def test_the_sweep_reports_a_planted_finding(
    kafka_bootstrap: str, tmp_path: Path, plant: str
) -> None:
    """The processors are fed a collection changed from the trial's reference (a key
    withheld, a key added, a reward flipped) or a poison event; the sweep's judge must
    report it, in the trial's line and in the table."""
    result = run_trial("baseline", 0, kafka_bootstrap, tmp_path / "trial", FAST, plant)
    assert not result.ok, result.line()
    row = _row(result)
    assert row["trials with a finding"] == "0", row
    if plant == "lost":
        assert result.lost and int(row["lost"]) > 0 and not result.double_counted, result.line()
    elif plant == "double":
        assert result.double_counted and int(row["double-counted"]) > 0, result.line()
        assert not result.lost, result.line()
    elif plant == "wrong-byte":
        assert not result.equal_to_batch and int(row["wrong bytes (files)"]) > 0, result.line()
        assert result.lost == result.double_counted == 0, result.line()
    else:  # a poison event: one not-json dead letter, nothing else wrong
        assert result.detail["dead_letters"] == {"not-json": 1}, result.line()
        assert any("dead letters" in e for e in result.detail["errors"]), result.line()
        assert result.equal_to_batch and result.lost == result.double_counted == 0


@pytest.mark.parametrize(
    ("fault", "seed"),
    [
        ("kill-processor", 1),  # aimed between two offset commits ("checkpoint")
        ("group-rebalance", 0),  # and a snapshot against the batch profile of its offsets
        ("publisher-rerun", 0),
        ("disorder", 1),  # two processors in one group
        ("pod-loss", 0),  # the killed member's tmpfs gone; a fresh host replaces it
        ("zombie", 0),  # the leader stopped past its session until the run is final
        ("scale", 0),  # 1 -> 3 -> 1 members, a snapshot at three and at one
        ("two-groups", 0),  # two exactly-one finals, one per group
        ("conflict", 0),  # same keys re-published with other content: conflicts, first stands
        ("foreign-keys", 0),  # keys no input row has: unknown-key, never counted
        ("frozen-peer", 0),  # a SIGSTOPped peer: snapshots answer within their bound
        ("snapshot-storm", 0),  # snapshots and idle sockets at once: 200/429/503, /healthz
        ("member-churn", 0),  # members join and leave around the final: one truth
    ],
)
def test_trial_loses_nothing_and_counts_nothing_twice(
    kafka_bootstrap: str, tmp_path: Path, fault: str, seed: int
) -> None:
    result = run_trial(fault, seed, kafka_bootstrap, tmp_path / "trial", FAST)
    assert result.ok, result.line()
    assert result.detail["final_records"] == 1
    shots = result.detail.get("snapshots", {})
    # a snapshot compared with batch is equal; one refused (a frozen peer's 503) is judged
    # by the trial itself (result.ok: it named the peer's partitions, within the bound)
    assert all(x["equal"] for x in shots.values() if "equal" in x), shots
    if fault in ("pod-loss", "scale", "two-groups"):
        assert shots, "no snapshot was checked"


@pytest.mark.parametrize(("fault", "seed"), [("broker-restart", 1), ("broker-kill", 0)])
def test_broker_trials(tmp_path: Path, fault: str, seed: int) -> None:
    """Its own broker, stopped and started again on the same data dir mid-run; or its own
    three-broker cluster (replication 3), one broker killed mid-run."""
    result = run_trial(fault, seed, None, tmp_path / "trial", FAST)
    assert result.ok, result.line()


def test_older_format_trial(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A processor meeting a member record of a newer format refuses with exit 2 and one
    line, writing nothing to Kafka, while the other prefix's group is unharmed."""
    result = run_trial("older-format", 0, kafka_bootstrap, tmp_path / "trial", FAST)
    older = result.detail["older"]
    assert older["exit"] == 2
    assert len(older["error_lines"]) == 1
    assert "format version 2" in older["error_lines"][0]
    assert older["committed"] == 0
    assert older["files"] in ([], ["out/.rewardstream-owner.json"])  # its --output-dir claim
    assert sum(older["records"].values()) == 1  # the planted record only
    assert result.ok, result.line()
