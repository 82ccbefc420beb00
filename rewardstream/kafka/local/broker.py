"""One single-node KRaft broker (:class:`LocalBroker`): a plain ``java`` process in its own
process group and fresh temporary directory, formatted, started, and waited for until a client
gets an answer; restarted or killed and resumed on the same data for fault tests."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

from rewardstream.kafka.local.errors import EarlyExit, KafkaLocalError, tail
from rewardstream.kafka.local.jars import KAFKA_VERSION, fetch_jars, require_java
from rewardstream.kafka.local.process import (
    HOST,
    STOP_TIMEOUT_S,
    WORKDIR_PREFIX,
    free_port,
    launch_retrying,
    remove_workdir,
    terminate,
)
from rewardstream.kafka.local.properties import (
    LOG4J2_PROPERTIES,
    new_cluster_id,
    server_properties,
)
from rewardstream.kafka.local.ready import READY_TIMEOUT_S, run_sync, wait_ready
from rewardstream.kafka.local.state import BrokerState

__all__ = ["BROKER_JVM_ARGS", "LocalBroker"]

# docs/kafka-local.md §JVM flags: upstream G1 flags with a smaller heap; StorageTool gets the
# tool default.
BROKER_JVM_ARGS = (
    "-Xms512m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
TOOL_JVM_ARGS = ("-Xmx256m",)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LocalBroker:
    """One single-node KRaft broker in its own process group and fresh temporary directory.

    ``port``/``controller_port`` default to free ports (re-picked once if the bind races).
    ``startup_seconds`` is measured from :meth:`start` (incl. storage format) to readiness.
    ``extra_listeners`` (name -> security protocol, e.g. ``{"SASL": "SASL_PLAINTEXT"}``) each
    get a free loopback port (:meth:`address`); ``extra_properties`` are added to
    server.properties (e.g. ``listener.name.sasl.plain.sasl.jaas.config``). ``partitions`` is
    the broker's ``num.partitions`` for auto-created topics. :class:`LocalCluster` sets
    ``node_id``/``voters``/``replication`` to make it one node of a cluster.
    """

    port: int | None = None
    controller_port: int | None = None
    libs: Path | None = None
    ready_timeout: float = READY_TIMEOUT_S
    jvm_args: Sequence[str] = ()
    extra_listeners: Mapping[str, str] = field(default_factory=dict)
    extra_properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    partitions: int = 1
    node_id: int = field(default=1, init=False)
    voters: str | None = field(default=None, init=False)
    replication: int = field(default=1, init=False)
    listener_ports: dict[str, int] = field(default_factory=dict, init=False)
    workdir: Path | None = field(default=None, init=False)
    cluster_id: str | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)
    startup_seconds: float | None = field(default=None, init=False)
    started_at: datetime | None = field(default=None, init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` for clients."""
        if self.port is None:
            raise KafkaLocalError("broker not started")
        return f"{HOST}:{self.port}"

    def address(self, listener: str) -> str:
        """``127.0.0.1:<port>`` of one of the ``extra_listeners``."""
        if listener not in self.listener_ports:
            raise KafkaLocalError(f"no started listener {listener!r}")
        return f"{HOST}:{self.listener_ports[listener]}"

    @property
    def running(self) -> bool:
        """True while the JVM this object started has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Format storage, launch the JVM and block until a Metadata round trip succeeds."""
        if self._proc is not None:
            raise KafkaLocalError("broker already started")
        if 0 in (self.port, self.controller_port):
            raise ValueError("port 0 is not allowed: the broker would look ready too early")
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, not {self.partitions}")
        java = require_java()
        libs = self.libs or fetch_jars()
        fixed = (self.port, self.controller_port)
        self.started_at = datetime.now(UTC)
        began = time.monotonic()

        def launch() -> None:
            self.port = fixed[0] or free_port()
            self.controller_port = fixed[1] or free_port({self.port})
            taken = {self.port, self.controller_port}
            for name in self.extra_listeners:
                taken.add(port := free_port(taken))
                self.listener_ports[name] = port
            self._launch(java, libs)

        launch_retrying(launch, self.stop, retry=None in fixed)
        self.startup_seconds = time.monotonic() - began
        atexit.register(self.stop)  # last resort if the owner forgets to stop us
        log.info("broker ready at %s in %.1fs", self.bootstrap, self.startup_seconds)
        return self

    def _launch(self, java: str, libs: Path) -> None:
        self._prepare(java, libs, new_cluster_id())
        log.info(
            "starting Kafka %s on %s (workdir %s)", KAFKA_VERSION, self.bootstrap, self.workdir
        )
        self._spawn(java, libs)

    def _prepare(self, java: str, libs: Path, cluster_id: str) -> None:
        """Fresh workdir, property files and storage format (a cluster formats in parallel)."""
        assert self.port is not None and self.controller_port is not None
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (workdir / "data").mkdir()
        props = workdir / "server.properties"
        extra = {n: (p, self.listener_ports[n]) for n, p in self.extra_listeners.items()}
        props.write_text(
            server_properties(
                workdir,
                self.port,
                self.controller_port,
                extra,
                self.extra_properties,
                node_id=self.node_id,
                voters=self.voters,
                partitions=self.partitions,
                replication=self.replication,
            )
        )
        log4j = workdir / "log4j2.properties"
        log4j.write_text(LOG4J2_PROPERTIES)
        classpath = f"{libs}/*"
        common = [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        self.cluster_id = cluster_id
        fmt_cmd = [java, *TOOL_JVM_ARGS, *common, "kafka.tools.StorageTool", "format"]
        fmt = subprocess.run(
            [*fmt_cmd, "-t", self.cluster_id, "-c", str(props)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if fmt.returncode != 0:
            out = fmt.stdout + fmt.stderr
            hint = ""
            if "ClassNotFoundException" in out or "Could not find or load main class" in out:
                hint = (
                    f"\nthe Kafka jars are missing from {libs}; run 'rewardstream kafka fetch' "
                    "or point KAFKA_LIBS_DIR at a directory with the Kafka jars"
                )
            raise KafkaLocalError(f"StorageTool format failed:\n{tail(out)}{hint}")

    def _spawn(self, java: str, libs: Path, append: bool = False) -> None:
        """Launch the JVM on the formatted workdir and block until it answers."""
        self._popen(java, libs, append)
        run_sync(
            wait_ready(
                self.bootstrap,
                self.ready_timeout,
                check=self._check_alive,
                cluster_id=self.cluster_id,
            )
        )

    def _popen(self, java: str, libs: Path, append: bool = False) -> None:
        """Launch the JVM on the formatted workdir without waiting (a cluster's nodes need each
        other's votes before any of them is ready)."""
        assert self.workdir is not None
        workdir, props = self.workdir, self.workdir / "server.properties"
        common = [f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}", "-cp", f"{libs}/*"]
        with open(workdir / "kafka.out", "ab" if append else "wb") as out_file:
            jvm = [java, *BROKER_JVM_ARGS, *self.jvm_args, *common, f"-Dkafka.logs.dir={workdir}"]
            self._proc = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(props)],
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                process_group=0,  # own group: stop() can kill exactly this tree, nothing else
            )
        self.pid = self._proc.pid

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise EarlyExit(
                f"Kafka broker exited with code {self._proc.returncode} before it was ready; "
                f"tail of kafka.out:\n{self.output_tail()}"
            )

    def output_tail(self, lines: int = 40) -> str:
        """Last lines of the broker's combined stdout/stderr, for error messages."""
        if self.workdir is None:
            return ""
        try:
            return tail((self.workdir / "kafka.out").read_text(errors="replace"), lines)
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, warn: bool = True) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL of its group) and delete the workdir. Idempotent.

        ``warn=False`` logs a needed SIGKILL at INFO only (a cluster expects one).
        """
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc.pid, proc.pid, lambda: proc.poll() is None, timeout, warn=warn)
            if proc.poll() is None:
                proc.wait()
        remove_workdir(self.workdir)

    def restart(self, *, kill: bool = False, pause: float = 0.0) -> None:
        """Stop the JVM (SIGTERM, or SIGKILL of its group with ``kill``), wait ``pause`` seconds,
        and start it again on the same data dir, ports and cluster id, until ready.

        Why: fault trials (``bench/chaos.py``) check that producers and processors ride through
        a broker restart, which needs the same address and the logs kept.
        """
        proc = self._proc
        if proc is None or self.workdir is None:
            raise KafkaLocalError("broker not started")
        if kill:
            self.kill()
        else:
            terminate(proc.pid, proc.pid, lambda: proc.poll() is None, STOP_TIMEOUT_S)
            proc.wait()
        time.sleep(pause)
        self.resume()

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the broker's process group, wait for the JVM to exit; return its pid.

        The workdir stays, so :meth:`resume` brings the same broker back (fault tests).
        """
        proc = self._proc
        if proc is None:
            raise KafkaLocalError("broker not started")
        if proc.poll() is None:  # unreaped leader: the group id is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        proc.wait()
        return proc.pid

    def resume(self) -> None:
        """Start the exited JVM again on the same data dir, ports and cluster id, until ready."""
        if self._proc is None or self.workdir is None or not self.workdir.is_dir():
            raise KafkaLocalError("broker not started")
        if self.running:
            raise KafkaLocalError(f"broker pid {self.pid} is still running")
        java = require_java()
        self._spawn(java, self.libs or fetch_jars(), append=True)

    def state(self) -> BrokerState:
        """Snapshot for the state file of a detached broker."""
        if self.pid is None or self.workdir is None or self.started_at is None:
            raise KafkaLocalError("broker not started")
        return BrokerState(
            pid=self.pid,
            pgid=os.getpgid(self.pid),
            bootstrap=self.bootstrap,
            workdir=str(self.workdir),
            started_at=self.started_at.isoformat(timespec="seconds"),
        )

    def detach(self) -> BrokerState:
        """Forget the process so it outlives this Python process (CLI ``start``)."""
        state = self.state()
        atexit.unregister(self.stop)
        self._proc = None
        return state

    def __enter__(self) -> Self:
        return self if self._proc is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
