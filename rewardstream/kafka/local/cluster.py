"""A KRaft cluster of combined broker+controller nodes on loopback (:class:`LocalCluster`),
each a :class:`~rewardstream.kafka.local.broker.LocalBroker`: replication and failover (acks=all,
min ISR 2, one broker killed mid-run) can only be tested against several brokers."""

from __future__ import annotations

import asyncio
import atexit
import logging
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

from rewardstream.kafka.local.broker import LocalBroker
from rewardstream.kafka.local.errors import KafkaLocalError
from rewardstream.kafka.local.jars import KAFKA_VERSION, fetch_jars, require_java
from rewardstream.kafka.local.process import (
    CLUSTER_STOP_TIMEOUT_S,
    HOST,
    STOP_TIMEOUT_S,
    free_port,
    launch_retrying,
)
from rewardstream.kafka.local.properties import new_cluster_id
from rewardstream.kafka.local.ready import (
    READY_TIMEOUT_S,
    create_coordinator_topics,
    run_sync,
    wait_ready,
)
from rewardstream.kafka.local.state import ClusterState

__all__ = ["CLUSTER_NODE_JVM_ARGS", "LocalCluster"]

# Cluster nodes: three JVMs share 2 cores and the tests' memory, so each gets a smaller heap
# (placed after BROKER_JVM_ARGS: the JVM's last -Xms/-Xmx wins).
CLUSTER_NODE_JVM_ARGS = ("-Xms128m", "-Xmx384m")

log = logging.getLogger(__name__)


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
            java = require_java()
            libs = self.libs or fetch_jars()
            launch_retrying(lambda: self._launch(java, libs), self.stop, retry=True)
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
        run_sync(self._wait_ready())

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
        await create_coordinator_topics(self.bootstrap, self.ready_timeout)

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
