"""Run a real Apache Kafka 4.3.1 broker, or a 3-broker KRaft cluster, from Maven Central jars.

Why: the profiler's tests and local runs need a real broker, but there is no Docker engine here
and no Python package ships the broker. Maven resolves the broker classpath from
``deploy/kafka-local/pom.xml`` once; each broker then runs as a plain ``java`` process in its own
process group and fresh temporary directory (recipe: docs/kafka-local.md).

CLI (``rewardstream kafka ...``, wired in via :func:`add_parser`):

* ``start [--port N] [--partitions N] [--brokers 1|3] [--state-dir DIR]``: start a detached
  broker (or cluster), print ``bootstrap=127.0.0.1:<port>[,...]`` as the last stdout line and
  record every broker in ``DIR/broker.json`` (default DIR: :func:`state_dir`, the project's
  ``.rewardstream/kafka``; ``status`` and ``stop`` take the same option). If it is still
  alive, fail with exit code 1 and ``a broker is already running at 127.0.0.1:<port> (pid N);
  run 'rewardstream kafka stop' first``.
* ``status``: ``running bootstrap=127.0.0.1:<port> pid=N`` (exit 0; a cluster prints ``pids=``),
  ``degraded bootstrap=... pids=... down=...`` (exit 2: part of a cluster died) or ``not
  running`` (exit 1).
* ``stop``: SIGTERM, then after 30 s SIGKILL of each recorded broker's own process group; removes
  the workdirs and the state file. Prints ``not running`` (exit 0) when nothing runs.
* ``fetch``: only download the jars and print the libs directory.

Environment: ``REWARDSTREAM_CACHE_DIR`` (default ``~/.cache/rewardstream``) holds the jars;
``KAFKA_LIBS_DIR`` overrides the jar directory; ``REWARDSTREAM_KAFKA_STATE_DIR`` the state
folder.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = [
    "KAFKA_VERSION",
    "BrokerState",
    "BrokerUnavailable",
    "ClusterState",
    "KafkaLocalError",
    "LocalBroker",
    "LocalCluster",
    "add_parser",
    "cache_dir",
    "fetch_jars",
    "free_port",
    "libs_dir",
    "main",
    "new_cluster_id",
    "provide_broker",
    "read_state",
    "running_state",
    "state_dir",
    "state_path",
    "stop_detached",
    "wait_ready",
]

KAFKA_VERSION = "4.3.1"
HOST = "127.0.0.1"
POM = Path(__file__).parents[2] / "kafka-local" / "pom.xml"  # shipped as package data
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
WORKDIR_PREFIX = "rewardstream-kafka-"
ALREADY_RUNNING = (
    "a broker is already running at {bootstrap} (pid {pid}); run 'rewardstream kafka stop' first"
)
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
# Cluster nodes: three JVMs share 2 cores and the tests' memory, so each gets a smaller heap
# (placed after BROKER_JVM_ARGS: the JVM's last -Xms/-Xmx wins).
CLUSTER_NODE_JVM_ARGS = ("-Xms128m", "-Xmx384m")
# A cluster's workdirs are deleted on stop, so a graceful shutdown buys nothing: the last Raft
# leader waits 5 s for peers that are already gone, so SIGKILL stragglers after 2 s.
CLUSTER_STOP_TIMEOUT_S = 2.0
# `kafka start` default: a consumer group of up to 4 processors all get partitions (with 1, a
# second processor sits idle). LocalBroker keeps 1, which the test fixtures rely on.
CLI_PARTITIONS = 4
ALREADY_RUNNING_CLUSTER = (
    "a cluster is already running at {bootstrap} (pids {pids}); run 'rewardstream kafka stop' first"
)
LOG4J2_PROPERTIES = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaLocalError(RuntimeError):
    """A broker could not be fetched, started or stopped; the message says what to do."""


class BrokerUnavailable(KafkaLocalError):
    """No way to get a broker on this machine (no env broker, no java/jars, no Docker)."""


class _EarlyExit(KafkaLocalError):
    """The broker JVM exited before it was ready."""


# --------------------------------------------------------------------------- paths and jars


def cache_dir() -> Path:
    """Per-user cache, so the 44 MB of jars are downloaded once per machine, not per run."""
    env = os.environ.get("REWARDSTREAM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rewardstream"


def libs_dir() -> Path:
    """Directory holding the broker classpath; ``KAFKA_LIBS_DIR`` lets CI share one copy."""
    env = os.environ.get("KAFKA_LIBS_DIR")
    return Path(env).expanduser() if env else cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


def state_dir() -> Path:
    """Where ``kafka start`` records its broker(s) unless told (``--state-dir``):
    ``REWARDSTREAM_KAFKA_STATE_DIR``, else ``.rewardstream/kafka`` in the current folder (the
    project's). Never the per-user cache: two projects, or two people sharing a home, each
    see and stop only the broker they started."""
    env = os.environ.get("REWARDSTREAM_KAFKA_STATE_DIR")
    return Path(env).expanduser() if env else Path.cwd() / ".rewardstream" / "kafka"


def state_path(folder: Path) -> Path:
    """Where the detached CLI broker of ``folder`` is recorded, for ``status``/``stop``."""
    return folder / "broker.json"


def _has_jars(directory: Path) -> bool:
    return any(directory.glob("kafka_2.13-*.jar"))


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaLocalError(f"'{tool}' not found on PATH; {hint}")
    return path


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def fetch_jars() -> Path:
    """Return the libs dir, downloading the jars with Maven first if they are not there yet.

    Maven writes into a temporary sibling directory that is renamed into place only on success,
    so an interrupted download never leaves a half-filled cache behind.
    """
    target = libs_dir()
    if _has_jars(target):
        return target
    if not POM.is_file():
        raise KafkaLocalError(f"pom not found at {POM}; cannot resolve the Kafka jars")
    hint = "install Maven 3, or set KAFKA_LIBS_DIR to a directory with the Kafka jars"
    mvn = _require("mvn", hint)
    _require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}-partial-*"):  # left by a killed download
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-partial-", dir=target.parent))
    try:
        log.info("fetching Kafka %s jars with Maven into %s", KAFKA_VERSION, target)
        started = time.monotonic()
        cmd = [mvn, "-B", "-q", "-f", str(POM), "dependency:copy-dependencies"]
        cmd += ["-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or not _has_jars(tmp):
            raise KafkaLocalError(
                f"Maven could not fetch the Kafka jars (exit {proc.returncode}):\n"
                + _tail(proc.stdout + proc.stderr)
            )
        try:
            tmp.rename(target)
        except OSError:
            if not _has_jars(target):  # not a lost race with another fetch: a real error
                raise
        jars = list(target.glob("*.jar"))
        size_mb = sum(j.stat().st_size for j in jars) / 1e6
        log.info(
            "fetched %d jars (%.0f MB) in %.1fs", len(jars), size_mb, time.monotonic() - started
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- broker helpers


def _launch_retrying(launch: Callable[[], None], stop: Callable[[], None], retry: bool) -> None:
    """Launch (``launch`` picks its ports), once more with new ports when a JVM lost a port
    race (another process bound a free port between our pick and its bind); stop whatever
    was started on any failure."""
    for attempt in (1, 2):
        try:
            launch()
            return
        except _EarlyExit as exc:
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


def new_cluster_id() -> str:
    """A 22-char Kafka Uuid; a leading '-' would be parsed by StorageTool as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _server_properties(
    workdir: Path,
    port: int,
    controller_port: int,
    extra_listeners: Mapping[str, tuple[str, int]] | None = None,
    extra_properties: Mapping[str, str] | None = None,
    *,
    node_id: int = 1,
    voters: str | None = None,
    partitions: int = 1,
    replication: int = 1,
) -> str:
    """By default one static voter, and RF/min-ISR 1 so groups and transactions work
    (docs/kafka-local.md §Server properties).

    A cluster node passes its ``node_id``, all ``voters`` (``id@host:port,...``) and
    ``replication`` (> 1): new and internal topics then get that RF and min ISR ``RF - 1``, so
    acks=all and transactions survive one dead broker. ``partitions`` is ``num.partitions``.
    ``extra_listeners`` (name -> (security protocol, port)) are added next to PLAINTEXT, which
    stays the inter-broker listener; ``extra_properties`` are appended (e.g. a listener's JAAS
    config), so secured listeners can be tested against the same real broker.
    """
    extra_listeners = extra_listeners or {}
    listeners = f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}"
    listeners += "".join(f",{n}://{HOST}:{p}" for n, (_, p) in extra_listeners.items())
    protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    protocols += "".join(f",{n}:{proto}" for n, (proto, _) in extra_listeners.items())
    extra = ""
    for key, value in (extra_properties or {}).items():
        if "\n" in key + value or "\r" in key + value or "=" in key:
            raise ValueError(f"server property {key!r}: no line breaks, no '=' in the key")
        extra += f"{key}={value}\n"
    rf, isr = replication, max(1, replication - 1)
    if rf > 1:
        # Detect a killed broker in ~4 s (defaults 9 s/30 s), so failover tests stay short;
        # not lower, since three JVMs on 2 busy cores can stall for a second or two.
        extra = (
            "broker.session.timeout.ms=4000\nbroker.heartbeat.interval.ms=1000\n"
            "replica.lag.time.max.ms=10000\n" + extra
        )
    return f"""\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters or f"{node_id}@{HOST}:{controller_port}"}
controller.listener.names=CONTROLLER
listeners={listeners}
advertised.listeners={listeners}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map={protocols}
log.dirs={workdir / "data"}
num.partitions={partitions}
default.replication.factor={rf}
min.insync.replicas={isr}
auto.create.topics.enable=true
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=1
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=33554432
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
{extra}"""


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_ready(
    bootstrap: str,
    timeout: float = READY_TIMEOUT_S,
    *,
    check: Callable[[], None] | None = None,
    cluster_id: str | None = None,
    brokers: int = 1,
) -> dict[str, Any]:
    """Poll until a Metadata round trip lists ``brokers`` brokers; return the describe_cluster dict.

    ``check`` runs every 0.2 s *alongside* the poll and may raise to abort (e.g. the JVM died),
    so a dead broker is reported at once rather than after a hung admin request.
    ``cluster_id`` guards against answering for a different broker on the same port.
    """
    poller = asyncio.ensure_future(_poll_ready(bootstrap, timeout, cluster_id, brokers))
    if check is None:
        return await poller
    watcher = asyncio.ensure_future(_watch(check))
    try:
        await asyncio.wait({poller, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            watcher.result()  # raises why the broker is gone
        return await poller
    finally:
        for task in (poller, watcher):
            task.cancel()
        await asyncio.gather(poller, watcher, return_exceptions=True)


async def _watch(check: Callable[[], None]) -> None:
    while True:
        check()
        await asyncio.sleep(0.2)


async def _poll_ready(
    bootstrap: str, timeout: float, cluster_id: str | None, brokers: int = 1
) -> dict[str, Any]:
    """A fixed-port KRaft broker opens its socket only once ready, so a cheap TCP probe gates
    the (noisier) admin client."""
    from aiokafka.admin import AIOKafkaAdminClient

    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if await _port_open(host, int(port)):
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
            try:
                await asyncio.wait_for(admin.start(), 5)
                meta: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), 5)
                if cluster_id is not None and meta.get("cluster_id") != cluster_id:
                    raise KafkaLocalError(
                        f"{bootstrap} answers for cluster {meta.get('cluster_id')!r}, "
                        f"not ours ({cluster_id!r}); is another broker on that port?"
                    )
                if len(meta.get("brokers") or ()) >= brokers:
                    return meta
            except KafkaLocalError:
                raise
            except Exception as exc:  # keep polling until the deadline
                last = exc
            finally:
                with contextlib.suppress(Exception):
                    await admin.close()
        await asyncio.sleep(0.2)
    raise KafkaLocalError(f"Kafka at {bootstrap} not ready after {timeout:.0f}s: {last!r}")


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run that also works when called from inside a running loop (async fixtures)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _terminate(
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


def _remove_workdir(workdir: str | Path | None) -> None:
    """Delete a broker workdir, but only one this module created (name prefix check)."""
    if workdir and Path(workdir).name.startswith(WORKDIR_PREFIX):
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- LocalBroker


@dataclass(frozen=True)
class BrokerState:
    """What ``<state dir>/broker.json`` records about a detached broker."""

    pid: int
    pgid: int
    bootstrap: str
    workdir: str
    started_at: str


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
        java = _require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")
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

        _launch_retrying(launch, self.stop, retry=None in fixed)
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
            _server_properties(
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
            raise KafkaLocalError(f"StorageTool format failed:\n{_tail(out)}{hint}")

    def _spawn(self, java: str, libs: Path, append: bool = False) -> None:
        """Launch the JVM on the formatted workdir and block until it answers."""
        self._popen(java, libs, append)
        _run_sync(
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
            raise _EarlyExit(
                f"Kafka broker exited with code {self._proc.returncode} before it was ready; "
                f"tail of kafka.out:\n{self.output_tail()}"
            )

    def output_tail(self, lines: int = 40) -> str:
        """Last lines of the broker's combined stdout/stderr, for error messages."""
        if self.workdir is None:
            return ""
        try:
            return _tail((self.workdir / "kafka.out").read_text(errors="replace"), lines)
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, warn: bool = True) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL of its group) and delete the workdir. Idempotent.

        ``warn=False`` logs a needed SIGKILL at INFO only (a cluster expects one).
        """
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc.pid, proc.pid, lambda: proc.poll() is None, timeout, warn=warn)
            if proc.poll() is None:
                proc.wait()
        _remove_workdir(self.workdir)

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
            _terminate(proc.pid, proc.pid, lambda: proc.poll() is None, STOP_TIMEOUT_S)
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
        java = _require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")
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


@dataclass(eq=False)
class LocalCluster:
    """``brokers`` combined broker+controller KRaft nodes on loopback: a static voter each.

    Why: replication and failover (acks=all, min ISR 2, one broker killed mid-run) can only be
    tested against several brokers. Each node is a :class:`LocalBroker` (own process group,
    workdir, free ports; heap ``CLUSTER_NODE_JVM_ARGS``); ``brokers=1`` is a plain LocalBroker
    (replication 1), ``port`` fixes the first broker's port. New and internal topics get
    replication ``min(brokers, 3)`` and min ISR one less. :attr:`pids`, :meth:`kill_broker` and
    :meth:`start_broker` let a test kill one broker and bring it back.
    """

    brokers: int = 3
    partitions: int = 1
    port: int | None = None
    libs: Path | None = None
    ready_timeout: float = READY_TIMEOUT_S
    jvm_args: Sequence[str] = ()
    nodes: list[LocalBroker] = field(default_factory=list, init=False)
    cluster_id: str | None = field(default=None, init=False)
    startup_seconds: float | None = field(default=None, init=False)
    started_at: datetime | None = field(default=None, init=False)

    @property
    def bootstrap(self) -> str:
        """Every broker's ``127.0.0.1:<port>``, comma separated."""
        if not self.nodes:
            raise KafkaLocalError("cluster not started")
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def pids(self) -> list[int]:
        """The current JVM pid of each broker, in node order (node id = index + 1)."""
        return [node.pid for node in self.nodes if node.pid is not None]

    @property
    def running(self) -> bool:
        """True while every broker's JVM is alive."""
        return bool(self.nodes) and all(node.running for node in self.nodes)

    def start(self) -> Self:
        """Format every node, launch all JVMs, and block until each lists all brokers."""
        if self.nodes:
            raise KafkaLocalError("cluster already started")
        if self.brokers < 1 or self.partitions < 1:
            raise ValueError("brokers and partitions must be >= 1")
        if self.port == 0:
            raise ValueError("port 0 is not allowed: the broker would look ready too early")
        self.started_at = datetime.now(UTC)
        began = time.monotonic()
        if self.brokers == 1:
            node = LocalBroker(
                port=self.port,
                libs=self.libs,
                ready_timeout=self.ready_timeout,
                jvm_args=self.jvm_args,
                partitions=self.partitions,
            )
            self.nodes = [node]
            node.start()  # stops itself on failure
            self.cluster_id = node.cluster_id
        else:
            java = _require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")
            libs = self.libs or fetch_jars()
            _launch_retrying(lambda: self._launch(java, libs), self.stop, retry=True)
        self.startup_seconds = time.monotonic() - began
        atexit.register(self.stop)  # last resort if the owner forgets to stop us
        log.info("cluster ready at %s in %.1fs", self.bootstrap, self.startup_seconds)
        return self

    def _launch(self, java: str, libs: Path) -> None:
        taken: set[int] = set()
        ports: list[tuple[int, int]] = []
        for i in range(self.brokers):
            port = self.port if i == 0 and self.port else free_port(taken)
            taken.add(port)
            taken.add(controller := free_port(taken))
            ports.append((port, controller))
        voters = ",".join(f"{i + 1}@{HOST}:{c}" for i, (_, c) in enumerate(ports))
        self.cluster_id = cluster_id = new_cluster_id()
        self.nodes = []
        for i, (port, controller) in enumerate(ports):
            node = LocalBroker(
                port=port,
                controller_port=controller,
                libs=libs,
                ready_timeout=self.ready_timeout,
                jvm_args=(*CLUSTER_NODE_JVM_ARGS, *self.jvm_args),
                partitions=self.partitions,
            )
            node.node_id, node.voters, node.replication = i + 1, voters, min(self.brokers, 3)
            node.started_at = self.started_at
            self.nodes.append(node)
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node._prepare(java, libs, cluster_id), self.nodes))
        log.info("starting a %d-broker Kafka %s cluster", len(self.nodes), KAFKA_VERSION)
        for node in self.nodes:
            node._popen(java, libs)
        _run_sync(self._wait_ready())

    def _check_alive(self) -> None:
        for node in self.nodes:
            node._check_alive()

    async def _wait_ready(self) -> None:
        await asyncio.gather(
            *(
                wait_ready(
                    node.bootstrap,
                    self.ready_timeout,
                    check=self._check_alive,
                    cluster_id=self.cluster_id,
                    brokers=len(self.nodes),
                )
                for node in self.nodes
            )
        )
        await _create_coordinator_topics(self.bootstrap, self.ready_timeout)

    def _node(self, index: int) -> LocalBroker:
        if not 0 <= index < len(self.nodes):
            raise KafkaLocalError(f"no broker {index}; the cluster has {len(self.nodes)}")
        return self.nodes[index]

    def kill_broker(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Kill broker ``index`` (0-based) with ``sig`` (its process group) and wait until it
        exits; return its pid. Its data stays for :meth:`start_broker`."""
        return self._node(index).kill(sig)

    def start_broker(self, index: int) -> int:
        """Start the exited broker ``index`` again (same ports, data); return its new pid."""
        node = self._node(index)
        node.resume()
        assert node.pid is not None
        return node.pid

    def restart_broker(self, index: int, *, kill: bool = False, pause: float = 0.0) -> int:
        """Stop broker ``index`` (SIGTERM, or SIGKILL with ``kill``), wait ``pause`` s, start it
        again until ready; return its new pid."""
        node = self._node(index)
        node.restart(kill=kill, pause=pause)
        assert node.pid is not None
        return node.pid

    def stop(self, timeout: float | None = None) -> None:
        """Stop every broker at once (SIGTERM, then SIGKILL) and delete the workdirs. Idempotent.

        A cluster waits at most ``CLUSTER_STOP_TIMEOUT_S`` by default: its data is deleted anyway.
        """
        atexit.unregister(self.stop)
        single = len(self.nodes) == 1
        if timeout is None:
            timeout = STOP_TIMEOUT_S if single else CLUSTER_STOP_TIMEOUT_S
        if self.nodes:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda node: node.stop(timeout, warn=single), self.nodes))

    def state(self) -> ClusterState:
        """Snapshot for the state file of a detached cluster."""
        if not self.nodes or self.started_at is None:
            raise KafkaLocalError("cluster not started")
        return ClusterState(
            bootstrap=self.bootstrap,
            started_at=self.started_at.isoformat(timespec="seconds"),
            brokers=tuple(node.state() for node in self.nodes),
        )

    def detach(self) -> ClusterState:
        """Forget the processes so they outlive this Python process (CLI ``start``)."""
        state = self.state()
        atexit.unregister(self.stop)
        for node in self.nodes:
            node.detach()
        return state

    def __enter__(self) -> Self:
        return self if self.nodes else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


async def _create_coordinator_topics(bootstrap: str, timeout: float) -> None:
    """Make the cluster create ``__consumer_offsets`` and ``__transaction_state`` now.

    Why: Kafka creates them on first use with the configured replication (3), which fails while a
    broker is down; a test that kills a broker before its first group or transaction would hang.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(admin.start(), timeout)
    try:
        for kind in (0, 1):  # group, transaction coordinator
            while True:
                try:
                    await admin.find_coordinator("rewardstream-local-cluster", kind)
                    break
                except Exception as exc:  # not available while the topic is being created
                    if time.monotonic() > deadline:
                        raise KafkaLocalError(f"no coordinator at {bootstrap}: {exc!r}") from exc
                    await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


# --------------------------------------------------------------------------- detached state


def _is_our_broker(state: BrokerState, *, exiting: bool = False) -> bool:
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


def _write_state(state: ClusterState, folder: Path) -> None:
    path = state_path(folder)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(path)


def running_state(folder: Path) -> ClusterState | None:
    """The detached broker(s) of ``folder`` if any is alive; else clean up a stale state file
    and workdirs."""
    state = read_state(folder)
    if state is not None and any(_is_our_broker(b) for b in state.brokers):
        return state
    for broker in state.brokers if state is not None else ():
        _remove_workdir(broker.workdir)
    state_path(folder).unlink(missing_ok=True)
    return None


def stop_detached(folder: Path, timeout: float = STOP_TIMEOUT_S) -> ClusterState | None:
    """Stop every broker ``folder`` records that is still ours, all at once; return the state,
    or None if none was running. Only the recorded pids' own process groups are signalled."""
    state = running_state(folder)
    if state is None:
        return None
    live = [b for b in state.brokers if _is_our_broker(b)]
    single = len(state.brokers) == 1
    if not single:
        timeout = min(timeout, CLUSTER_STOP_TIMEOUT_S)  # the data is deleted anyway

    def stop_one(b: BrokerState) -> None:
        _terminate(b.pid, b.pgid, lambda: _is_our_broker(b, exiting=True), timeout, warn=single)

    with ThreadPoolExecutor(max(1, len(live))) as pool:
        list(pool.map(stop_one, live))
    alive = [b.pid for b in live if _is_our_broker(b, exiting=True)]
    if alive:
        raise KafkaLocalError(f"broker pid(s) {alive} still alive after SIGKILL")
    for broker in state.brokers:
        _remove_workdir(broker.workdir)
    state_path(folder).unlink(missing_ok=True)
    return state


@contextlib.contextmanager
def _state_lock(folder: Path) -> Iterator[None]:
    """Serialise start/stop/status so two concurrent starts cannot both launch a broker."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / "broker.lock", "w")  # noqa: SIM115 - held for the block
    except OSError as exc:
        raise KafkaLocalError(f"state folder {folder}: {exc.strerror or exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- test fixture logic


@contextlib.contextmanager
def provide_broker() -> Iterator[str]:
    """Yield a bootstrap address for tests, in the order of docs/kafka-local.md §Broker for tests.

    ``KAFKA_BOOTSTRAP_SERVERS`` → a :class:`LocalBroker` from the jars (fetched if java and mvn
    exist) → testcontainers ``KafkaContainer().with_kraft()``. Raises :class:`BrokerUnavailable`
    listing why each option failed; a LocalBroker that fails to *start* is a real error and is
    raised as is.
    """
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    reasons: list[str] = []
    libs: Path | None = None
    if shutil.which("java") is None:
        reasons.append("no 'java' on PATH")
    else:
        try:
            libs = fetch_jars()
        except KafkaLocalError as exc:
            reasons.append(f"no Kafka jars: {exc}")
    if libs is not None:
        with LocalBroker(libs=libs) as broker:
            yield broker.bootstrap
        return
    container = _start_container(reasons)
    if container is None:
        raise BrokerUnavailable("; ".join(reasons))
    try:
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


def _start_container(reasons: list[str]) -> Any:
    """A testcontainers KRaft broker with transaction-log RF 1, or None (reason appended)."""
    import gc
    import importlib

    try:
        # docker ships no type stubs; import it dynamically so mypy sees Any.
        DockerException = importlib.import_module("docker.errors").DockerException
        from testcontainers.community.kafka import KafkaContainer
    except ImportError as exc:
        reasons.append(f"testcontainers unavailable: {exc}")
        return None
    # docker-py leaks a socket when no engine answers; keep that ResourceWarning out of
    # `filterwarnings = error` test runs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            container = (
                KafkaContainer()
                .with_kraft()
                .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
                .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            )
            container.start()
        except DockerException as exc:
            reasons.append(f"no Docker engine for testcontainers: {exc}")
            container = None
        gc.collect()
    return container


# --------------------------------------------------------------------------- CLI


def _cli_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kafka: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _cmd_start(args: argparse.Namespace) -> int:
    _cli_logging()
    folder = args.state_dir or state_dir()
    with _state_lock(folder):
        running = running_state(folder)
        if running is not None:
            pids = ",".join(map(str, running.pids))
            msg = ALREADY_RUNNING if len(running.brokers) == 1 else ALREADY_RUNNING_CLUSTER
            print(msg.format(bootstrap=running.bootstrap, pid=pids, pids=pids), file=sys.stderr)
            return 1
        cluster = LocalCluster(brokers=args.brokers, partitions=args.partitions, port=args.port)
        try:
            cluster.start()
            state = cluster.state()
            _write_state(state, folder)
        except (KafkaLocalError, ValueError) as exc:
            cluster.stop()
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except BaseException:
            cluster.stop()
            raise
        cluster.detach()
    for b in state.brokers:
        log.info("pid %d, workdir %s, log %s/kafka.out", b.pid, b.workdir, b.workdir)
    print(f"bootstrap={state.bootstrap}", flush=True)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    folder = args.state_dir or state_dir()
    if not folder.exists():  # nothing recorded: nothing to create
        print("not running")
        return 1
    with _state_lock(folder):
        state = running_state(folder)
    if state is None:
        print("not running")
        return 1
    if len(state.brokers) == 1:
        print(f"running bootstrap={state.bootstrap} pid={state.brokers[0].pid}")
        return 0
    pids = ",".join(map(str, state.pids))
    down = ",".join(str(b.pid) for b in state.brokers if not _is_our_broker(b))
    if down:
        print(f"degraded bootstrap={state.bootstrap} pids={pids} down={down}")
        return 2
    print(f"running bootstrap={state.bootstrap} pids={pids}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    _cli_logging()
    folder = args.state_dir or state_dir()
    with _state_lock(folder):
        state = stop_detached(folder)
    if state is None:
        print("not running")
    elif len(state.brokers) == 1:
        print(f"stopped pid={state.brokers[0].pid}")
    else:
        print(f"stopped pids={','.join(map(str, state.pids))}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    _cli_logging()
    print(fetch_jars())
    return 0


def _one_line(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A ``kafka`` subcommand whose failure (a :class:`KafkaLocalError`, or a folder or file
    it cannot use) is one line on stderr and exit code 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except KafkaLocalError as exc:
            print(f"error: {exc}", file=sys.stderr)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1

    return run


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError("port must be 1-65535 (0 is not allowed)")
    return port


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kafka start|stop|status|fetch``; each sets ``func(args) -> exit code``."""
    kafka = subparsers.add_parser("kafka", help="run a local Kafka broker or 3-broker cluster")
    sub = kafka.add_subparsers(dest="kafka_command", required=True)
    start = sub.add_parser(
        "start", help="start a detached broker or cluster; last stdout line: bootstrap="
    )
    start.add_argument(
        "--port", type=_port, default=None, help="port of the (first) broker (default: free)"
    )
    start.add_argument(
        "--partitions",
        type=_positive,
        default=CLI_PARTITIONS,
        metavar="N",
        help=f"num.partitions of auto-created topics (default {CLI_PARTITIONS}, so a consumer "
        "group of up to that many processors all get partitions; with 1 a second one sits idle)",
    )
    start.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="1 (default): one broker, replication 1; 3: a KRaft cluster of three broker+"
        "controller nodes, replication 3, min ISR 2, so one broker may die without loss",
    )
    start.set_defaults(func=_one_line(_cmd_start))
    stop = sub.add_parser("stop", help="stop the broker(s) this state folder records")
    stop.set_defaults(func=_one_line(_cmd_stop))
    status = sub.add_parser("status", help="are the broker(s) this state folder records running?")
    status.set_defaults(func=_one_line(_cmd_status))
    for command in (start, stop, status):
        command.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            metavar="DIR",
            help="where the broker is recorded: start, status and stop with the same DIR see the "
            "same broker (default: $REWARDSTREAM_KAFKA_STATE_DIR, else .rewardstream/kafka in "
            "the current folder)",
        )
    sub.add_parser("fetch", help="download the broker jars only").set_defaults(
        func=_one_line(_cmd_fetch)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m rewardstream.kafka.local kafka start``) for tests/scripts."""
    parser = argparse.ArgumentParser(prog="rewardstream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)
