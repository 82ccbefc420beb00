"""The record of a detached broker or cluster (``<state dir>/broker.json``) and its lock: what
``kafka start`` writes and ``status`` and ``stop`` read, so each sees and stops only the
broker(s) of its own state folder, never a process that merely reuses a pid.

Environment: ``REWARDSTREAM_KAFKA_STATE_DIR`` sets the state folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rewardstream.kafka.local.errors import KafkaLocalError
from rewardstream.kafka.local.process import (
    CLUSTER_STOP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    WORKDIR_PREFIX,
    remove_workdir,
    terminate,
)

__all__ = [
    "BrokerState",
    "ClusterState",
    "Elsewhere",
    "brokers_elsewhere",
    "is_our_broker",
    "read_state",
    "running_state",
    "state_dir",
    "state_lock",
    "state_path",
    "stop_detached",
    "write_state",
]


def state_dir() -> Path:
    """Where ``kafka start`` records its broker(s) unless told (``--state-dir``):
    ``REWARDSTREAM_KAFKA_STATE_DIR``, else ``.rewardstream/kafka`` in the current folder (the
    project's). Never the per-user cache: two projects, or two people sharing a home, each
    see and stop only the broker they started."""
    env = os.environ.get("REWARDSTREAM_KAFKA_STATE_DIR")
    return Path(env).expanduser() if env else Path.cwd() / ".rewardstream" / "kafka"


# In a detached broker's workdir: the state folder that records it, so a ``status`` or ``stop``
# run with another folder can say where to look.
OWNER_FILE = "state-dir"


def state_path(folder: Path) -> Path:
    """Where the detached CLI broker of ``folder`` is recorded, for ``status``/``stop``."""
    return folder / "broker.json"


@dataclass(frozen=True)
class BrokerState:
    """What ``<state dir>/broker.json`` records about a detached broker."""

    pid: int
    pgid: int
    bootstrap: str
    workdir: str
    started_at: str


@dataclass(frozen=True)
class ClusterState:
    """What ``<state dir>/broker.json`` records about a detached broker or cluster (every
    broker)."""

    bootstrap: str
    started_at: str
    brokers: tuple[BrokerState, ...]

    @property
    def pids(self) -> list[int]:
        """Each broker's pid, in node order."""
        return [b.pid for b in self.brokers]

    def to_json(self) -> dict[str, Any]:
        """The first broker's fields at top level (the single-broker file as before), plus all."""
        first = asdict(self.brokers[0])
        return {**first, "bootstrap": self.bootstrap, "brokers": [asdict(b) for b in self.brokers]}


def is_our_broker(state: BrokerState, *, exiting: bool = False) -> bool:
    """True if ``state.pid`` is a live (non-zombie) JVM running *this* broker's config.

    Checking the command line guards against pid reuse after the broker died. With
    ``exiting=True`` an empty command line also counts: a JVM that is tearing down its heap after
    SIGTERM has already lost it (seen here for ~0.5 s) but is not gone yet.
    """
    try:
        if Path("/proc/self").exists():
            proc = Path(f"/proc/{state.pid}")
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        else:  # no procfs (macOS): ask ps
            out = subprocess.run(
                ["ps", "-o", "stat=,command=", "-p", str(state.pid)],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if not out or out.startswith("Z"):
                return False
            cmdline = out.split(None, 1)[1] if " " in out else ""
    except (OSError, IndexError):
        return False
    if exiting and not cmdline:
        return True
    return "kafka.Kafka" in cmdline and state.workdir in cmdline


def read_state(folder: Path) -> ClusterState | None:
    """The recorded detached broker(s), alive or not; None if there is no state file.

    A file without ``brokers`` (written before clusters existed) is one broker. A file that is
    there but is no such record raises :class:`KafkaLocalError` and is left as it is: the
    broker it named may still run, and removing the record would orphan it.
    """
    path = state_path(folder)
    try:
        data = json.loads(path.read_text())
        items = data.get("brokers", [data])
        keys = BrokerState.__dataclass_fields__
        brokers = tuple(BrokerState(**{k: item[k] for k in keys}) for item in items)
        if not brokers:
            raise ValueError("no brokers")
        return ClusterState(str(data["bootstrap"]), str(data["started_at"]), brokers)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KafkaLocalError(
            f"{path} is not a broker record ({type(exc).__name__}: {exc}); it is left as it "
            "is: stop the broker it named by hand (ps -ef | grep kafka.Kafka), then remove it"
        ) from None


def write_state(state: ClusterState, folder: Path) -> None:
    """Record ``state`` for ``folder`` whole or not at all (a rename), for a concurrent reader."""
    path = state_path(folder)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(path)
    for broker in state.brokers:
        (Path(broker.workdir) / OWNER_FILE).write_text(f"{folder.resolve()}\n")


@dataclass(frozen=True)
class Elsewhere:
    """Local brokers of this package running on this machine that a state folder does not
    record: those of one other state folder (``folder``), or those no ``kafka start`` recorded
    (``folder`` None: a test's, or a program's ``LocalBroker``)."""

    folder: Path | None
    pids: tuple[int, ...]


def brokers_elsewhere(folder: Path) -> list[Elsewhere]:
    """The JVMs running ``kafka.Kafka`` on a workdir of this package (``WORKDIR_PREFIX``) that
    ``folder`` does not record, by the state folder recorded in their workdir (procfs only:
    elsewhere, nothing is found)."""
    mine = folder.resolve()
    by_owner: dict[Path | None, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            at = args.index(b"kafka.Kafka")
            workdir = Path(os.fsdecode(args[at + 1])).parent
            if not workdir.name.startswith(WORKDIR_PREFIX):
                continue
        except (OSError, ValueError, IndexError):  # gone, not a broker, or no properties
            continue
        try:
            owner: Path | None = Path((workdir / OWNER_FILE).read_text().strip())
        except OSError:
            owner = None
        if owner != mine:
            by_owner.setdefault(owner, []).append(int(proc.name))
    return [Elsewhere(owner, tuple(sorted(pids))) for owner, pids in by_owner.items()]


def running_state(folder: Path) -> ClusterState | None:
    """The detached broker(s) of ``folder`` if any is alive; else clean up a stale state file
    and workdirs."""
    state = read_state(folder)
    if state is not None and any(is_our_broker(b) for b in state.brokers):
        return state
    for broker in state.brokers if state is not None else ():
        remove_workdir(broker.workdir)
    state_path(folder).unlink(missing_ok=True)
    return None


def stop_detached(folder: Path, timeout: float = STOP_TIMEOUT_S) -> ClusterState | None:
    """Stop every broker ``folder`` records that is still ours, all at once; return the state,
    or None if none was running. Only the recorded pids' own process groups are signalled."""
    state = running_state(folder)
    if state is None:
        return None
    live = [b for b in state.brokers if is_our_broker(b)]
    single = len(state.brokers) == 1
    if not single:
        timeout = min(timeout, CLUSTER_STOP_TIMEOUT_S)  # the data is deleted anyway

    def stop_one(b: BrokerState) -> None:
        terminate(b.pid, b.pgid, lambda: is_our_broker(b, exiting=True), timeout, warn=single)

    with ThreadPoolExecutor(max(1, len(live))) as pool:
        list(pool.map(stop_one, live))
    alive = [b.pid for b in live if is_our_broker(b, exiting=True)]
    if alive:
        raise KafkaLocalError(f"broker pid(s) {alive} still alive after SIGKILL")
    for broker in state.brokers:
        remove_workdir(broker.workdir)
    state_path(folder).unlink(missing_ok=True)
    return state


@contextlib.contextmanager
def state_lock(folder: Path) -> Iterator[None]:
    """Serialise start/stop/status so two concurrent starts cannot both launch a broker."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / "broker.lock", "w")  # noqa: SIM115 - held for the block
    except OSError as exc:
        raise KafkaLocalError(f"state folder {folder}: {exc.strerror or exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
