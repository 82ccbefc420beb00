"""``ng_aggregate_rollouts``: shards merged in task and rollout order, one metrics file in
0.7.0's shape computed without servers (or through them), 0.7.0's glob rules, and bad input
refused with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rewardstream.errors import InputError
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.producers.gym.aggregate_rollouts import _Shards, main
from rewardstream.producers.gym.collect import run, verify_entry
from tests.golden import generated_collection
from tests.gym import NgRun, fast, read_jsonl, write_problems


def _shards(folder: Path) -> list[dict[str, Any]]:
    """A generated collection cut into two shards (every other line), with a blank line, and
    a failures sidecar and materialized inputs the glob must skip."""
    _, rollouts = generated_collection(folder / "data", tasks=30, repeats=3, seed=4)
    lines = rollouts.read_bytes().splitlines(True)
    (folder / "r-0.jsonl").write_bytes(b"".join(lines[0::2]) + b"\n")
    (folder / "r-1.jsonl").write_bytes(b"".join(lines[1::2]))
    (folder / "r-1_failures.jsonl").write_bytes(b"")  # read for the report, never a shard
    (folder / "r-1_materialized_inputs.jsonl").write_bytes(b"not json\n")  # read only to count
    return [orjson.loads(line) for line in lines]


def test_shards_are_merged_and_aggregated_without_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _shards(tmp_path)
    out = tmp_path / "all" / "r.jsonl"
    glob = f"{tmp_path}/r-1*.jsonl, {tmp_path}/r-*.jsonl"  # overlapping: each shard once
    assert main([f"+input_glob='{glob}'", f"+output_jsonl_fpath={out}"]) == 0
    printed = capsys.readouterr().out
    assert "Aggregating 2 shard(s):" in printed and "Loaded 90 rollout record(s)" in printed
    ordered = sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    assert out.read_bytes() == b"".join(orjson.dumps(r) + b"\n" for r in ordered)
    metrics = orjson.loads((tmp_path / "all" / "r_aggregate_metrics.json").read_bytes())
    agents = sorted({r["agent_ref"]["name"] for r in rows})
    assert sorted(e["agent_ref"]["name"] for e in metrics) == agents
    for entry in metrics:
        name = entry["agent_ref"]["name"]
        mine = [verify_entry(r) for r in ordered if r["agent_ref"]["name"] == name]
        expected = aggregate_metrics(mine)
        assert list(entry) == [
            "agent_ref",
            "agent_metrics",
            "key_metrics",
            "group_level_metrics",
            "repeat_level_metrics",
        ]
        for key in ("agent_metrics", "key_metrics", "group_level_metrics"):
            assert entry[key] == expected[key]

    again = tmp_path / "none" / "r.jsonl"
    assert (
        main(
            [
                f"+input_glob={tmp_path}/r-*.jsonl",
                f"+output_jsonl_fpath={again}",
                "+merge_shards=false",
            ]
        )
        == 0
    )
    assert not again.exists() and (tmp_path / "none" / "r_aggregate_metrics.json").exists()
    assert "Merged rollouts: <not merged>" in capsys.readouterr().out


def test_bad_input_is_one_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _shards(tmp_path)
    out = tmp_path / "all" / "r.jsonl"
    cases = [
        (f"+input_glob={tmp_path}/nothing-*.jsonl", "No shards matched input_glob="),
        (f"+input_glob='{tmp_path}/r-*.jsonl,{out}'", "is one of the shards"),
    ]
    out.parent.mkdir()
    out.write_bytes(b"")  # an earlier merge: matched by the glob of the second case
    for glob, message in cases:
        assert main([glob, f"+output_jsonl_fpath={out}"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    (tmp_path / "r-1.jsonl").write_bytes(b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n{oops\n')
    assert main([f"+input_glob={tmp_path}/r-*.jsonl", f"+output_jsonl_fpath={out}"]) == 2
    err = capsys.readouterr().err
    assert f"Malformed JSON in '{tmp_path}/r-1.jsonl' at line 2" in err
    (tmp_path / "r-1.jsonl").write_bytes(b"")
    (tmp_path / "r-0_failures.jsonl").write_bytes(b"{}\n{oops\n")  # as 0.7.0: always read
    assert main([f"+input_glob={tmp_path}/r-*.jsonl", f"+output_jsonl_fpath={out}"]) == 2
    err = capsys.readouterr().err
    assert f"Malformed JSON in '{tmp_path}/r-0_failures.jsonl' at line 2" in err
    assert out.read_bytes() == b"" and not (tmp_path / "all" / "r_aggregate_metrics.json").exists()


def test_through_the_servers_as_0_7_0(tmp_path: Path) -> None:
    """Shards collected through our servers: the servers' metrics (0.7.0's way) equal those
    computed here, entries stamped with the environment server."""
    src = write_problems(tmp_path / "problems.jsonl", 12)
    run_ = NgRun(*fast())
    try:
        config: dict[str, Any] = {"input_jsonl_fpath": src}
        config |= {"output_jsonl_fpath": tmp_path / "c" / "r.jsonl"}
        config |= {"num_repeats": 4, "head_server_url": run_.head_url, "quiet": True}
        run(config | {"disable_aggregation": True})
        lines = (tmp_path / "c" / "r.jsonl").read_bytes().splitlines(True)
        for i in range(2):  # two shards of one collection: disjoint keys
            (tmp_path / f"s{i}.jsonl").write_bytes(b"".join(lines[i::2]))
        args = [f"+input_glob={tmp_path}/s*.jsonl"]
        assert main([*args, f"+output_jsonl_fpath={tmp_path}/local/r.jsonl"]) == 0
        servers = [f"+head_server_url={run_.head_url}", "+aggregate_with_servers=true"]
        assert main([*args, f"+output_jsonl_fpath={tmp_path}/served/r.jsonl", *servers]) == 0
    finally:
        run_.stop()
    local, served = (
        orjson.loads((tmp_path / side / "r_aggregate_metrics.json").read_bytes())
        for side in ("local", "served")
    )
    assert local == served and local[0]["_ng_environment_server"] == "arithmetic_environment_server"
    assert len(read_jsonl(tmp_path / "local" / "r.jsonl")) == 48


def test_a_shard_that_changes_before_the_merge_is_refused(tmp_path: Path) -> None:
    """The merged file re-reads the shards' lines (rows are not held whole): a shard that
    changed since it was read (a collection still writing it) is an error, not a merge of
    other rows than the metrics were computed on."""
    rows = _shards(tmp_path)
    found = [tmp_path / "r-0.jsonl", tmp_path / "r-1.jsonl"]
    read = _Shards(found)
    ordered = sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    assert list(read.merged()) == [orjson.dumps(r) + b"\n" for r in ordered]
    with found[1].open("ab") as fh:
        fh.write(b"\n")
    with pytest.raises(InputError, match=r"r-1\.jsonl changed while the shards were being"):
        list(read.merged())
