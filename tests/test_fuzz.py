"""Bad input files for ``ng_reward_profile`` and ``rewardstream publish`` (issue 6).

Whatever is wrong with a file (a truncated line, invalid UTF-8, a wrong type in any field, a
number beyond int64 or a double, NaN/Infinity, deep nesting, an empty, binary or missing file),
both commands must end with one line on stderr naming the file and line (or the field), exit
code 2, no traceback, nothing written next to the inputs, and the inputs untouched. A line the
profiler rejects must be rejected by the publisher too, with the same words, before its event
is sent.

Hypothesis mutates one line of a small valid collection per example and runs the in-process
entry points (fast); a few representative files go through the installed console scripts as
subprocesses, and through ``rewardstream publish`` against a real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rewardstream.processors.batch
from rewardstream.commands.cli import main, ng_reward_profile
from rewardstream.contract.events import Topics, decode_control, decode_input, decode_rollout
from rewardstream.errors import LineError
from rewardstream.infra.jsonl import iter_jsonl
from rewardstream.kafka.local import free_port
from rewardstream.producers.events import input_event, rollout_event
from rewardstream.producers.publisher.lines import (
    MAX_MESSAGE_BYTES,
    MakeEvent,
    MessageLimit,
    encode_rows,
    parsed,
)
from tests.processes import make_topics
from tests.readers import READERS, reading_with

BIN = Path(sys.executable).parent
INPUTS, ROLLOUTS = "r_materialized_inputs.jsonl", "r.jsonl"
OUTPUTS = ("r_reward_profiling.jsonl", "r_agent_metrics.json", "r_repeat_level_metrics.json")


# --------------------------------------------------------------------------- a valid collection


def _row(task: int, rollout: int) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"What is {task} + {task}?"}],
            "temperature": 1.0,
        },
        "verifier_metadata": {"expected_answer": str(2 * task)},
        "agent_ref": {"type": "responses_api_agents", "name": f"agent_{task % 2}"},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def _result(task: int, rollout: int) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        "response": {
            "id": f"resp_{task}_{rollout}",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "4"}]}],
            "usage": {
                "input_tokens": 12 + task,
                "output_tokens": 3 + rollout,
                "total_tokens": 15 + task + rollout,
                "input_tokens_details": {"cached_tokens": 0},
            },
        },
        "reward": float((task + rollout) % 2),
        "is_correct": (task + rollout) % 2 == 1,
        "latency_s": 0.25 * (rollout + 1),
        "agent_ref": {"name": f"agent_{task % 2}"},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


KEYS = [(t, r) for t in range(3) for r in range(2)]
ROWS = [_row(t, r) for t, r in KEYS]
RESULTS = [_result(t, r) for t, r in reversed(KEYS)]  # completion order differs from key order
INPUT_PATHS: list[tuple[str, ...]] = [
    ("_ng_task_index",),
    ("_ng_rollout_index",),
    ("agent_ref",),
    ("agent_ref", "name"),
    ("responses_create_params",),
    ("responses_create_params", "input"),
    ("verifier_metadata",),
    ("_ng_environment_server",),
]
RESULT_PATHS: list[tuple[str, ...]] = [
    ("_ng_task_index",),
    ("_ng_rollout_index",),
    ("reward",),
    ("is_correct",),
    ("latency_s",),
    ("mask_sample",),
    ("agent_ref",),
    ("responses_create_params",),
    ("response",),
    ("response", "usage"),
    ("response", "usage", "input_tokens"),
    ("response", "usage", "total_tokens"),
]


def _lines(rows: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(row) + b"\n" for row in rows]


# --------------------------------------------------------------------------- mutations

# Raw JSON text that no JSON reader may accept: NaN/Infinity literals, numbers beyond a double,
# invalid UTF-8, a lone surrogate, nesting beyond orjson's 1024 levels, broken syntax.
MALFORMED = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e999",
    b"1" + b"0" * 400,
    b'"\xff"',
    b'"\xc3\x28"',
    b'"\\ud800"',
    b"[" * 1100 + b"]" * 1100,
    b"tru",
    b"[1,]",
    b"'x'",
]
# Valid text that is still hostile: ints beyond int64 (or u64: floats), extreme doubles, nesting
# deeper than orjson writes back (254) but within what it reads.
HOSTILE = [
    b"9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"1" + b"0" * 30,
    b"1.7976931348623157e308",
    b"-1.7976931348623157e308",
    b"5e-324",
    b"-0.0",
    *(b"[" * d + b"]" * d for d in (200, 253, 254, 255, 256, 600, 1000)),
]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # what orjson writes as an int
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
).map(orjson.dumps)
_BAD_BYTES = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\x80", b"\xed\xa0\x80", b"\x00"])


class Mutation(NamedTuple):
    """One change to one line: ``op`` with its arguments; ``line`` is 0-based."""

    file: str  # INPUTS or ROLLOUTS
    line: int
    op: str  # set, delete, truncate, insert, garbage, blank, join, crlf
    path: tuple[str, ...] = ()
    literal: bytes = b""
    at: int = 0

    @property
    def malformed(self) -> bool:
        """The change can only give malformed JSON (the error must say so)."""
        if self.op == "join":  # the line and the next one: trailing characters (if any)
            return self.line < len(KEYS) - 1
        return self.op in ("blank", "truncate", "insert") or (
            self.op == "set" and self.literal in MALFORMED
        )


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    file = draw(st.sampled_from([INPUTS, ROLLOUTS]))
    line = draw(st.integers(0, len(KEYS) - 1))
    op = draw(st.sampled_from(["set", "set", "set", "delete", "truncate", "insert", "garbage"]))
    op = draw(st.sampled_from([op, op, op, "blank", "join", "crlf"]))
    paths = INPUT_PATHS if file == INPUTS else RESULT_PATHS
    if op in ("set", "delete"):
        path = draw(st.sampled_from(paths))
        literal = draw(st.one_of(_VALUES, st.sampled_from(MALFORMED), st.sampled_from(HOSTILE)))
        return Mutation(file, line, op, path, literal)
    if op == "insert":
        return Mutation(file, line, op, literal=draw(_BAD_BYTES), at=draw(st.integers(0, 300)))
    if op == "garbage":
        return Mutation(file, line, op, literal=draw(st.binary(max_size=40)))
    return Mutation(file, line, op, at=draw(st.integers(0, 300)))


_HOLE = "\x01hole\x01"


def _set(row: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``row`` with ``path`` set (None: removed); parents that are not objects are replaced."""
    row = orjson.loads(orjson.dumps(row))
    target = row
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    return row


