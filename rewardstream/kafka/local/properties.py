"""What a node is formatted and started with: its cluster id, ``server.properties`` and
``log4j2.properties`` (docs/kafka-local.md §Server properties, §Logging)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from pathlib import Path

from rewardstream.kafka.local.process import HOST

__all__ = ["LOG4J2_PROPERTIES", "new_cluster_id", "server_properties"]

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


def new_cluster_id() -> str:
    """A 22-char Kafka Uuid; a leading '-' would be parsed by StorageTool as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def server_properties(
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
