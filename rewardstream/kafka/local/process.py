"""The life of a broker's JVM as an operating-system process: free loopback ports, one retry
when another process takes a port first, stopping a process group without harming any other,
and removing only the workdirs this package made (docs/kafka-local.md §Start and stop)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Collection
from pathlib import Path

from rewardstream.kafka.local.errors import EarlyExit

__all__ = [
    "CLUSTER_STOP_TIMEOUT_S",
    "HOST",
    "STOP_TIMEOUT_S",
    "WORKDIR_PREFIX",
    "free_port",
    "launch_retrying",
    "remove_workdir",
    "terminate",
]

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 30.0
WORKDIR_PREFIX = "rewardstream-kafka-"
# A cluster's workdirs are deleted on stop, so a graceful shutdown buys nothing: the last Raft
# leader waits 5 s for peers that are already gone, so SIGKILL stragglers after 2 s.
CLUSTER_STOP_TIMEOUT_S = 2.0

log = logging.getLogger(__name__)


def launch_retrying(launch: Callable[[], None], stop: Callable[[], None], retry: bool) -> None:
    """Launch (``launch`` picks its ports), once more with new ports when a JVM lost a port
    race (another process bound a free port between our pick and its bind); stop whatever
    was started on any failure."""
    for attempt in (1, 2):
        try:
            launch()
            return
        except EarlyExit as exc:
            stop()
            if attempt == 2 or not retry or "Address already in use" not in str(exc):
                raise
            log.warning("port race (%s); retrying once with new ports", exc)
        except BaseException:
            stop()
            raise


def free_port(exclude: Collection[int] = ()) -> int:
    """A currently free loopback port; never 0, because port 0 opens the socket before ready."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port


def terminate(
    pid: int, pgid: int, alive: Callable[[], bool], timeout: float, *, warn: bool = True
) -> None:
    """SIGTERM (controlled shutdown), then SIGKILL of the broker's own process group.

    The group is only signalled while its leader is unreaped, so its id cannot have been reused.
    """
    if not alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive():
        if warn:
            log.warning("broker pid %d ignored SIGTERM for %.0fs; sending SIGKILL", pid, timeout)
        else:
            log.info("broker pid %d still up %.0fs after SIGTERM; sending SIGKILL", pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)


def remove_workdir(workdir: str | Path | None) -> None:
    """Delete a broker workdir, but only one this package created (name prefix check)."""
    if workdir and Path(workdir).name.startswith(WORKDIR_PREFIX):
        shutil.rmtree(workdir, ignore_errors=True)
