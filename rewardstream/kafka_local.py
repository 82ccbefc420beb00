"""Run a real single-node Apache Kafka 4.3.1 broker (KRaft) from Maven Central jars.

Why: the profiler's tests and local runs need a real broker, but there is no Docker engine here
and no Python package ships the broker. Maven resolves the broker classpath from
``deploy/kafka-local/pom.xml`` once; each broker then runs as a plain ``java`` process in its own
process group and fresh temporary directory (recipe: ``/work/shared/spec/kafka-local.md``).

CLI (``rewardstream kafka ...``, wired in via :func:`add_parser`):

* ``start [--port N]``: start a detached broker, print ``bootstrap=127.0.0.1:<port>`` as the last
  stdout line and record it in ``<cache>/broker.json``. If that broker is still alive, fail with
  exit code 1 and ``a broker is already running at 127.0.0.1:<port> (pid N); run 'rewardstream
  kafka stop' first``.
* ``status``: ``running bootstrap=127.0.0.1:<port> pid=N`` (exit 0) or ``not running`` (exit 1).
* ``stop``: SIGTERM, then after 30 s SIGKILL of the broker's own process group; removes its
  workdir and the state file. Prints ``not running`` (exit 0) when nothing runs.
* ``fetch``: only download the jars and print the libs directory.

Environment: ``REWARDSTREAM_CACHE_DIR`` (default ``~/.cache/rewardstream``) holds the jars and the
state file; ``KAFKA_LIBS_DIR`` overrides the jar directory.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import fcntl
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
    "KafkaLocalError",
    "LocalBroker",
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
    "state_path",
    "stop_detached",
    "wait_ready",
]

KAFKA_VERSION = "4.3.1"
HOST = "127.0.0.1"
POM = Path(__file__).resolve().parents[1] / "deploy" / "kafka-local" / "pom.xml"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
WORKDIR_PREFIX = "rewardstream-kafka-"
ALREADY_RUNNING = (
    "a broker is already running at {bootstrap} (pid {pid}); run 'rewardstream kafka stop' first"
)
# Spec §1.3/§1.6: upstream G1 flags with a smaller heap; StorageTool gets the tool default.
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


def state_path() -> Path:
    """Where the detached CLI broker is recorded, so ``status``/``stop`` can find it."""
    return cache_dir() / "broker.json"


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
) -> str:
    """Spec §1.4: single static voter, and RF/min-ISR 1 so groups and transactions work.

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
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{HOST}:{controller_port}
controller.listener.names=CONTROLLER
listeners={listeners}
advertised.listeners={listeners}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map={protocols}
log.dirs={workdir / "data"}
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=33554432
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
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
) -> dict[str, Any]:
    """Poll until a Metadata round trip lists a broker; return the describe_cluster dict.

    ``check`` runs every 0.2 s *alongside* the poll and may raise to abort (e.g. the JVM died),
    so a dead broker is reported at once rather than after a hung admin request.
    ``cluster_id`` guards against answering for a different broker on the same port.
    """
    poller = asyncio.ensure_future(_poll_ready(bootstrap, timeout, cluster_id))
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


async def _poll_ready(bootstrap: str, timeout: float, cluster_id: str | None) -> dict[str, Any]:
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
                if meta.get("brokers"):
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


