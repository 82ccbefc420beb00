"""Hardening: no traceback, no surprise. Every command is run as a real process on real files;
each test names the case of the issue it covers."""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import socket
import subprocess
import sys
import time
from importlib.metadata import distribution, version
from pathlib import Path

import pytest
from pydantic import BaseModel

import rewardstream.gym_servers.ng_run
from rewardstream.commands.cli import build_parser
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.infra.command import SIGPIPE_EXIT
from rewardstream.kafka.local import free_port
from rewardstream.kafka.options import normalize_bootstrap
from rewardstream.processors.batch import ProfileConfig
from rewardstream.producers.gym.aggregate_rollouts import AggregateConfig
from rewardstream.producers.gym.collect import CollectConfig
from tests.golden import golden_cases

CLI = [sys.executable, "-m", "rewardstream.commands.cli"]
SCRIPTS = tuple(  # every console script the package installs
    sorted(
        e.name for e in distribution("rewardstream").entry_points if e.group == "console_scripts"
    )
)
ROW = b'{"q":"x","agent_ref":{"name":"a"},"_ng_task_index":0,"_ng_rollout_index":0}\n'
RESULT = b'{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":0}\n'


def script(name: str) -> str:
    """The installed console script ``name`` (what a user runs)."""
    exe = Path(sys.executable).parent / name
    assert exe.exists(), f"package not installed with its console scripts: no {exe}"
    return str(exe)


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def assert_one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and exactly one line on stderr, no traceback; returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


# --------------------------------------------------------------------- 1. a host without a port


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost", "localhost:9092"),
        ("localhost:9093", "localhost:9093"),
        ("kafka-1, kafka-2:9093", "kafka-1:9092,kafka-2:9093"),
        ("[::1]", "[::1]:9092"),
        ("::1", "[::1]:9092"),
        ("9093", "127.0.0.1:9093"),
    ],
)
def test_a_host_alone_is_on_kafkas_port(given: str, expected: str) -> None:
    assert normalize_bootstrap(given) == expected


@pytest.mark.parametrize("bad", ["", "host:", ":9092", "host:abc", "host:0", "host:70000", "a,,b"])
def test_a_bad_bootstrap_entry_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected HOST"):
        normalize_bootstrap(bad)


def test_bootstrap_localhost_is_read_as_localhost_9092() -> None:
    if listening("localhost", 9092):
        pytest.skip("a broker listens on localhost:9092: this test must not touch it")
    proc = run([*CLI, "profiles", "list", "--bootstrap", "localhost"])
    line = assert_one_line_error(proc)
    assert "invalid literal for int()" not in proc.stderr
    assert line.startswith("rewardstream: error: cannot reach Kafka at localhost:9092"), line


