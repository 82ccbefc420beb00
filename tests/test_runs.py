"""Parts deduplicate by (task, rollout), whatever the indices, and merge with their samples."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import msgspec
import pytest

from rewardstream.contract.events import Input, Rollout
from rewardstream.errors import InvalidRow
from rewardstream.processors.core.profile import build_profile
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.engine.runs import Part, Spill, merge_parts
from rewardstream.sinks.files import task_lines


def _result(task: int, rollout: int) -> dict[str, float | int]:
    return {"reward": float(rollout), "_ng_task_index": task, "_ng_rollout_index": rollout}


def _rollout(task: int, rollout: int) -> Rollout:
    record = extract_result(_result(task, rollout), task, rollout)
    return Rollout(
        run_id="r", task=task, rollout=rollout, agent=None, record=record, published_at=0.0
    )


@pytest.mark.parametrize("rollout", [0, 63, 64, 4095, 4096, 10**12, -1, -(2**63)])
def test_a_key_counts_once_whatever_its_rollout_index(tmp_path: Path, rollout: int) -> None:
    part = Part(tmp_path / "s.jsonl")
    assert part.add_rollout(_rollout(7, rollout))
    assert not part.add_rollout(_rollout(7, rollout))
    assert part.add_rollout(_rollout(8, rollout))  # same index, other task
    assert (part.rollouts, part.duplicates) == (2, 1)


def test_merged_parts_read_each_sample_from_its_own_spill(tmp_path: Path) -> None:
    parts = [Part(tmp_path / f"{i}.jsonl") for i in range(3)]
    for i, part in enumerate(parts):
        row = {"q": f"row {i}", "_ng_task_index": i, "_ng_rollout_index": 0}
        assert part.add_input(Input(run_id="r", line=i, row=row))
    merged = merge_parts(parts)
    locators = merged.state.column(merged.state.in_locator).tolist()
    assert [merged.sample(loc) for loc in locators] == [b'{"q":"row %d"}' % i for i in range(3)]


def test_rollout_infos_moved_to_the_spill_come_back_in_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "rewardstream.processors.engine.runs._INFO_CHUNK", 200
    )  # move them every few rollouts
    rows = [{"q": t, "_ng_task_index": t, "_ng_rollout_index": r} for t in range(5) for r in (0, 1)]
    inputs, held, spilled = Part(tmp_path / "in"), Part(tmp_path / "a"), Part(tmp_path / "b")
    for line, row in enumerate(rows):
        inputs.add_input(Input(run_id="r", line=line, row=row))
    for row in rows:
        task, rollout = row["_ng_task_index"], row["_ng_rollout_index"]
        held.state.add_result(_result(task, rollout))
        spilled.add_rollout(_rollout(task, rollout))
    assert spilled.state.info_taken > 0
    whole, parted = merge_parts([inputs, held]), merge_parts([inputs, spilled])
    assert b"".join(parted.state.info_segments()) == b"".join(whole.state.info_segments())
    assert parted.state.info_end == whole.state.info_end
    assert any(isinstance(s, mmap.mmap) for s in parted.state.info_segments())  # held, not read
    built = [build_profile(m.state, allow_partial=True).task_rows for m in (whole, parted)]
    assert list(task_lines(built[0], whole.sample)) == list(task_lines(built[1], parted.sample))
    assert len(built[0]) == 5


def test_a_rejected_row_leaves_its_key_free_for_a_good_copy(tmp_path: Path) -> None:
    part = Part(tmp_path / "s.jsonl")
    key = {"_ng_task_index": 1, "_ng_rollout_index": 0}
    deep: object = 0
    for _ in range(300):  # parses, but orjson cannot write it back
        deep = [deep]
    for bad in ({"agent_ref": {"name": 5}, **key}, {"x": deep, **key}):
        with pytest.raises(InvalidRow):
            part.add_input(Input(run_id="r", line=0, row=bad))
    assert part.add_input(Input(run_id="r", line=0, row={"q": 1, **key}))
    assert (part.inputs, part.duplicates) == (1, 0)
    assert merge_parts([part]).sample(0) == b'{"q":1}'


def test_a_retired_part_keeps_its_counts_and_drops_its_state_and_spill(tmp_path: Path) -> None:
    inputs, rollouts = Part(tmp_path / "in.spill"), Part(tmp_path / "out.spill")
    for task in range(3):
        row = {"q": task, "_ng_task_index": task, "_ng_rollout_index": 0}
        assert inputs.add_input(Input(run_id="r", line=task, row=row))
        assert rollouts.add_rollout(msgspec.structs.replace(_rollout(task, 0), agent="a"))
    live = rollouts.live()["a"].columns["reward"]
    assert (tmp_path / "in.spill").exists()
    inputs.retire(tasks=0)
    rollouts.retire(tasks=3)
    assert (inputs.inputs, rollouts.rollouts, rollouts.final and rollouts.final.tasks) == (3, 3, 3)
    assert not (tmp_path / "in.spill").exists() and inputs.spill is None
    assert inputs.state.num_inputs == rollouts.state.num_results == 0
    assert rollouts.live()["a"].columns["reward"] == live
    # seen or never seen: a done run's events change nothing and count as duplicates
    assert not rollouts.add_rollout(_rollout(0, 0))
    assert not rollouts.add_rollout(_rollout(99, 7))
    assert not inputs.add_input(
        Input(run_id="r", line=9, row={"q": 1, "_ng_task_index": 99, "_ng_rollout_index": 7})
    )
    assert (inputs.inputs, inputs.duplicates, rollouts.rollouts, rollouts.duplicates) == (
        3,
        1,
        3,
        2,
    )


def test_a_forked_reader_flushing_the_spill_first_changes_nothing(tmp_path: Path) -> None:
    """A snapshot child writes the owner's buffered rows out before it maps them; the owner
    writes the same bytes at the same offsets later, so neither sees a row twice or moved."""
    spill = Spill(tmp_path / "s.spill")
    lines = [b'{"row":%d}\n' % i for i in range(1000)]
    offsets = [spill.append(line) for line in lines[:500]]
    child = os.fork()
    if not child:  # the snapshot child: flush by reading, then leave without cleanup
        os._exit(0 if spill.lines()(offsets[499]) == lines[499].rstrip() else 1)
    assert os.waitpid(child, 0)[1] == 0
    offsets += [spill.append(line) for line in lines[500:]]
    read = spill.lines()
    assert [read(at) for at in offsets] == [line.rstrip() for line in lines]
    assert (tmp_path / "s.spill").read_bytes() == b"".join(lines)
    spill.close()
