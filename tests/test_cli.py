"""``ng_reward_profile`` / ``rewardstream profile``: one-line errors, exit 2, no partial output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rewardstream.commands.cli import main, ng_reward_profile
from rewardstream.infra.overrides import parse_overrides
from rewardstream.processors.core.records import MAX_ANSWER_DEPTH
from tests.readers import READERS, reading_with

ROW = b'{"q":"x","agent_ref":{"name":"a"},"_ng_task_index":0,"_ng_rollout_index":0}\n'
RESULT = b'{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":0}\n'


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    inputs, rollouts = tmp_path / "r_materialized_inputs.jsonl", tmp_path / "r.jsonl"
    inputs.write_bytes(ROW)
    rollouts.write_bytes(RESULT)
    return inputs, rollouts


def run(inputs: Path, rollouts: Path, *extra: str) -> int:
    return ng_reward_profile(
        [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}", *extra]
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            RESULT + b"\n",
            "Malformed JSON in '{p}' at line 2: input data is empty: line 1 column 1 (char 0)",
        ),
        (
            b'{"reward":NaN,"_ng_task_index":0,"_ng_rollout_index":0}\n',
            "Malformed JSON in '{p}' at line 1:",
        ),
        (b'{"reward":1e999}\n', "Malformed JSON in '{p}' at line 1: number is infinity"),
        (b'{"reward":1.0,"_ng_rollout_index":0}\n', "{p} line 1: missing field '_ng_task_index'"),
        (
            b'{"reward":1,"_ng_task_index":"0","_ng_rollout_index":0}\n',
            "{p} line 1: field '_ng_task_index' must be a 64-bit integer",
        ),
        (b"[1,2]\n", "{p} line 1: expected a JSON object"),
        (b"\xff\xfe\n", "Malformed JSON in '{p}' at line 1: str is not valid UTF-8"),
        (
            RESULT + RESULT,
            "ValueError: Duplicate result row for rollout key (0, 0). A (task, rollout) key names"
            " one rollout of one task: shards of one collection must number their tasks across the"
            " whole dataset (give every dataset row its _ng_task_index before splitting it",
        ),
        (
            RESULT + b'{"reward":1,"_ng_task_index":5,"_ng_rollout_index":0}\n',
            "ValueError: Rollout results contain rows with no matching materialized input rows",
        ),
        (
            b'{"reward":'
            + b"[" * 300
            + b"1"
            + b"]" * 300
            + b',"_ng_task_index":0,"_ng_rollout_index":0}\n',
            "{p} line 1: field 'reward' cannot be written back as JSON",
        ),
        (
            b'{"response":"oops","_ng_task_index":0,"_ng_rollout_index":0}\n',
            "{p} line 1: field 'response' must be an object or null",
        ),
    ],
)
@pytest.mark.parametrize("reader", READERS)
def test_bad_rollouts_one_line_exit_2_nothing_written(
    files: tuple[Path, Path],
    content: bytes,
    message: str,
    reader: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inputs, rollouts = files
    rollouts.write_bytes(content)
    with reading_with(reader):
        assert run(inputs, rollouts) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"ng_reward_profile: error: {message.format(p=rollouts)}")
    assert sorted(p.name for p in inputs.parent.iterdir()) == sorted([inputs.name, rollouts.name])
    assert rollouts.read_bytes() == content


@pytest.mark.parametrize("reader", READERS)
def test_error_line_numbers_count_from_file_start_with_parallel_workers(
    reader: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("rewardstream.processors.batch._PARALLEL_MIN_BYTES", 1)
    n = 2000
    inputs, rollouts = tmp_path / "r_materialized_inputs.jsonl", tmp_path / "r.jsonl"
    inputs.write_bytes(
        b"".join(ROW.replace(b'"_ng_task_index":0', b'"_ng_task_index":%d' % t) for t in range(n))
    )
    lines = [RESULT.replace(b'"_ng_task_index":0', b'"_ng_task_index":%d' % t) for t in range(n)]
    lines[1733] = b"{oops\n"
    rollouts.write_bytes(b"".join(lines))
    with reading_with(reader):
        assert run(inputs, rollouts) == 2
    assert f"'{rollouts}' at line 1734:" in capsys.readouterr().err


def test_missing_file_and_directory(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = files
    assert run(inputs.with_name("nope.jsonl"), rollouts) == 2
    assert "Input file not found: '" in capsys.readouterr().err
    assert run(inputs, inputs.parent) == 2
    assert "(+rollouts_jsonl_fpath)" in capsys.readouterr().err  # as the user gave it


def test_missing_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert ng_reward_profile(["+rollouts_jsonl_fpath=r.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == (
        "ng_reward_profile: error: missing required configuration: "
        "materialized_inputs_jsonl_fpath. Provide each via its flag (see --help) or as a "
        "+materialized_inputs_jsonl_fpath=<value> override."
    )


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("+quiet=maybe", "invalid configuration 'quiet': expected true or false, got 'maybe'"),
        ("+quite=true", "invalid configuration 'quite': no such key (did you mean 'quiet'?)"),
        ("+frobnicate=1", "invalid configuration 'frobnicate': no such key"),
    ],
)
def test_a_bad_key_or_value_is_said_in_the_users_words(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], override: str, line: str
) -> None:
    inputs, rollouts = files
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*argv, override]) == 2
    assert capsys.readouterr().err.strip() == f"ng_reward_profile: error: {line}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_folder(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = files
    rollouts.parent.chmod(0o555)
    try:
        assert run(inputs, rollouts) == 2
        assert "Cannot write" in capsys.readouterr().err
    finally:
        rollouts.parent.chmod(0o755)


def test_failed_write_keeps_stale_outputs(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = files
    agent = rollouts.with_name("r_agent_metrics.json")
    agent.write_bytes(b"stale")
    blocker = rollouts.with_name("r_repeat_level_metrics.json")
    blocker.mkdir()  # os.replace onto a directory fails after the first files are ready
    assert run(inputs, rollouts) == 2
    assert "Cannot write" in capsys.readouterr().err
    assert agent.read_bytes() == b"stale"
    assert not rollouts.with_name("r_reward_profiling.jsonl").exists()
    assert [p.name for p in rollouts.parent.iterdir() if p.name.startswith(".")] == []


def test_rewardstream_profile_flags(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = files
    assert main(["profile", "--inputs", str(inputs), "--rollouts", str(rollouts), "--quiet"]) == 0
    assert "Reward profile completion: 1/1 rollout rows (100.00%)" in capsys.readouterr().out
    assert (
        rollouts.with_name("r_reward_profiling.jsonl")
        .read_bytes()
        .startswith(b'{"_ng_task_index":0')
    )


def test_console_script_exit_code(files: tuple[Path, Path]) -> None:
    exe = shutil.which(
        "ng_reward_profile", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    assert exe, "package not installed with its console scripts"
    inputs, rollouts = files
    rollouts.write_bytes(b"{bad\n")
    proc = subprocess.run(
        [exe, f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_overrides_are_typed_like_hydra() -> None:
    got = parse_overrides(["+a=1", "++b=True", "c=0.5", "+d=[x, 'y z']", "+e.f=null", "+g=hello"])
    assert got == {"a": 1, "b": True, "c": 0.5, "d": ["x", "y z"], "e": {"f": None}, "g": "hello"}


def test_row_too_deep_to_write_back_is_a_clear_error(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, rollouts = files
    deep = b"[" * 300 + b"1" + b"]" * 300
    inputs.write_bytes(ROW.replace(b'"q":"x"', b'"q":' + deep))
    assert run(inputs, rollouts) == 2
    assert "a sample row cannot be written back as JSON" in capsys.readouterr().err
    assert sorted(p.name for p in inputs.parent.iterdir()) == sorted([inputs.name, rollouts.name])


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("depth", [MAX_ANSWER_DEPTH, MAX_ANSWER_DEPTH + 1, 990])
def test_an_answer_too_deep_to_compare_is_a_clear_error(
    files: tuple[Path, Path], depth: int, reader: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """990 levels: orjson reads them, and comparing them took Python's recursion (a traceback)."""
    inputs, rollouts = files
    deep = b"[" * depth + b'"x"' + b"]" * depth
    rollouts.write_bytes(RESULT.replace(b"{", b'{"ans":' + deep + b",", 1))
    with reading_with(reader):
        code = run(inputs, rollouts, "+aggregate_metrics=true", "+answer_key=ans", "+quiet=true")
    err = capsys.readouterr().err
    if depth <= MAX_ANSWER_DEPTH:
        assert (code, err) == (0, "")
        return
    assert code == 2
    assert err == (
        f"ng_reward_profile: error: {rollouts} line 1: field 'ans' nests lists or objects deeper"
        f" than {MAX_ANSWER_DEPTH} levels: too deep to compare as an answer\n"
    )
    assert sorted(p.name for p in inputs.parent.iterdir()) == sorted([inputs.name, rollouts.name])


