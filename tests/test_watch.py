"""``rewardstream watch`` against a real processor fed through a real broker: once, and live
under tmux (send-keys is not needed: the table redraws itself), showing what ``/runs/<id>``
says and updating as rollouts arrive."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardstream.contract.events import Topics
from rewardstream.processors.core.confseq import Tally
from tests.golden import file_events, generated_collection
from tests.processes import Processor, make_topics, run_detail, send_events, trickle

pytestmark = pytest.mark.kafka
CLI = [sys.executable, "-m", "rewardstream.commands.cli"]


def _shows(text: str, detail: dict[str, Any]) -> bool:
    """The table holds the run's rollouts and each agent's rollouts and mean reward."""
    if f" {detail['rollouts']} " not in text:
        return False
    for name, agent in detail["agents"].items():
        mean = f"{agent['reward']['mean']:.4f}"
        if not any(name in line and mean in line for line in text.splitlines()):
            return False
    return True


def _processor(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    extra: tuple[str, ...] = (),
) -> tuple[Processor, Topics]:
    """A processor of its own topic prefix (two partitions), and the topics."""
    prefix = unique_name("watch")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    log = tmp_path / "processor.log"
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", log, extra=list(extra))
    processors.append(p)
    return p, topics


def test_watch_shows_the_run_and_follows_it(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=100, repeats=4, seed=9)
    p, topics = _processor(kafka_bootstrap, unique_name, tmp_path, processors)
    events = file_events(inputs, rollouts, "w", "r", False)
    first = [e for e in events if e[0] != "rollout"] + [e for e in events if e[0] == "rollout"][
        :150
    ]
    later = [e for e in events if e[0] == "rollout"][150:]
    send_events(kafka_bootstrap, topics, first, "w")
    p.wait(lambda runs: runs.get("w", {}).get("rollouts") == 150)

    once = subprocess.run(
        [*CLI, "watch", "--url", p.url, "--once"], capture_output=True, text=True, timeout=60
    )
    assert once.returncode == 0, once.stderr
    assert _shows(once.stdout, run_detail(p.url, "w")), once.stdout

    with _watching(p.url, "w", unique_name("rs")) as screen:

        def until(detail: dict[str, Any]) -> None:
            deadline = time.monotonic() + 30
            while not _shows(screen(), detail):
                assert time.monotonic() < deadline, screen()
                time.sleep(0.3)

        until(run_detail(p.url, "w"))
        send_events(kafka_bootstrap, topics, later, "w")
        p.wait(lambda runs: runs.get("w", {}).get("rollouts") == 400)
        until(run_detail(p.url, "w"))  # redrawn with the new counts and means, no key pressed


@contextlib.contextmanager
def _watching(
    url: str, run_id: str, socket: str, size: tuple[int, int] = (200, 60)
) -> Iterator[Callable[[], str]]:
    """``rewardstream watch`` of one run live in a detached tmux session of ``size`` (columns,
    lines); yields what its screen shows now."""
    tmux = shutil.which("tmux")
    assert tmux is not None, "tmux is needed (.ci/system-deps)"
    server = [tmux, "-L", socket]
    watch = [*CLI, "watch", "--url", url, "--run-id", run_id, "--interval", "0.5"]
    command = " ".join(["env", f"COLUMNS={size[0]}", f"LINES={size[1]}", *watch])
    x, y = str(size[0]), str(size[1])
    subprocess.run([*server, "new-session", "-d", "-s", "w", "-x", x, "-y", y, command], check=True)

    def screen() -> str:
        return subprocess.run(
            [*server, "capture-pane", "-p", "-t", "w"], capture_output=True, text=True, check=True
        ).stdout

    try:
        yield screen
    finally:
        subprocess.run([*server, "kill-server"], check=False)


def test_watch_in_an_80x24_terminal_shows_every_needed_figure_whole(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """An SSH terminal's size: the run's state and rollouts, each agent's rollouts, mean, std
    and pass@1 are on the screen, none cut to an ellipsis."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=100, repeats=4, seed=12)
    p, topics = _processor(kafka_bootstrap, unique_name, tmp_path, processors)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "n", "r", False), "n")
    p.wait(lambda runs: runs.get("n", {}).get("rollouts") == 400)
    detail = run_detail(p.url, "n")
    with _watching(p.url, "n", unique_name("rs"), size=(80, 24)) as screen:
        deadline = time.monotonic() + 30
        while not _shows(text := screen(), detail):
            assert time.monotonic() < deadline, text
            time.sleep(0.3)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    assert _row(text, "n")[1] in ("open", "finished", "final"), text
    for name, agent in detail["agents"].items():
        row = next(line for line in lines if line.strip("│ ").startswith(name))
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        reward = agent["reward"]
        assert cells[1:4] == [
            str(agent["rollouts"]),
            f"{reward['mean']:.4f}",
            f"{reward['std']:.4f}",
        ]
        assert not any("…" in cell for cell in cells[1:]), row


