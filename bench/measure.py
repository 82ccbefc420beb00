"""Run a command under GNU time and report wall, CPU and peak memory, process tree included.

GNU time's maximum RSS is that of the largest single process; the profiler forks a worker per
core, so the summed RSS of the whole process tree is sampled from /proc as well (every 50 ms).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, NamedTuple

from rewardstream.kafka_local import LocalBroker

__all__ = ["Measured", "kafka_workspace", "measure", "tree_rss_kb"]


class Measured(NamedTuple):
    """One run: wall and CPU seconds, GNU time's max RSS, process-tree peak RSS, exit, stderr."""

    wall_s: float
    cpu_s: float
    max_rss_mb: float
    tree_peak_mb: float
    returncode: int
    stderr: str


def tree_rss_kb(root: int) -> int:
    """Summed RSS of ``root`` and all its descendants, read from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        m = re.search(r"VmRSS:\s+(\d+)", status)
        rss[int(entry)] = int(m.group(1)) if m else 0
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(cmd: list[str], cwd: Path | None = None, stdout: IO[bytes] | None = None) -> Measured:
    """Run ``cmd`` under ``/usr/bin/time -v`` (stdout discarded unless given)."""
    peak = 0
    done = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["/usr/bin/time", "-v", *cmd],
        cwd=cwd,
        stdout=stdout or subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_kb(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, raw = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    err = raw.decode(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    cpu = sum(
        float(c.group(1)) for c in re.finditer(r"(?:User|System) time \(seconds\): ([\d.]+)", err)
    )
    return Measured(
        wall, cpu, int(rss.group(1)) / 1024 if rss else 0.0, peak / 1024, proc.returncode, err
    )


@contextlib.contextmanager
def kafka_workspace(bootstrap: str | None) -> Iterator[tuple[str, Path]]:
    """A broker address (``bootstrap``, or a fresh local broker from the Maven jars, stopped
    afterwards) and a temporary working folder, removed afterwards."""
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        yield bootstrap or stack.enter_context(LocalBroker()).bootstrap, work
