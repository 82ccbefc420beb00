"""Ctrl-C and SIGTERM on each long-running command while it is busy, for real: the exit code
(130 and 143, or 0 where a signal is the command's documented normal end), no half-written
output, no child process left behind, and the line that says how to go on. Each command is
started as the user starts it, and signalled once it shows it is working (a line it printed,
a file it is writing), never after a pause. (``ng_collect_rollouts`` has its own test, with its
resume: ``tests/test_collect_hardening.py``; ``stream`` on SIGTERM: ``test_stream_hardening``.)
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.kafka.local import free_port
from tests.gym import POLICY, fast

BIN = Path(sys.executable).parent
SLOW = f"{POLICY}.latency_s=0.05"  # a rollout takes a while: the command is busy when signalled


@dataclass(frozen=True)
class Case:
    """``argv(tmp)``: the command line; ``busy(tmp, output)``: whether it shows it is at work;
    ``codes``: its exit code on SIGINT and on SIGTERM; ``absent(tmp, output)``: what must not be
    there once it ended (outputs a finished run writes, temporary files); ``says``: a line its
    stderr holds after the signal."""

    argv: Callable[[Path], list[str]]
    busy: Callable[[Path, str], bool]
    codes: tuple[int, int]
    absent: Callable[[Path, str], list[Path]]
    says: str = ""


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _demo_absent(tmp: Path, output: str) -> list[Path]:
    folder = tmp / "demo"
    profiles = [folder / f"rollouts{s}" for s in ("_reward_profiling.jsonl", "_agent_metrics.json")]
    return [*profiles, *folder.glob(".stream-*")]


def _kafka_absent(tmp: Path, output: str) -> list[Path]:
    (workdir,) = re.findall(r"\(workdir (\S+)\)", output)
    return [Path(workdir), tmp / "state" / "broker.json"]


def _e2e_absent(tmp: Path, output: str) -> list[Path]:
    return [tmp / "out" / "r_aggregate_metrics.json", tmp / "out" / "r_reward_profiling.jsonl"]


RS, GYM, NG_RUN = (str(BIN / name) for name in ("rewardstream", "gym", "ng_run"))
DEMO = ["demo", "--parallel", "1", "--limit", "100"]
E2E = ["eval", "run", "--config", str(BUNDLED_CONFIG), "--split", "train", "-o", "out/r.jsonl"]
E2E += ["--concurrency", "1", *fast(SLOW)]
CASES = {
    "demo": Case(
        lambda tmp: [RS, *DEMO, "--output-dir", str(tmp / "demo")],
        lambda tmp, _: _lines(tmp / "demo" / "rollouts.jsonl") >= 4,
        (130, 143),
        _demo_absent,
        "Interrupted: ",
    ),
    "gym-eval-run": Case(  # ng_e2e_collect_rollouts under NeMo Gym's name: servers, collection
        lambda tmp: [GYM, *E2E, f"+head_server.port={free_port()}"],
        lambda tmp, _: _lines(tmp / "out" / "r.jsonl") >= 4,
        (130, 143),
        _e2e_absent,
        "Interrupted: ",
    ),
    "ng_run": Case(  # a server group: a signal is how it ends
        lambda tmp: [
            NG_RUN,
            f"+config_paths=[{BUNDLED_CONFIG}]",
            f"+head_server.port={free_port()}",
        ],
        lambda tmp, output: "servers ready! Head server:" in output,
        (0, 0),
        lambda tmp, output: [],
    ),
    "kafka-start": Case(  # interrupted while its broker starts: no broker left, nothing recorded
        lambda tmp: [RS, "kafka", "start", "--state-dir", str(tmp / "state")],
        lambda tmp, output: "(workdir " in output,
        (130, 143),
        _kafka_absent,
    ),
}


def _descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (children of children too)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except (FileNotFoundError, ProcessLookupError):
                continue
            todo += children - found
            found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_signal_while_busy_ends_the_command_cleanly(
    tmp_path: Path, name: str, sig: signal.Signals
) -> None:
    case = CASES[name]
    log = tmp_path / "output.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            case.argv(tmp_path), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
        )
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not case.busy(tmp_path, log.read_text(errors="replace")):
            assert child.poll() is None, f"it ended before it was busy: {log.read_text()}"
            assert time.monotonic() < deadline, f"never busy: {log.read_text()[-2000:]}"
            children |= _descendants(child.pid)
            time.sleep(0.02)
        children |= _descendants(child.pid)
        child.send_signal(sig)
        code = child.wait(120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    output = log.read_text(errors="replace")
    assert code == case.codes[sig == signal.SIGTERM], output[-3000:]
    assert "Traceback" not in output and "Exception in callback" not in output, output[-3000:]
    assert [p for p in children if _alive(p)] == []
    assert [p for p in case.absent(tmp_path, output) if p.exists()] == []
    assert case.says in output