def _tasks(folder: Path, n: int, deep_at: int | None = None) -> tuple[Path, Path]:
    """``n`` tasks x 2 rollouts; the row of task ``deep_at`` nests deeper than orjson writes."""
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    rows, results = [], []
    for t in range(n):
        for r in range(2):
            q = "[" * 300 + "]" * 300 if t == deep_at else f'"q{t}"'
            rows.append(
                b'{"q":%s,"_ng_task_index":%d,"_ng_rollout_index":%d}\n' % (q.encode(), t, r)
            )
            reward = (t * 7 + r) % 3 / 2
            results.append(
                b'{"reward":%r,"_ng_task_index":%d,"_ng_rollout_index":%d}\n' % (reward, t, r)
            )
    inputs.write_bytes(b"".join(rows))
    rollouts.write_bytes(b"".join(reversed(results)))
    return inputs, rollouts


@pytest.mark.parametrize("deep_at", [None, 10, 4000])  # in the first renderer's half, the helper's
def test_two_renderers_write_what_one_writes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    deep_at: int | None,
) -> None:
    """The second half of the task rows is rendered by a forked helper: the same bytes, and
    the same one-line error (nothing written) when a row of either half cannot be written."""
    outcomes = []
    for split_min in (10**9, 2):  # one renderer, then two
        monkeypatch.setattr("rewardstream.processors.batch._SPLIT_MIN", split_min)
        folder = tmp_path / str(split_min)
        folder.mkdir()
        inputs, rollouts = _tasks(folder, 5000, deep_at)
        code = run(inputs, rollouts)
        err = capsys.readouterr().err
        made = {p.name: p.read_bytes() for p in folder.iterdir() if p not in (inputs, rollouts)}
        outcomes.append((code, err.replace(str(folder), "F"), made))
    assert outcomes[0] == outcomes[1]
    code, err, made = outcomes[0]
    if deep_at is None:
        assert code == 0 and len(made["r_reward_profiling.jsonl"].splitlines()) == 5000
    else:
        assert code == 2 and err.count("\n") == 1 and made == {}
        assert f"line {2 * deep_at + 1}" in err, err
