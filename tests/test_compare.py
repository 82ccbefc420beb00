"""``gym eval compare`` against the real nemo-gym 0.7.0 (``NEMO_GYM_PYTHON``).

Both sides read the same ``*_aggregate_metrics.json`` files, made by our profiler from
bench/generate.py's collections (``ng_aggregate_rollouts``: 0.7.0's shape with per-task
metrics; ``ng_reward_profile +aggregate_metrics=true``: pass@k, no per-task metrics); only the
refusals of malformed files use files written here. Each side runs every case in one process
(:data:`_RUNNER`, each command as its ``gym`` script runs it) in the same folder with the same
arguments, the reference first, its reports then moved aside, so paths and command lines are
the same: the reports must be byte for byte 0.7.0's but for the time they were made, stdout
and the exit code the same, stderr the same for a usage error and the same UserWarnings
otherwise (docs/nemo-gym-compat.md §Compare lists what differs).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.generate import input_row, result_row
from rewardstream.commands.cli import ng_reward_profile
from rewardstream.producers.gym import aggregate_rollouts

OURS = Path(sys.executable)
REPORTS = ("compare_report.md", "compare_report.json")
_STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")
_RUNNER = """
import contextlib, io, json, sys, warnings
if sys.argv[1] == "nemo":
    import nemo_gym.global_config as global_config
    from nemo_gym.cli.main import main
else:
    global_config = None
    from rewardstream.commands.gym_cli import main
said = []
for argv in json.loads(sys.argv[2]):
    if global_config is not None:
        global_config._GLOBAL_CONFIG_DICT = None  # read once per process: each its own
    sys.argv = ["gym", *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            try:
                code = main() or 0
            except SystemExit as exc:
                code = exc.code
    said.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(said))