def apply(m: Mutation) -> tuple[bytes, bytes, int]:
    """The two files after ``m``, and the 1-based line that an error must name."""
    rows = ROWS if m.file == INPUTS else RESULTS
    lines = _lines(rows)
    line = lines[m.line]
    target = m.line + 1
    if m.op == "set":
        hole = orjson.dumps(_set(rows[m.line], m.path, _HOLE))
        line = hole.replace(orjson.dumps(_HOLE), m.literal) + b"\n"
    elif m.op == "delete":
        line = orjson.dumps(_set(rows[m.line], m.path, None)) + b"\n"
    elif m.op == "truncate":
        line = line[: m.at % (len(line) - 1)] + b"\n"
    elif m.op == "insert":
        at = m.at % len(line)
        line = line[:at] + m.literal + line[at:]
    elif m.op == "garbage":
        line = m.literal.replace(b"\n", b" ") + b"\n"
    elif m.op == "blank":
        line = b"\n" + line
    elif m.op == "join":
        line = line[:-1] + b" "
        if m.line == len(lines) - 1:
            line = line[:-1]  # the last line without its newline: still a valid file
    elif m.op == "crlf":
        line = line[:-1] + b"\r\n"
    lines[m.line] = line
    data = b"".join(lines)
    if m.file == INPUTS:
        return data, b"".join(_lines(RESULTS)), target
    return b"".join(_lines(ROWS)), data, target