def _row(screen: str, run_id: str) -> list[str]:
    """The cells of the run's row in the runs table."""
    line = next(line for line in screen.splitlines() if line.strip("│ ").startswith(run_id))
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_watch_shows_a_stalled_run_and_its_return(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A run whose events stop is shown stalled (since when, rate 0, no ETA) within
    ``--stall-after``, and open again once they resume."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=100, repeats=2, seed=10)
    stall = ("--stall-after", "3")
    p, topics = _processor(kafka_bootstrap, unique_name, tmp_path, processors, stall)
    events = file_events(inputs, rollouts, "s", "r", False)
    data = [e for e in events if e[0] == "rollout"]
    send_events(kafka_bootstrap, topics, [e for e in events if e[0] != "rollout"], "s")
    send_events(kafka_bootstrap, topics, data[:50], "s")
    p.wait(lambda runs: runs.get("s", {}).get("rollouts") == 50)
    stopped = time.monotonic()

    def until(state: str, deadline: float) -> list[str]:
        while True:
            text = screen()
            if any(line.strip("│ ").startswith("s ") for line in text.splitlines()):
                row = _row(text, "s")
                if row[1].startswith(state):
                    return row
            assert time.monotonic() < deadline, text
            time.sleep(0.2)

    with _watching(p.url, "s", unique_name("rs")) as screen:
        row = until("stalled, last event ", stopped + 3 + 10)
        assert (row[4], row[5]) == ("0", "-"), row  # rate 0, no ETA
        with trickle(kafka_bootstrap, topics, data[50:], "s"):  # events resume
            until("open", time.monotonic() + 30)


def test_watch_shows_the_interval_at_its_own_level(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """``watch --level`` rebuilds each agent's interval from the sums ``/runs/<id>`` shows, at
    its own level whatever the processor's (``--level 0.9`` here), and its header says which;
    a level outside (0, 1) is refused, exit 2."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=50, repeats=4, seed=13)
    p, topics = _processor(kafka_bootstrap, unique_name, tmp_path, processors, ("--level", "0.9"))
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "l", "r", True), "l")
    p.wait(lambda runs: runs.get("l", {}).get("state") == "final")  # its figures hold still
    agents = run_detail(p.url, "l")["agents"]
    for level, given in ((0.99, ["--level", "0.99"]), (0.95, [])):
        once = subprocess.run(
            [*CLI, "watch", "--url", p.url, "--run-id", "l", "--once", *given],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert once.returncode == 0, once.stderr
        assert f"{100 * level:g}% interval" in once.stdout, once.stdout
        for name, agent in agents.items():
            interval = agent["reward"]["interval"]
            assert interval["level"] == 0.9
            (lo, hi), (n, total, spread) = interval["range"], interval["sums"]
            now = Tally(lo, hi, n, total, spread, interval["outside"]).interval(level)
            assert now is not None
            row = next(line for line in once.stdout.splitlines() if name in line)
            assert f"{now.lower:.4f}-{now.upper:.4f}" in row, once.stdout
    bad = subprocess.run(
        [*CLI, "watch", "--url", p.url, "--once", "--level", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1] == (
        "rewardstream watch: error: argument --level: expected a level in (0, 1), e.g. 0.95, "
        "got '1'"
    ), bad.stderr


def test_watch_names_what_it_cannot_reach() -> None:
    proc = subprocess.run(
        [*CLI, "watch", "--url", "127.0.0.1:1", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("rewardstream: error: cannot reach http://127.0.0.1:1")
    assert proc.stderr.count("\n") == 1