"""


def _run(python: Path, cases: list[list[str]], cwd: Path) -> list[dict[str, Any]]:
    """Every ``gym`` command line of ``cases`` in one process of ``python``'s environment."""
    side = "nemo" if python != OURS else "ours"
    proc = _process([str(python), "-c", _RUNNER, side, json.dumps(cases)], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said: list[dict[str, Any]] = json.loads(proc.stdout)
    return said


def _process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def _scripts(python: Path, cases: list[list[str]], cwd: Path) -> list[dict[str, Any]]:
    """As :func:`_run`, each case by the environment's own ``gym`` script."""
    done = [_process([str(python.parent / "gym"), *argv], cwd) for argv in cases]
    return [{"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr} for p in done]


Runner = Callable[[Path, list[list[str]], Path], list[dict[str, Any]]]


def _both(
    cwd: Path, nemo_python: Path, argv: dict[str, list[str]], run: Runner = _run
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Path]]:
    """0.7.0's and our answers to each command line, in the same folder: 0.7.0's reports are
    moved to ``nemo/<case>`` before ours run; where each case's reports are."""
    folders = {name: _output(cwd, args) for name, args in argv.items()}
    theirs = run(nemo_python, list(argv.values()), cwd)
    for name, folder in folders.items():
        for report in REPORTS:
            if (folder / report).exists():
                (cwd / "nemo" / name).mkdir(parents=True, exist_ok=True)
                (folder / report).rename(cwd / "nemo" / name / report)
    return theirs, run(OURS, list(argv.values()), cwd), folders


def _output(cwd: Path, argv: list[str]) -> Path:
    """Where a case writes: ``-o``, else the candidate's folder."""
    if "-o" in argv:
        return cwd / argv[argv.index("-o") + 1]
    return cwd / Path(argv[argv.index("--candidates") + 1]).parent


def _same_answers(
    names: Iterable[str], theirs: list[dict[str, Any]], ours: list[dict[str, Any]]
) -> None:
    """The same exit code and stdout, the same stderr for a usage error and the same
    UserWarnings otherwise."""
    for name, a, b in zip(names, theirs, ours, strict=True):
        assert a["code"] == b["code"], (name, a, b)
        assert a["stdout"] == b["stdout"], (name, a["stdout"], b["stdout"])
        assert _warnings(a["stderr"]) == _warnings(b["stderr"]), name
        if a["code"] == 2:
            assert a["stderr"] == b["stderr"], name


def _same_reports(cwd: Path, folders: dict[str, Path]) -> None:
    for name, folder in folders.items():
        written = sorted(p.name for p in (cwd / "nemo" / name).iterdir())
        assert written == sorted(p.name for p in folder.glob("compare_report.*")), name
        for report in written:
            _same_report(cwd / "nemo" / name / report, folder / report)


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def _collection(
    folder: Path,
    tasks: Iterable[int],
    repeats: int,
    salt: int,
    shape: str = "nemo",
    keep: Callable[[int, int], bool] = lambda task, rollout: True,
    names: dict[str, str] | None = None,
) -> Path:
    """A collection by bench/generate.py (``salt``: another policy on the same tasks), its
    ``r_aggregate_metrics.json`` by our ``ng_aggregate_rollouts`` (0.7.0's, with per-task
    metrics; tests/test_nemo_interop.py); returns ``folder/r.jsonl``."""
    folder.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    for t in tasks:
        for r in range(repeats):
            if keep(t, r):
                row: dict[str, Any] = result_row(
                    t, r, t * repeats + r, f"task {t}", ["x"], salt, shape
                )
                rows.append(row)
                inputs.append(input_row(t, r, row["agent_ref"]["name"], f"task {t}"))
    for row in [*rows, *inputs]:
        name = row["agent_ref"]["name"]
        row["agent_ref"] = {"type": "responses_api_agents", "name": (names or {}).get(name, name)}
    _write_jsonl(folder / "shard.jsonl", rows)
    _write_jsonl(folder / "r_materialized_inputs.jsonl", inputs)
    glob, out = f"+input_glob={folder}/shard.jsonl", f"+output_jsonl_fpath={folder}/r.jsonl"
    assert aggregate_rollouts.main([glob, out]) == 0
    return folder / "r.jsonl"


def _profiled(folder: Path, tasks: int, repeats: int, salt: int) -> Path:
    """A collection whose aggregate metrics are our profiler's (``+aggregate_metrics=true``:
    pass@k and avg-of-k per agent, no per-task metrics)."""
    rollouts = _collection(folder, range(tasks), repeats, salt)
    (folder / "r_aggregate_metrics.json").unlink()
    args = [f"+materialized_inputs_jsonl_fpath={folder}/r_materialized_inputs.jsonl"]
    args += [f"+rollouts_jsonl_fpath={rollouts}", "+aggregate_metrics=true", "+quiet=true"]
    assert ng_reward_profile(args) == 0
    return rollouts


def _edit_metrics(rollouts: Path, edit: Callable[[list[dict[str, Any]]], object]) -> None:
    path = rollouts.with_name("r_aggregate_metrics.json")
    entries = orjson.loads(path.read_bytes())
    edit(entries)
    path.write_bytes(orjson.dumps(entries, option=orjson.OPT_INDENT_2))


def _timeless(data: bytes) -> bytes:
    """The report but for when it was made (``generated_at``, "Generated ... by")."""
    return _STAMP.sub(b"<generated_at>", data)


def _same_report(theirs: Path, ours: Path) -> None:
    a, b = _timeless(theirs.read_bytes()), _timeless(ours.read_bytes())
    if a != b:
        lines = zip(a.splitlines(), b.splitlines(), strict=False)
        first = next(((n, x, y) for n, (x, y) in enumerate(lines, 1) if x != y), None)
        raise AssertionError(f"{ours.name} differs from 0.7.0's (line, 0.7.0, ours): {first}")


def _warnings(stderr: str) -> list[str]:
    """The UserWarnings said; 0.7.0's alone: scipy's RuntimeWarnings, and its profiler's
    "Standard error is 0" when it completes an old file (docs/nemo-gym-compat.md §Compare)."""
    said = re.findall(r"UserWarning: (.*)", stderr)
    return [line for line in said if not line.startswith("Standard error is 0")]


def _gym(name: str, baseline: str, candidate: str, *more: str) -> list[str]:
    """``gym eval compare`` of two runs' folders, into ``out/<name>`` but for ``default_dir``."""
    args = ["eval", "compare", "--baseline", f"{baseline}/r.jsonl"]
    args += ["--candidates", f"{candidate}/r.jsonl", *more]
    return args if name == "default_dir" else [*args, "-o", f"out/{name}"]


def test_reports_equal_0_7_0s(tmp_path: Path, nemo_python: Path) -> None:
    """Binary and continuous rewards, one and several agents, tasks missing on one side,
    agent names picked per side, an agent only on one side, unequal repeat coverage, files
    from the profiler (pass@k, no per-task metrics, other repeat counts), a file without
    repeat-level metrics, metrics files named apart from the rollouts, the default output
    folder, each report format, and overrides: 0.7.0's bytes, stdout and warnings. Then a
    value changed by one ulp in an input shows the comparison catches what differs."""
    _collection(tmp_path / "bin_a", range(90), 3, salt=0)
    cand = _collection(tmp_path / "bin_b", range(90), 3, salt=500)
    _collection(tmp_path / "cont_a", range(40), 3, salt=0, shape="hidden")
    _collection(tmp_path / "cont_b", range(40), 3, salt=5, shape="hidden")
    _collection(tmp_path / "shifted", range(6, 96), 3, salt=500)
    renamed = {"math_simple_agent": "math_agent_v2", "code_simple_agent": "code_agent_v2"}
    _collection(tmp_path / "renamed", range(90), 3, salt=500, names=renamed)
    _collection(tmp_path / "no_tool", [t for t in range(90) if t % 3 != 2], 3, salt=500)
    _collection(tmp_path / "uneven", range(90), 3, salt=500, keep=lambda t, r: (t + r) % 7 > 0)
    _collection(tmp_path / "single_a", range(0, 60, 3), 5, salt=0)
    _collection(tmp_path / "single_b", range(0, 60, 3), 5, salt=31)
    _profiled(tmp_path / "profiled_a", 30, 4, salt=0)
    _profiled(tmp_path / "profiled_b", 30, 2, salt=977)
    legacy = _collection(tmp_path / "legacy", range(90), 4, salt=0)
    _edit_metrics(legacy, lambda entries: [e.pop("repeat_level_metrics") for e in entries[:2]])
    (tmp_path / "apart").mkdir()
    for run, name in (("bin_a", "base.json"), ("bin_b", "cand.json")):
        shutil.copy(tmp_path / run / "r_aggregate_metrics.json", tmp_path / "apart" / name)
    cases = {
        "binary": "bin_a bin_b",
        "continuous": "cont_a cont_b --report-format json",
        "shifted": "bin_a shifted --agent math_simple_agent",
        "per_side": "bin_a renamed --baseline-agent code_simple_agent "
        "--candidate-agents code_agent_v2 --report-format md",
        "baseline_extra": "bin_a no_tool",
        "candidate_extra": "no_tool bin_b",
        "uneven": "bin_a uneven",
        "profiled": "profiled_a profiled_b",
        "legacy": "legacy bin_b",
        "apart": "runs/a runs/b --baseline-agg-metrics apart/base.json "
        "--candidates-agg-metrics apart/cand.json --agent tool_simple_agent",
        "default_dir": "single_a single_b",
        "overrides": "bin_a bin_b -v +api_key=secret +report_format=json "
        "+agent_name=math_simple_agent",  # last: 0.7.0's -v turns on DEBUG logging for good
    }
    argv = {name: _gym(name, *line.split()) for name, line in cases.items()}
    theirs, ours, folders = _both(tmp_path, nemo_python, argv)
    assert {a["code"] for a in theirs} == {0}
    _same_answers(cases, theirs, ours)
    _same_reports(tmp_path, folders)

    # what the cases are meant to show, so a change of the inputs cannot make them vacuous
    def report(name: str) -> dict[str, Any]:
        found: dict[str, Any] = orjson.loads((tmp_path / "out" / name / REPORTS[1]).read_bytes())
        return found

    flips = [s for c in report("binary")["comparisons"] for s in c["flips"]]
    assert {s["mode"] for s in flips} == {"binary"} and max(len(s["flips"]) for s in flips) > 10
    assert any(f["baseline_rewards"] is None for s in flips for f in s["flips"])  # capped
    assert {s["mode"] for c in report("continuous")["comparisons"] for s in c["flips"]} == {
        "continuous"
    }
    (shift,) = report("shifted")["comparisons"][0]["flips"]
    assert shift["baseline_only_task_count"] == shift["candidate_only_task_count"] == 2
    assert report("baseline_extra")["skipped_agents"] == {"baseline": ["tool_simple_agent"]}
    assert report("candidate_extra")["skipped_agents"] == {"candidate[0]": ["tool_simple_agent"]}
    said = dict(zip(cases, ours, strict=True))
    assert "incomplete or unequal task coverage" in said["uneven"]["stderr"]
    assert "Repeat-level metrics are missing" in said["legacy"]["stderr"]
    profiled = report("profiled")["comparisons"][0]
    assert profiled["flips"][0]["mode"] == "unavailable" and len(profiled["notes"]) == 2
    assert "+api_key=****" in report("overrides")["command"]

    # one ulp more in one repeat-level value of the candidate: the bytes differ
    def nudge(entries: list[dict[str, Any]]) -> None:
        repeat = entries[0]["repeat_level_metrics"][0]
        repeat["mean/judge_score"] = math.nextafter(repeat["mean/judge_score"], math.inf)

    _edit_metrics(cand, nudge)
    (tmp_path / "out" / "binary" / REPORTS[1]).unlink()
    assert _run(OURS, [argv["binary"]], tmp_path)[0]["code"] == 0
    with pytest.raises(AssertionError, match=r"compare_report\.json differs"):
        _same_report(tmp_path / "nemo" / "binary" / REPORTS[1], folders["binary"] / REPORTS[1])


def test_refusals_equal_0_7_0s(tmp_path: Path, nemo_python: Path) -> None:
    """0.7.0's refusals word for word, with its exit code: a metrics file missing, a folder,
    not JSON, not a list of agent entries (one object, empty, a number in it, an entry without
    agent name, an agent twice); no agent in every run, an agent not there, several agents and
    none chosen, no metric in common; more than one candidate, lists of other lengths, no
    candidate, required settings missing, a value of the wrong type or not one of its choices,
    an unknown or ambiguous flag; an output folder that is a file."""
    _collection(tmp_path / "bin_a", range(30), 3, salt=0)
    _collection(tmp_path / "bin_b", range(30), 3, salt=500)
    _collection(tmp_path / "lone", range(0, 30, 3), 3, salt=0, names={"math_simple_agent": "zzz"})
    entry = orjson.loads((tmp_path / "bin_a" / "r_aggregate_metrics.json").read_bytes())[0]
    renamed = {f"x_{key}": value for key, value in entry["agent_metrics"].items()}
    (tmp_path / "bad").mkdir()
    for name, data in {
        "not_json": b'[{"agent_ref":',
        "object": orjson.dumps(entry),
        "empty": b"[]",
        "number": orjson.dumps([entry, 5]),
        "nameless": orjson.dumps([{k: v for k, v in entry.items() if k != "agent_ref"}]),
        "twice": orjson.dumps([entry, entry]),
        "other_metrics": orjson.dumps([entry | {"agent_metrics": renamed, "key_metrics": {}}]),
    }.items():
        (tmp_path / "bad" / f"{name}_aggregate_metrics.json").write_bytes(data)
    base, cand = "--baseline bin_a/r.jsonl", "--candidates bin_b/r.jsonl"
    cases = {
        "missing": f"{base} --candidates nothere/r.jsonl",
        "folder": f"{base} {cand} --candidates-agg-metrics bin_b",
        **{name: f"{base} --candidates bad/{name}.jsonl" for name in ("not_json", "object")},
        **{name: f"{base} --candidates bad/{name}.jsonl" for name in ("empty", "number")},
        **{name: f"{base} --candidates bad/{name}.jsonl" for name in ("nameless", "twice")},
        "other_metrics": f"{base} --candidates bad/other_metrics.jsonl",
        "no_shared_agent": f"{base} --candidates lone/r.jsonl",
        "unknown_agent": f"{base} {cand} --agent math_simple_agnt",
        "several_candidate_agents": f"{base} {cand} --baseline-agent math_simple_agent",
        "several_baseline_agents": f"{base} --candidates lone/r.jsonl +candidate_agent_names=[zzz]",
        "output_is_a_file": f"{base} {cand} -o bin_a/r.jsonl",
        "two_candidates": f"{base} --candidates bin_b/r.jsonl,bin_b/r.jsonl",
        "agent_lengths": f"{base} {cand} --candidate-agents a,b",
        "metrics_lengths": f"{base} {cand} --candidates-agg-metrics a.json,b.json",
        "no_candidate": f"{base} --candidates ,",
        "nothing": "",
        "missing_and_wrong": "+report_format=xml",
        "wrong_choice": f"{base} {cand} +report_format=xml",
        "wrong_type": f"{base} {cand} +agent_name=5",
        "bad_choice": f"{base} {cand} --report-format jsn",
        "unknown_flags": f"{base} {cand} --bogus --agnet=x",
        "ambiguous_flag": f"{base} --candidate bin_b/r.jsonl",
    }
    argv = [["eval", "compare", *line.split()] for line in cases.values()]
    theirs, ours = _run(nemo_python, argv, tmp_path), _run(OURS, argv, tmp_path)
    assert 0 not in {a["code"] for a in theirs}
    _same_answers(cases, theirs, ours)


def test_the_gym_scripts_answer_alike(tmp_path: Path, nemo_python: Path) -> None:
    """Through each environment's own ``gym`` script, a process per command as a user runs it,
    not the one-process runner of the tests above: the same answers and reports."""
    _collection(tmp_path / "bin_a", range(30), 3, salt=0)
    _collection(tmp_path / "bin_b", range(30), 3, salt=500)
    argv = {
        "binary": _gym("binary", "bin_a", "bin_b"),
        "refused": ["eval", "compare", "--baseline", "bin_a/r.jsonl", "--candidates", "x/r.jsonl"],
    }
    theirs, ours, folders = _both(tmp_path, nemo_python, argv, _scripts)
    assert [a["code"] for a in theirs] == [0, 1]
    _same_answers(argv, theirs, ours)
    _same_reports(tmp_path, {"binary": folders["binary"]})