# --------------------------------------------------------------------------- checks


class Files(NamedTuple):
    folder: Path
    inputs: Path
    rollouts: Path


@contextlib.contextmanager
def collection(inputs: bytes, rollouts: bytes) -> Iterator[Files]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = Files(folder, folder / INPUTS, folder / ROLLOUTS)
        files.inputs.write_bytes(inputs)
        files.rollouts.write_bytes(rollouts)
        yield files


def fingerprint(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry of ``folder`` (dotfiles included) with its bytes and mtime."""
    return {
        p.name: (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
        for p in folder.iterdir()
    }


@contextlib.contextmanager
def parallel_reader(on: bool) -> Iterator[None]:
    """Make the batch reader fork its workers even for tiny files (errors are renumbered)."""
    saved = rewardstream.processors.batch._PARALLEL_MIN_BYTES
    rewardstream.processors.batch._PARALLEL_MIN_BYTES = 1 if on else saved
    try:
        yield
    finally:
        rewardstream.processors.batch._PARALLEL_MIN_BYTES = saved


class Outcome(NamedTuple):
    code: int
    out: str
    err: str


def profile(files: Files, verb: bool = False) -> Outcome:
    """``ng_reward_profile`` (or ``rewardstream profile``) in process, its output captured.
    Warnings are errors under pytest, so a stray numpy warning fails here too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if verb:
            argv = ["profile", "--inputs", str(files.inputs), "--rollouts", str(files.rollouts)]
            code = main([*argv, "--quiet"])
        else:
            code = ng_reward_profile(
                [
                    f"+materialized_inputs_jsonl_fpath={files.inputs}",
                    f"+rollouts_jsonl_fpath={files.rollouts}",
                    "+quiet=true",
                ]
            )
    return Outcome(code, out.getvalue(), err.getvalue())


_LOCATED = re.compile(
    r"^(?:Malformed JSON in '(?P<m>.+?)' at line (?P<ml>\d+): |(?P<p>.+?) line (?P<pl>\d+): )"
)


def located(message: str) -> tuple[str, int, bool] | None:
    """(file, 1-based line, malformed) named by an error message, or None."""
    found = _LOCATED.match(message)
    if found is None:
        return None
    if found["m"] is not None:
        return found["m"], int(found["ml"]), True
    return found["p"], int(found["pl"]), False


def check_failure(
    files: Files, before: dict[str, tuple[bytes, int]], got: Outcome, prog: str
) -> str:
    """Exit 2, one line on stderr, no traceback, nothing written; returns the message."""
    assert got.code == 2, got
    assert got.err.count("\n") == 1 and got.err.endswith("\n"), got.err
    assert "Traceback" not in got.err
    assert got.err.startswith(f"{prog}: error: "), got.err
    assert fingerprint(files.folder) == before  # no output, no temp file, inputs untouched
    return got.err[len(f"{prog}: error: ") : -1]


NO_LIMIT = MessageLimit("rewardstream.rollouts", MAX_MESSAGE_BYTES)  # the producer's own only


def publish_error(path: Path, make_event: MakeEvent, follow: bool = False) -> LineError | None:
    """The error the publisher's encoder meets in ``path`` (the code its forked children run,
    or with ``follow`` the tailing path), or None when every line encodes."""
    if follow:  # split as Tail splits: at b"\n" only
        lines = re.findall(rb"[^\n]*\n", path.read_bytes())
        rows = parsed(enumerate(lines, 1), path)
    else:
        rows = map(itemgetter(0, 2), iter_jsonl(path))
    try:
        for _ in encode_rows(rows, path, make_event, "run", NO_LIMIT):
            pass
    except LineError as exc:
        return exc
    return None


# --------------------------------------------------------------------------- the property


@pytest.mark.parametrize("reader", READERS)
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutations(), st.booleans(), st.sampled_from([False, False, False, True]))
@example(Mutation(ROLLOUTS, 0, "set", ("reward",), b"1.7976931348623157e308"), False, False)
@example(Mutation(ROLLOUTS, 2, "set", ("reward",), b"-1.7976931348623157e308"), False, False)
@example(Mutation(INPUTS, 0, "set", ("_ng_task_index",), b"[" * 1000 + b"]" * 1000), False, False)
@example(Mutation(INPUTS, 0, "set", ("responses_create_params",), HOSTILE[-1]), False, True)
@example(Mutation(INPUTS, 1, "set", ("agent_ref",), b'"agent_0"'), False, False)
@example(Mutation(INPUTS, 4, "insert", literal=b"\xff", at=10), False, True)
@example(Mutation(ROLLOUTS, 5, "set", ("response", "usage"), b"[1]"), True, False)
def test_any_bad_line_is_one_located_error_and_publish_agrees(
    reader: str, m: Mutation, verb: bool, parallel: bool
) -> None:
    inputs, rollouts, line = apply(m)
    with collection(inputs, rollouts) as files:
        before = fingerprint(files.folder)
        with parallel_reader(parallel), reading_with(reader):
            got = profile(files, verb)
        prog = "rewardstream profile" if verb else "ng_reward_profile"
        mutated = files.inputs if m.file == INPUTS else files.rollouts
        where = None
        if got.code == 0:
            assert got.err == ""
            assert not m.malformed
            after = fingerprint(files.folder)
            assert sorted(after) == sorted([INPUTS, ROLLOUTS, *OUTPUTS])
            assert {k: after[k] for k in before} == before
        else:
            message = check_failure(files, before, got, prog)
            where = located(message)
            if m.malformed:
                assert where == (str(mutated), line, True), message
            if where is None:  # an alignment error, in NeMo Gym's words
                assert message.startswith("ValueError: "), message
            else:
                assert where[:2] == (str(mutated), line), message

        # the publisher validates each line exactly as the profiler reads it
        in_error = publish_error(files.inputs, input_event)
        out_error = publish_error(files.rollouts, rollout_event)
        if rollouts.endswith(b"\n"):
            followed = publish_error(files.rollouts, rollout_event, follow=True)
            assert str(followed) == str(out_error)
        deep = m.file == INPUTS and m.op == "set" and m.literal.startswith(b"[" * 250)
        if where is not None and where[0] == str(files.inputs):
            assert in_error is not None, message
            assert (in_error.path, in_error.lineno) == where[:2]
            if "sample row" not in message:  # the profiler writes rows back only as samples
                assert (str(in_error), out_error) == (message, None)
        elif where is not None:
            assert (in_error, str(out_error)) == (None, message)
        elif deep and in_error is not None:
            # a row nested deeper than orjson writes (about 254 levels) is refused by the
            # publisher (its event cannot be encoded), even where the profiler never has to
            # write that row back as a task's sample
            assert (in_error.lineno, out_error) == (line, None)
            assert "Recursion limit" in in_error.reason
        else:
            assert (in_error, out_error) == (None, None)