def test_a_bad_bootstrap_is_an_option_error() -> None:
    proc = run([*CLI, "profiles", "list", "--bootstrap", "localhost:x"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --bootstrap: expected HOST[:PORT]" in proc.stderr


# --------------------------------------------------------------------- 2. a URL without a scheme


def test_snapshot_url_without_scheme_is_http(tmp_path: Path) -> None:
    port = closed_port()
    cmd = [*CLI, "snapshot", "--url", f"127.0.0.1:{port}", "--run-id", "r"]
    proc = run([*cmd, "--out", str(tmp_path / "out")])
    line = assert_one_line_error(proc)
    assert "unknown url type" not in line
    assert line.startswith(f"rewardstream: error: cannot reach http://127.0.0.1:{port}"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("10.0.0.5:9400", "http://10.0.0.5:9400"),
        ("9400", "http://127.0.0.1:9400"),
        ("[::1]:9400", "http://[::1]:9400"),
        ("http://h:1", "http://h:1"),
    ],
)
def test_every_url_option_takes_host_port(given: str, url: str) -> None:
    parser = build_parser()
    snap = parser.parse_args(["snapshot", "--url", given, "--run-id", "r", "--out", "o"])
    stream = parser.parse_args(["stream", "--bootstrap", "k", "--advertise-url", given])
    assert snap.url == stream.advertise_url == url


def test_a_url_that_is_no_url_is_an_option_error() -> None:
    proc = run([*CLI, "snapshot", "--url", "ftp://h:1", "--run-id", "r", "--out", "o"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --url: expected http://HOST:PORT" in proc.stderr


# --------------------------------------------------------------------- 3. a reader that goes away


@pytest.mark.parametrize("reader", ["head -1", "true"])
def test_a_closed_stdout_ends_quietly(tmp_path: Path, reader: str) -> None:
    """``true`` closes the pipe before anything is written (exit 141 for sure); ``head -1``
    after the first line (141, or 0 if every line was in the pipe before it left)."""
    case = next(c for c in golden_cases() if c.name == "blackjack")
    inputs, rollouts = case.copy_inputs(tmp_path)
    cmd = [
        script("ng_reward_profile"),
        f"+materialized_inputs_jsonl_fpath={inputs}",
        f"+rollouts_jsonl_fpath={rollouts}",
        "+quiet=true",
    ]
    shell = f"{shlex.join(cmd)} | {reader}; exit ${{PIPESTATUS[0]}}"
    proc = run(["bash", "-c", shell])
    assert proc.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"
    assert proc.returncode in ((0, SIGPIPE_EXIT) if reader != "true" else (SIGPIPE_EXIT,))
    if reader.startswith("head"):
        assert proc.stdout == "Profiling outputs:\n"
    assert rollouts.with_name(f"{case.stem}_reward_profiling.jsonl").exists()


# --------------------------------------------------------------------- 4. malformed overrides


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("+head_server.port=abc", "head_server.port"),
        ("+head_server.port=null", "head_server.port"),
        ("+head_server=5", "head_server"),
        ("+head_server.host=[1]", "head_server.host"),
        ("+policy_model.responses_api_models.simulated_model.port=x", "simulated_model.port"),
        ("+policy_base_url=${policy_base_url}", "policy_base_url"),
        ("+config_paths=5", "config_paths"),
        ("+x.responses_api_agents.y=5", "x.responses_api_agents.y"),
        ("+head_server.port=" + "9" * 5000, "head_server.port"),  # too long for int()
        ("+x=" + "[" * 3000 + "]" * 3000, "override 'x'"),  # too deep to parse
    ],
)
def test_ng_run_names_a_malformed_override(override: str, named: str) -> None:
    proc = run([script("ng_run"), f"+config_paths=[{BUNDLED_CONFIG}]", override], timeout=60)
    line = assert_one_line_error(proc)
    assert line.startswith("ng_run: error: ") and named in line, line


# --------------------------------------------------------------------- 5. replay twice


def test_replay_twice_into_the_same_folder_says_what_it_did(tmp_path: Path) -> None:
    inputs, rollouts = tmp_path / "r_materialized_inputs.jsonl", tmp_path / "r.jsonl"
    inputs.write_bytes(ROW)
    rollouts.write_bytes(RESULT)
    out = tmp_path / "out"
    cmd = [*CLI, "replay", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    cmd += ["--output-dir", str(out)]
    profile = out / "r" / "r_reward_profiling.jsonl"

    first = run(cmd)
    assert first.returncode == 0, first.stderr
    assert "already" not in first.stdout and "replaced" not in first.stdout
    written = profile.read_bytes()

    second = run(cmd)
    assert second.returncode == 0, second.stderr
    assert "no profile written" not in second.stderr
    assert first.stdout in second.stdout  # the same three paths
    assert f"Run r already had this profile in {out / 'r'}: written again, unchanged" in (
        second.stdout
    )
    assert profile.read_bytes() == written

    rollouts.write_bytes(RESULT.replace(b'"reward":1.0', b'"reward":0.0'))
    third = run(cmd)
    assert third.returncode == 0, third.stderr
    assert f"Run r had a different profile in {out / 'r'}: replaced by this one" in third.stdout
    assert profile.read_bytes() != written


# --------------------------------------------------------------------- 6. --version


@pytest.mark.parametrize("name", SCRIPTS)
def test_version_on_every_command(name: str) -> None:
    proc = run([script(name), "--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{name} {version('rewardstream')}\n"
    assert proc.stderr == ""


# --------------------------------------------------------------------- 7. help texts


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser under it, with the words that reach each."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, (*path, name))
    return found


PARSERS = _parsers(build_parser())


def test_no_option_or_subcommand_without_help() -> None:
    empty = []
    for path, parser in PARSERS:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                empty += [(*path, name) for name in action.choices if name not in helped]
            elif not action.help or action.help == argparse.SUPPRESS:
                empty.append((*path, "/".join(action.option_strings) or action.dest))
    assert empty == []


@pytest.mark.parametrize("path", [p for p, _ in PARSERS], ids=lambda p: " ".join(p) or "-")
def test_rewardstream_help_lists_every_option(path: tuple[str, ...]) -> None:
    parser = dict(PARSERS)[path]
    proc = run([script("rewardstream"), *path, "--help"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for action in parser._actions:
        for option in action.option_strings:
            assert re.search(rf"(^|[\s,\[]){re.escape(option)}\b", proc.stdout), option
    if not path:
        assert "--version" in proc.stdout


def _override_lines(help_text: str) -> dict[str, str]:
    """``+key`` (or ``++key``) -> the rest of its line, for each override line of a help."""
    lines = {}
    for line in help_text.splitlines():
        m = re.match(r"^\s+\+{1,2}([\w.]+?)(?:[=.][^\s]*)?\s+(.*)$", line)
        if m:
            lines[m.group(1)] = m.group(2)
    return lines


def test_ng_reward_profile_help_lists_every_key() -> None:
    proc = run([script("ng_reward_profile"), "--help"])
    assert proc.returncode == 0
    lines = _override_lines(proc.stdout)
    for name, field in ProfileConfig.model_fields.items():
        assert lines.get(name), name
        assert ("(required)" in lines[name]) == field.is_required(), name
    assert "--version" in proc.stdout


def _help_of(command: str, model: type[BaseModel]) -> tuple[str, dict[str, str]]:
    """``command --help`` and its override lines, each of ``model``'s keys listed and marked
    "(required)" exactly when it is."""
    proc = run([script(command), "--help"])
    assert proc.returncode == 0
    lines = _override_lines(proc.stdout)
    for name, field in model.model_fields.items():
        assert lines.get(name), f"+{name} is not in {command} --help"
        assert ("(required)" in lines[name]) == field.is_required(), name
    assert "--version" in proc.stdout
    return proc.stdout, lines


def test_ng_collect_rollouts_help_lists_every_key_and_marks_the_required_ones() -> None:
    text, lines = _help_of("ng_collect_rollouts", CollectConfig)
    assert "(required)" not in lines["agent_name"]
    assert "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS" in text


def test_ng_aggregate_rollouts_help_lists_every_key_and_how_to_shard() -> None:
    text, _ = _help_of("ng_aggregate_rollouts", AggregateConfig)
    assert "``" not in text and ":func:" not in text  # no reST markup
    assert "_ng_task_index" in text


def test_ng_run_help_lists_every_key_it_reads() -> None:
    source = Path(rewardstream.gym_servers.ng_run.__file__).read_text()
    read = set(re.findall(r"""\.(?:get|pop)\(\s*"(\w+)"|\["(\w+)"\]""", source))
    keys = {k for pair in read for k in pair if k}
    assert {"config_paths", "head_server", "host", "port", "entrypoint"} <= keys
    referenced = set(re.findall(r"\$\{(\w+)\}", BUNDLED_CONFIG.read_text()))
    assert {"policy_base_url", "policy_api_key", "policy_model_name"} <= referenced
    proc = run([script("ng_run"), "--help"])
    assert proc.returncode == 0
    for key in keys:
        assert re.search(rf"[+.]{key}[=.]", proc.stdout), f"{key} is not in ng_run --help"
    lines = _override_lines(proc.stdout)
    for key in referenced:
        assert lines.get(key), f"+{key} is not in ng_run --help"
    assert "(required)" in lines["config_paths"] and "--version" in proc.stdout


def test_help_is_quiet_on_a_closed_stdout() -> None:
    for name in ("rewardstream", "ng_reward_profile", "ng_run"):
        proc = run(["bash", "-c", f"{shlex.quote(script(name))} --help | true"])
        assert proc.stderr == "", (name, proc.stderr)


# --------------------------------------------------------------------------- the second sweep
# What a sweep of every command found after the first round of fixes: the same classes of
# fault in other places.


def _pair(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    inputs.write_bytes(ROW)
    rollouts.write_bytes(RESULT)
    return inputs, rollouts


def test_no_command_writes_over_its_own_input(tmp_path: Path) -> None:
    """An inputs file named like an output (r_reward_profiling.jsonl next to r.jsonl) used to
    be replaced by the profile, with exit 0."""
    inputs, rollouts = _pair(tmp_path / "a")
    victim = inputs.rename(tmp_path / "a" / "r_reward_profiling.jsonl")
    for argv in (
        [*CLI, "profile", "--inputs", str(victim), "--rollouts", str(rollouts)],
        [
            script("ng_reward_profile"),
            f"+materialized_inputs_jsonl_fpath={victim}",
            f"+rollouts_jsonl_fpath={rollouts}",
        ],
        [
            *CLI,
            "publish",
            "--inputs",
            str(victim),
            "--rollouts",
            str(rollouts),
            "--bootstrap",
            "127.0.0.1:1",
            "--wait-profile",
        ],
    ):
        line = assert_one_line_error(run(argv))
        assert f"Cannot write '{victim}': it is the input file given as" in line, line
        assert victim.read_bytes() == ROW
    out = tmp_path / "out"
    (out / "r").mkdir(parents=True)
    inside = out / "r" / "r_agent_metrics.json"
    inside.write_bytes(ROW)
    line = assert_one_line_error(
        run(
            [
                *CLI,
                "replay",
                "--inputs",
                str(inside),
                "--rollouts",
                str(rollouts),
                "--output-dir",
                str(out),
            ]
        )
    )
    assert "it is the input file given as --inputs" in line and inside.read_bytes() == ROW


def test_replay_refuses_a_device_at_an_output_without_reading_it(tmp_path: Path) -> None:
    """It used to hash the existing output first: /dev/full (or a FIFO) there hung it."""
    inputs, rollouts = _pair(tmp_path / "a")
    (tmp_path / "o" / "r").mkdir(parents=True)
    (tmp_path / "o" / "r" / "r_reward_profiling.jsonl").symlink_to("/dev/full")
    argv = [*CLI, "replay", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    line = assert_one_line_error(run([*argv, "--output-dir", str(tmp_path / "o")], timeout=30))
    assert "is a character device, not a regular file" in line


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["snapshoot"], "(did you mean 'snapshot'?)"),
        (["profiles", "gett"], "(did you mean 'get'?)"),
        (["kafka", "stat"], "(did you mean 'start' or 'status'?)"),
        (["profile", "--quite"], "unrecognized arguments: --quite (did you mean '--quiet'?)"),
        (
            ["replay", "--in", "i", "--output_dir", "o", "--rollout", "r", "--snapshot-timeout"],
            "(did you mean '--output-dir'?)",  # replay has no --snapshot-timeout: no guess
        ),
        (["profile", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else "",
)
def test_a_mistyped_command_or_flag_gets_the_closest_known_one(argv: list[str], hint: str) -> None:
    """argparse lists every choice, or says only "unrecognized"; the line ends with a guess
    (none when nothing is close)."""
    proc = run([*CLI, *argv], timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(hint), last
    if "frobnicate" in hint:
        assert "did you mean" not in last


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--inputs", "{i}", "--rollouts", "{r}", "--output-dir", "{file}"],
        ["replay", "--inputs", "{i}", "--rollouts", "{r}", "--output-dir", "/dev/null"],
        ["kafka", "status", "--state-dir", "{file}"],
        ["kafka", "stop", "--state-dir", "{file}"],
        ["demo", "--repeats", "0"],
        ["demo", "--parallel", "-3"],
        ["stream", "--bootstrap", "x", "--evict-after", "0"],
        ["stream", "--bootstrap", "x", "--checkpoint-every", "nan"],
        ["stream", "--bootstrap", "x", "--topic-prefix", "a/b"],
        ["stream", "--bootstrap", "x", "--compare", "a"],
        ["stream", "--bootstrap", "x", "--compare", "a:a"],
        ["stream", "--bootstrap", "x", "--compare", "a:b/c"],
        ["stream", "--bootstrap", "x", "--compare-level", "1"],
        ["stream", "--bootstrap", "x", "--compare-noise-floor", "-0.1"],
        ["profiles", "get", "--bootstrap", "x", "--run-id", "r", "--out", "o", "--timeout", "-1"],
    ],
    ids=lambda a: " ".join(a[:3] if a[0] != "stream" else a[3:]),
)
def test_bad_folders_and_numbers_are_one_line(tmp_path: Path, argv: list[str]) -> None:
    inputs, rollouts = _pair(tmp_path / "a")
    file = tmp_path / "a-file"
    file.write_text("x")
    values = {"{i}": str(inputs), "{r}": str(rollouts), "{file}": str(file)}
    proc = run([*CLI, *(values.get(a, a) for a in argv)], timeout=60)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr)  # kafka commands: 1
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and "error: " in lines[0], proc.stderr  # argparse: usage, then it
    assert file.read_text() == "x"


def test_a_broker_record_that_cannot_be_read_is_kept(tmp_path: Path) -> None:
    """``kafka stop`` used to say "not running", exit 0 and delete a record it could not read,
    orphaning the broker it named."""
    for content in ("", "not json", "[]", '{"pid": "x"}'):
        (tmp_path / "broker.json").write_text(content)
        for command in ("status", "stop"):
            proc = run([*CLI, "kafka", command, "--state-dir", str(tmp_path)], timeout=30)
            assert proc.returncode == 1, proc.stdout
            assert proc.stderr.startswith("error: ") and "is not a broker record" in proc.stderr
            assert (tmp_path / "broker.json").read_text() == content


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+kafka_topic_prefix=a b", "invalid topic prefix 'a b'"),  # a name Kafka cannot take
        ("+limit=-1", "'limit'"),
    ],
)
def test_the_collector_refuses_a_bad_value_before_any_output(
    tmp_path: Path, override: str, message: str
) -> None:
    inputs, _ = _pair(tmp_path / "a")
    out = tmp_path / "o" / "r.jsonl"
    command = [script("ng_collect_rollouts"), f"+input_jsonl_fpath={inputs}"]
    proc = run([*command, f"+output_jsonl_fpath={out}", override])
    assert message in assert_one_line_error(proc)
    assert not out.parent.exists()


def test_sigterm_unwinds_like_ctrl_c(tmp_path: Path) -> None:
    """143 after the command's own cleanup (a ``finally``, a temporary file removed), where
    the default action killed it where it stood."""
    marker = tmp_path / "cleaned"
    code = (
        "import os, signal, sys\n"
        "from rewardstream.infra.command import run_guarded\n"
        "def work():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        signal.pause()\n"
        "    finally:\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "    return 0\n"
        "sys.exit(run_guarded('x', work))\n"
    )
    proc = run([sys.executable, "-c", code], timeout=30)
    assert (proc.returncode, proc.stderr) == (143, "")
    assert marker.exists()


def test_ng_run_refuses_a_port_another_server_answers_on(tmp_path: Path) -> None:
    """Another HTTP server on a server's port answered its health check: ng_run said "All 3
    servers ready!" with that server dead."""
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        override = f"+policy_model.responses_api_models.simulated_model.port={port}"
        proc = run([script("ng_run"), f"+config_paths=[{BUNDLED_CONFIG}]", override], timeout=90)
        line = assert_one_line_error(proc)
        assert line == (
            f"ng_run: error: server 'policy_model' cannot listen on 127.0.0.1:{port}: "
            "Address already in use"
        )
    finally:
        other.terminate()
        other.wait()


def test_replay_leaves_no_spill_files(tmp_path: Path) -> None:
    """Its spill folder (``OUT/<run>/.state``) used to stay behind, empty or not."""
    inputs, rollouts = _pair(tmp_path / "a")
    out = tmp_path / "out"
    argv = [*CLI, "replay", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    assert run([*argv, "--output-dir", str(out)]).returncode == 0
    assert sorted(p.name for p in (out / "r").iterdir()) == [
        "r_agent_metrics.json",
        "r_repeat_level_metrics.json",
        "r_reward_profiling.jsonl",
    ]