def _terminate(pid: int, pgid: int, alive: Callable[[], bool], timeout: float) -> None:
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
        log.warning("broker pid %d ignored SIGTERM for %.0fs; sending SIGKILL", pid, timeout)
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
    """What ``<cache>/broker.json`` records about a detached broker."""

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
    server.properties (e.g. ``listener.name.sasl.plain.sasl.jaas.config``).
    """

    port: int | None = None
    controller_port: int | None = None
    libs: Path | None = None
    ready_timeout: float = READY_TIMEOUT_S
    jvm_args: Sequence[str] = ()
    extra_listeners: Mapping[str, str] = field(default_factory=dict)
    extra_properties: Mapping[str, str] = field(default_factory=dict, repr=False)
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
        java = _require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")
        libs = self.libs or fetch_jars()
        fixed = (self.port, self.controller_port)
        self.started_at = datetime.now(UTC)
        began = time.monotonic()
        for attempt in (1, 2):
            self.port = fixed[0] or free_port()
            self.controller_port = fixed[1] or free_port({self.port})
            taken = {self.port, self.controller_port}
            for name in self.extra_listeners:
                taken.add(port := free_port(taken))
                self.listener_ports[name] = port
            try:
                self._launch(java, libs)
                break
            except _EarlyExit as exc:
                self.stop()
                if attempt == 2 or None not in fixed or "Address already in use" not in str(exc):
                    raise
                log.warning("port race (%s); retrying once with new ports", self.bootstrap)
            except BaseException:
                self.stop()
                raise
        self.startup_seconds = time.monotonic() - began
        atexit.register(self.stop)  # last resort if the owner forgets to stop us
        log.info("broker ready at %s in %.1fs", self.bootstrap, self.startup_seconds)
        return self

    def _launch(self, java: str, libs: Path) -> None:
        assert self.port is not None and self.controller_port is not None
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (workdir / "data").mkdir()
        props = workdir / "server.properties"
        extra = {n: (p, self.listener_ports[n]) for n, p in self.extra_listeners.items()}
        props.write_text(
            _server_properties(
                workdir, self.port, self.controller_port, extra, self.extra_properties
            )
        )
        log4j = workdir / "log4j2.properties"
        log4j.write_text(LOG4J2_PROPERTIES)
        classpath = f"{libs}/*"
        common = [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        self.cluster_id = new_cluster_id()
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
        log.info("starting Kafka %s on %s (workdir %s)", KAFKA_VERSION, self.bootstrap, workdir)
        self._spawn(java, libs)

    def _spawn(self, java: str, libs: Path, append: bool = False) -> None:
        """Launch the JVM on the formatted workdir and block until it answers."""
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
        _run_sync(
            wait_ready(
                self.bootstrap,
                self.ready_timeout,
                check=self._check_alive,
                cluster_id=self.cluster_id,
            )
        )

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

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL of its group) and delete the workdir. Idempotent."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc.pid, proc.pid, lambda: proc.poll() is None, timeout)
            if proc.poll() is None:
                proc.wait()
        _remove_workdir(self.workdir)

    def restart(self, *, kill: bool = False, pause: float = 0.0) -> None:
        """Stop the JVM (SIGTERM, or SIGKILL of its group with ``kill``), wait ``pause`` seconds,
        and start it again on the same data dir, ports and cluster id, until ready.

        Why: fault trials (``bench/chaos.py``) check that producers and processors ride through
        a broker restart, which needs the same address and the logs kept.
        """
        proc, self._proc = self._proc, None
        if proc is None or self.workdir is None:
            raise KafkaLocalError("broker not started")
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # unreaped leader: the group id is ours
        else:
            _terminate(proc.pid, proc.pid, lambda: proc.poll() is None, STOP_TIMEOUT_S)
        proc.wait()
        time.sleep(pause)
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


def read_state() -> BrokerState | None:
    """The recorded detached broker, alive or not; None if there is no readable state file."""
    try:
        data = json.loads(state_path().read_text())
        return BrokerState(**{k: data[k] for k in BrokerState.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_state(state: BrokerState) -> None:
    path = state_path()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)


def running_state() -> BrokerState | None:
    """The detached broker if it is alive; otherwise clean up a stale state file and workdir."""
    state = read_state()
    if state is not None and _is_our_broker(state):
        return state
    if state is not None:
        _remove_workdir(state.workdir)
    state_path().unlink(missing_ok=True)
    return None


def stop_detached(timeout: float = STOP_TIMEOUT_S) -> BrokerState | None:
    """Stop the detached broker; return its state, or None if none was running."""
    state = running_state()
    if state is None:
        return None
    _terminate(state.pid, state.pgid, lambda: _is_our_broker(state, exiting=True), timeout)
    if _is_our_broker(state, exiting=True):
        raise KafkaLocalError(f"broker pid {state.pid} is still alive after SIGKILL")
    _remove_workdir(state.workdir)
    state_path().unlink(missing_ok=True)
    return state


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serialise start/stop/status so two concurrent starts cannot both launch a broker."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "broker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- test fixture logic


@contextlib.contextmanager
def provide_broker() -> Iterator[str]:
    """Yield a bootstrap address for tests, in the order of spec §4.

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
    with _state_lock():
        running = running_state()
        if running is not None:
            print(
                ALREADY_RUNNING.format(bootstrap=running.bootstrap, pid=running.pid),
                file=sys.stderr,
            )
            return 1
        broker = LocalBroker(port=args.port)
        try:
            broker.start()
            state = broker.state()
            _write_state(state)
        except KafkaLocalError as exc:
            broker.stop()
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except BaseException:
            broker.stop()
            raise
        broker.detach()
    log.info("pid %d, workdir %s, log %s/kafka.out", state.pid, state.workdir, state.workdir)
    print(f"bootstrap={state.bootstrap}", flush=True)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with _state_lock():
        state = running_state()
    if state is None:
        print("not running")
        return 1
    print(f"running bootstrap={state.bootstrap} pid={state.pid}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    _cli_logging()
    try:
        with _state_lock():
            state = stop_detached()
    except KafkaLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("not running" if state is None else f"stopped pid={state.pid}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    _cli_logging()
    try:
        print(fetch_jars())
    except KafkaLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError("port must be 1-65535 (0 is not allowed)")
    return port


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kafka start|stop|status|fetch``; each sets ``func(args) -> exit code``."""
    kafka = subparsers.add_parser("kafka", help="run a local single-node Kafka broker")
    sub = kafka.add_subparsers(dest="kafka_command", required=True)
    start = sub.add_parser("start", help="start a detached broker; last stdout line: bootstrap=")
    start.add_argument("--port", type=_port, default=None, help="broker port (default: free)")
    start.set_defaults(func=_cmd_start)
    sub.add_parser("stop", help="stop the detached broker").set_defaults(func=_cmd_stop)
    sub.add_parser("status", help="is the detached broker running?").set_defaults(func=_cmd_status)
    sub.add_parser("fetch", help="download the broker jars only").set_defaults(func=_cmd_fetch)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m rewardstream.kafka_local kafka start``) for tests/scripts."""
    parser = argparse.ArgumentParser(prog="rewardstream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