# --------------------------------------------------------------------------- whole files


def _valid() -> tuple[bytes, bytes]:
    return b"".join(_lines(ROWS)), b"".join(_lines(RESULTS))


_IN_MALFORMED, _OUT_MALFORMED = r"Malformed JSON in '{i}' at line 1: ", r"Malformed JSON in '{r}' "
_VALID_ROLLOUTS = b"".join(_lines(RESULTS))
WHOLE_FILES: list[tuple[str, bytes | None, bytes | None, str]] = [
    # (id, inputs or None for valid, rollouts or None for valid, expected message regex)
    ("empty-inputs", b"", None, r"ValueError: Rollout results contain rows with no matching"),
    ("empty-rollouts", None, b"", r"ValueError: Materialized input rows and rollout results"),
    ("binary-inputs", bytes(range(256)) * 8, None, _IN_MALFORMED),
    ("binary-rollouts", None, b"\x00\x01\x02" * 100, _OUT_MALFORMED),
    ("utf16-rollouts", None, _VALID_ROLLOUTS.decode().encode("utf-16"), _OUT_MALFORMED),
    ("bom-inputs", b"\xef\xbb\xbf" + b"".join(_lines(ROWS)), None, _IN_MALFORMED),
    ("only-newlines", None, b"\n\n", _OUT_MALFORMED + "at line 1: input data is empty"),
    ("gzip-inputs", b"\x1f\x8b\x08\x00" + bytes(200), None, _IN_MALFORMED),
    ("json-array", None, b"[" + _VALID_ROLLOUTS.replace(b"\n", b",")[:-1] + b"]\n", "{r} line 1: "),
]


