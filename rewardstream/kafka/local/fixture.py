"""A broker for the test suite (:func:`provide_broker`): the one the environment names, else a
:class:`~rewardstream.kafka.local.broker.LocalBroker` from the jars, else a testcontainers
broker, in the order of docs/kafka-local.md §Broker for tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rewardstream.kafka.local.broker import LocalBroker
from rewardstream.kafka.local.errors import BrokerUnavailable, KafkaLocalError
from rewardstream.kafka.local.jars import fetch_jars

__all__ = ["provide_broker"]


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
