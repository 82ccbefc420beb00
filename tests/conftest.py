"""Shared fixtures: one real Kafka broker per test session, and per-test unique names."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import uuid
from collections.abc import Callable, Iterator

import pytest

from rewardstream.kafka import local as kafka_local
from tests.processes import Processor

pytest_plugins = ["tests.nemo"]  # the nemo_python fixture

# The tests send SIGINT to the commands they start, as a terminal's Ctrl-C would. A background
# job of a non-interactive shell (`make test &` in a script, nohup) starts with SIGINT ignored,
# and every child it execs inherits that: the commands would never see the signal. A Python
# handler here makes the children start with the default disposition instead.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a real broker (order: env, local jars, testcontainers; see kafka_local).

    Without any broker the Kafka tests skip locally but fail under ``CI=true``, so CI can never
    pass by silently skipping them.
    """
    with contextlib.ExitStack() as stack:
        try:
            bootstrap = stack.enter_context(kafka_local.provide_broker())
        except kafka_local.BrokerUnavailable as exc:
            msg = f"no Kafka broker available: {exc}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)
        yield bootstrap


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Factory for topic/group/app names unique to this test: ``<prefix>-<test>-<uuid8>``."""
    test = re.sub(r"[^A-Za-z0-9-]+", "-", request.node.name).strip("-")[:40]

    def make(prefix: str) -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def processors() -> Iterator[list[Processor]]:
    """Processor child processes a test starts; any still running are killed afterwards."""
    started: list[Processor] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill(signal.SIGKILL)