@pytest.mark.parametrize(
    ("inputs", "rollouts", "pattern"),
    [pytest.param(i, r, p, id=name) for name, i, r, p in WHOLE_FILES],
)
def test_whole_bad_files(inputs: bytes | None, rollouts: bytes | None, pattern: str) -> None:
    good_inputs, good_rollouts = _valid()
    with collection(
        good_inputs if inputs is None else inputs, good_rollouts if rollouts is None else rollouts
    ) as files:
        before = fingerprint(files.folder)
        message = check_failure(files, before, profile(files), "ng_reward_profile")
        expected = pattern.format(i=re.escape(str(files.inputs)), r=re.escape(str(files.rollouts)))
        assert re.match(expected, message), message


def test_both_files_empty_is_an_empty_profile() -> None:
    with collection(b"", b"") as files:
        got = profile(files)
        assert (got.code, got.err) == (0, "")
        assert "0/0 rollout rows (100.00%)" in got.out
        assert [(files.folder / n).read_bytes() for n in OUTPUTS] == [b"", b"[]", b"[]"]


def test_missing_and_unreadable_paths() -> None:
    with collection(*_valid()) as files:
        before = fingerprint(files.folder)
        nope = files.folder / "nope.jsonl"
        cases = [
            (nope, files.rollouts, r"Input file not found: '.*nope\.jsonl' \(\+materialized_"),
            (files.inputs, nope, r"Input file not found: '.*nope\.jsonl' \(\+rollouts_jsonl_"),
            (files.inputs, files.folder, r"Input path is not a regular file: '.*' \(\+rollouts_"),
            (Path("/dev/null"), files.rollouts, r"Input path is not a regular file: '/dev/null'"),
        ]
        for inputs, rollouts, pattern in cases:
            message = check_failure(
                files, before, profile(Files(files.folder, inputs, rollouts)), "ng_reward_profile"
            )
            assert re.match(pattern, message), message


# --------------------------------------------------------------------------- real processes


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], prog: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{prog}: error: ")
    return proc.stderr[len(f"{prog}: error: ") : -1]


_DEEP = b"[" * 2000 + b"]" * 2000
SUBPROCESS_CASES: list[tuple[str, str, int, Callable[[bytes], bytes]]] = [
    ("invalid-utf8", ROLLOUTS, 3, lambda line: line[:20] + b"\xff\xfe" + line[20:]),
    ("nan-reward", ROLLOUTS, 2, lambda line: re.sub(rb'"reward":[0-9.]+', b'"reward":NaN', line)),
    (
        "huge-int",
        INPUTS,
        4,
        lambda line: line.replace(b'_index":1,', b'_index":1' + b"0" * 30 + b","),
    ),
    ("too-deep", INPUTS, 1, lambda line: line.replace(b'"temperature":1.0', b'"t":' + _DEEP)),
    ("truncated", ROLLOUTS, 6, lambda line: line[:37]),
]


