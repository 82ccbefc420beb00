"""Run a real Apache Kafka 4.3.1 broker, or a 3-broker KRaft cluster, from Maven Central jars.

Why: the profiler's tests and local runs need a real broker, but there is no Docker engine here
and no Python package ships the broker. Maven resolves the broker classpath from
``deploy/kafka-local/pom.xml`` once; each broker then runs as a plain ``java`` process in its own
process group and fresh temporary directory (recipe: docs/kafka-local.md).

One module a job, each importing only those below it (``lint-imports``):

* :mod:`.cli`: ``rewardstream kafka start|status|stop|fetch``; :mod:`.fixture`: the tests'
  broker (environment, jars, or testcontainers);
* :mod:`.cluster`: :class:`LocalCluster`, several nodes; :mod:`.broker`: :class:`LocalBroker`,
  one node;
* :mod:`.state`: the state file of a detached broker and its lock;
* :mod:`.jars`: the classpath; :mod:`.properties`: a node's configuration; :mod:`.ready`: when
  clients get answers; :mod:`.process`: ports, launching and stopping a JVM;
* :mod:`.errors`: what fails, worded to say what to do.

This package re-exports what its users name (the tests, ``bench/`` and the ``rewardstream``
command), so they need not know the cut.
"""

from rewardstream.kafka.local.broker import LocalBroker
from rewardstream.kafka.local.cli import CLI_PARTITIONS, add_parser, main
from rewardstream.kafka.local.cluster import LocalCluster
from rewardstream.kafka.local.errors import BrokerUnavailable, KafkaLocalError
from rewardstream.kafka.local.fixture import provide_broker
from rewardstream.kafka.local.jars import KAFKA_VERSION, cache_dir, fetch_jars, libs_dir
from rewardstream.kafka.local.process import WORKDIR_PREFIX, free_port
from rewardstream.kafka.local.properties import new_cluster_id
from rewardstream.kafka.local.ready import wait_ready
from rewardstream.kafka.local.state import (
    BrokerState,
    ClusterState,
    read_state,
    running_state,
    state_dir,
    state_path,
    stop_detached,
)

__all__ = [
    "CLI_PARTITIONS",
    "KAFKA_VERSION",
    "WORKDIR_PREFIX",
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