@pytest.mark.parametrize(
    ("file", "lineno", "edit"),
    [pytest.param(f, n, e, id=name) for name, f, n, e in SUBPROCESS_CASES],
)
def test_console_scripts_exit_2_without_traceback(
    file: str, lineno: int, edit: Callable[[bytes], bytes]
) -> None:
    """``ng_reward_profile`` and ``rewardstream profile`` as real processes, warnings as errors
    (``-W error``), so a warning would show as a traceback."""
    lines = _lines(ROWS if file == INPUTS else RESULTS)
    lines[lineno - 1] = edit(lines[lineno - 1][:-1]) + b"\n"
    inputs, rollouts = _valid()
    with collection(
        b"".join(lines) if file == INPUTS else inputs,
        b"".join(lines) if file == ROLLOUTS else rollouts,
    ) as files:
        before = fingerprint(files.folder)
        script = str(BIN / "ng_reward_profile")
        argv = [f"+materialized_inputs_jsonl_fpath={files.inputs}"]
        argv += [f"+rollouts_jsonl_fpath={files.rollouts}"]
        message = _one_line_exit_2(run(script, *argv), "ng_reward_profile")
        where = located(message)
        assert where is not None and where[:2] == (str(files.folder / file), lineno), message
        cli = [sys.executable, "-W", "error", "-m", "rewardstream.commands.cli", "profile"]
        proc = run(*cli, "--inputs", str(files.inputs), "--rollouts", str(files.rollouts))
        assert _one_line_exit_2(proc, "rewardstream profile") == message
        assert fingerprint(files.folder) == before


def test_huge_doubles_profile_without_warnings() -> None:
    """Finite doubles whose sums overflow are valid input: the profile is written (inf is
    written as null, as orjson writes it) with nothing on stderr, even with ``-W error``."""
    results = [
        r | {"reward": 1.7976931348623157e308 * (1 if i % 3 else -1)} for i, r in enumerate(RESULTS)
    ]
    with collection(b"".join(_lines(ROWS)), b"".join(_lines(results))) as files:
        cli = [
            sys.executable,
            "-W",
            "error",
            "-m",
            "rewardstream.commands.cli",
            "profile",
            "--quiet",
        ]
        proc = run(*cli, "--inputs", str(files.inputs), "--rollouts", str(files.rollouts))
        assert (proc.returncode, proc.stderr) == (0, "")
        agents = orjson.loads((files.folder / OUTPUTS[1]).read_bytes())
        assert {a["agent_ref"]["name"] for a in agents} == {"agent_0", "agent_1"}


# --------------------------------------------------------------------------- publish


def publish_argv(files: Files, bootstrap: str, prefix: str = "rewardstream") -> list[str]:
    return [
        str(BIN / "rewardstream"),
        "publish",
        "--inputs",
        str(files.inputs),
        "--rollouts",
        str(files.rollouts),
        "--bootstrap",
        bootstrap,
        "--topic-prefix",
        prefix,
        "--run-id",
        "fuzz",
        "--quiet",
    ]


def test_publish_file_errors_before_connecting() -> None:
    """Missing files, folders and an unusable stem fail before any connection (nothing
    listens on the bootstrap port)."""
    bogus = f"127.0.0.1:{free_port()}"
    with collection(*_valid()) as files:
        before = fingerprint(files.folder)
        nope = files.folder / "nope.jsonl"
        cases = [
            (files._replace(inputs=nope), r"Input file not found: '.*nope\.jsonl' \(--inputs\)"),
            (
                files._replace(rollouts=nope),
                r"Input file not found: '.*nope\.jsonl' \(--rollouts\)",
            ),
            (files._replace(rollouts=files.folder), r"Input path is not a regular file"),
        ]
        for case, pattern in cases:
            message = _one_line_exit_2(run(*publish_argv(case, bogus)), "rewardstream")
            assert re.match(pattern, message), message
        argv = publish_argv(files, bogus)
        argv[argv.index("--run-id") + 1] = "../escape"
        message = _one_line_exit_2(run(*argv), "rewardstream")
        assert message.startswith("invalid run id '../escape'"), message
        assert fingerprint(files.folder) == before


async def read_topic(bootstrap: str, topic: str) -> list[bytes]:
    """Every value in partition 0 of ``topic``, up to its current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        async with asyncio.timeout(30):
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


PUBLISH_CASES = [
    # (id, mutation, lines of the inputs and of the rollouts file sent before it failed)
    ("rollouts-invalid-utf8", Mutation(ROLLOUTS, 2, "insert", literal=b"\xff", at=30), 6, 2),
    ("rollouts-nan", Mutation(ROLLOUTS, 4, "set", ("reward",), b"NaN"), 6, 4),
    ("rollouts-usage-list", Mutation(ROLLOUTS, 0, "set", ("response", "usage"), b"[1]"), 6, 0),
    ("rollouts-task-2**63", Mutation(ROLLOUTS, 5, "set", ("_ng_task_index",), HOSTILE[0]), 6, 5),
    ("inputs-agent-name-int", Mutation(INPUTS, 3, "set", ("agent_ref", "name"), b"5"), 3, 0),
    ("inputs-agent-ref-string", Mutation(INPUTS, 1, "set", ("agent_ref",), b'"a"'), 1, 0),
    ("inputs-truncated", Mutation(INPUTS, 5, "truncate", at=40), 5, 0),
]


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("m", "inputs_sent", "rollouts_sent"),
    [pytest.param(m, i, r, id=name) for name, m, i, r in PUBLISH_CASES],
)
def test_publish_stops_at_the_bad_line_and_says_so(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    m: Mutation,
    inputs_sent: int,
    rollouts_sent: int,
) -> None:
    """Lines are validated as they are read: the events before the bad line were sent (a
    republish after a fix deduplicates them), nothing of it or after it, and the run was never
    finished. The error is the profiler's, located, plus what the topics now hold."""
    prefix = unique_name("fuzz")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, partitions=1))
    inputs, rollouts, line = apply(m)
    with collection(inputs, rollouts) as files:
        before = fingerprint(files.folder)
        batch = check_failure(files, before, profile(files), "ng_reward_profile")
        message = _one_line_exit_2(
            run(*publish_argv(files, kafka_bootstrap, prefix)), "rewardstream"
        )
        assert message.startswith(f"{batch} (publishing stopped at this line: "), message
        assert "run 'fuzz' was left unfinished" in message
        mutated = files.inputs if m.file == INPUTS else files.rollouts
        assert located(message) == (str(mutated), line, located(batch)[2])  # type: ignore[index]
        assert fingerprint(files.folder) == before

    sent_inputs = [decode_input(v) for v in asyncio.run(read_topic(kafka_bootstrap, topics.inputs))]
    assert [e.line for e in sent_inputs] == list(range(inputs_sent))
    sent = [decode_rollout(v) for v in asyncio.run(read_topic(kafka_bootstrap, topics.rollouts))]
    assert [(e.task, e.rollout) for e in sent] == [
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in RESULTS[:rollouts_sent]
    ]
    control = [decode_control(v) for v in asyncio.run(read_topic(kafka_bootstrap, topics.control))]
    assert [e.type for e in control] == (["run_started"] if m.file == ROLLOUTS else [])


@pytest.mark.kafka
def test_publish_empty_files_is_an_empty_run(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    prefix = unique_name("fuzz")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, partitions=1))
    with collection(b"", b"") as files:
        before = fingerprint(files.folder)
        proc = run(*publish_argv(files, kafka_bootstrap, prefix))
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
        assert proc.stdout.startswith("published run_id=fuzz inputs=0 rollouts=0 in ")
        assert fingerprint(files.folder) == before
    control = [decode_control(v) for v in asyncio.run(read_topic(kafka_bootstrap, topics.control))]
    assert [(e.type, getattr(e, "expected_rollouts", None)) for e in control] == [
        ("run_started", 0),
        ("run_finished", None),
    ]
