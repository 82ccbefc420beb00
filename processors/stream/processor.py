"""``rewardstream stream``: :class:`StreamProcessor` wires the collaborators of this package
(see its docstring) to the Kafka clients it starts, and runs their loops until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from rewardstream.contract.decisions import decisions_topic
from rewardstream.contract.engine import EngineTopics
from rewardstream.contract.events import Topics
from rewardstream.contract.names import default_group
from rewardstream.errors import InputError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.difference import Rule
from rewardstream.processors.engine.pipeline import STALL_AFTER, Pipeline
from rewardstream.processors.engine.runs import PartView
from rewardstream.processors.http.server import IDLE_TIMEOUT
from rewardstream.processors.http.snapshot import SnapshotLimits
from rewardstream.processors.stream.changelog import Changelog
from rewardstream.processors.stream.commits import Commits
from rewardstream.processors.stream.consume import Batch, ConsumeLoop, Rebalance
from rewardstream.processors.stream.dead_letters import DeadLetters
from rewardstream.processors.stream.decisions import Decisions
from rewardstream.processors.stream.endpoint import open_endpoint
from rewardstream.processors.stream.eviction import Eviction
from rewardstream.processors.stream.finals import Finals
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.peers import PART_TIMEOUT_S, PeerParts
from rewardstream.processors.stream.runtime import QuietStart, young_collections
from rewardstream.processors.stream.tasks import Background
from rewardstream.processors.stream.units import Units
from rewardstream.sinks.files import ProfilePaths
from rewardstream.sinks.metrics import Metrics
from rewardstream.sinks.topics.profiles import ensure_topics, read_finals, read_to_end, reader

__all__ = ["MAX_EVENT_BYTES", "StreamProcessor"]

_GC_YOUNG = 50_000  # allocations between young collections while processing (CPython: 700)
MAX_EVENT_BYTES = 1 << 20  # larger events are dead letters ("oversized"), never parsed


class StreamProcessor:
    """Consume inputs, rollouts and control events; finish each run exactly once.

    It owns nothing but the wiring: the engine (:attr:`pipeline`), the collaborators that act
    on what it decides (:attr:`units`, :attr:`membership`, :attr:`peers`, :attr:`dead_letters`,
    :attr:`changelog`, :attr:`commits`, :attr:`finals`, :attr:`eviction`, :attr:`decisions`,
    :attr:`consume`), the Kafka clients and the HTTP endpoint they share, started and stopped
    in order by :meth:`run`."""

    def __init__(
        self,
        bootstrap: str,
        output_dir: Path | None,
        topics: Topics | None = None,
        group_id: str | None = None,
        checkpoint_every: float = 5.0,
        security: KafkaSecurity | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        state_dir: Path | None = None,
        advertise: str | None = None,
        evict_after: float = 24 * 3600.0,
        aggregate_metrics: bool = False,
        stall_after: float = STALL_AFTER,
        snapshot_limits: SnapshotLimits | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        http_security: HttpSecurity | None = None,
        compares: Sequence[tuple[str, str]] = (),
        compare_rule: Rule | None = None,
        level: float = DEFAULT_LEVEL,
    ) -> None:
        """``compares``: (baseline, candidate) run ids whose comparison ``/metrics`` exports,
        judged by ``compare_rule``, as the page's compare view is; ``level``: the agents' mean
        reward intervals' on the page, ``/runs/<id>``, ``/metrics`` and in ``_intervals.json``."""
        self.bootstrap = bootstrap
        self.compare_rule = compare_rule or Rule()
        self.http_security = http_security or HttpSecurity()  # its endpoint's, and for peers
        if advertise is not None:
            self.http_security.check_advertised(advertise)
        self.http_security.check_peers()
        self.security = security or KafkaSecurity.from_env()  # SASL/TLS for every client
        self.topics = topics or Topics.for_prefix()
        self.prefix = self.topics.control.removesuffix(".control")
        self.engine_topics = EngineTopics.of(self.topics)
        self.group_id = group_id or default_group(self.prefix)
        self._own_state = state_dir is None  # a fresh temporary folder, removed at the end
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="rewardstream-state-"))
        self.advertise = advertise
        self.snapshot_limits, self.idle_timeout = snapshot_limits, idle_timeout
        self.metrics = Metrics(
            lambda: self.pipeline.runs,
            lambda: self.consume.lag(),
            clock=time.monotonic,
            compares=compares,
            rule=self.compare_rule,
            level=level,
        )
        self.pipeline = Pipeline(
            output_dir or self.state_dir / "finals",
            metrics=self.metrics,
            max_event_bytes=max_event_bytes,
            state_dir=self.state_dir / "parts",
            aggregate_metrics=aggregate_metrics,
            stall_after=stall_after,
            clock=time.monotonic,
            level=level,
        )
        self.pipeline.set_input_units(frozenset())  # peers may hold some: none known yet
        self.quiet_start = QuietStart()
        self.background = Background()
        self._stopped: asyncio.Future[None] | None = None  # failed with what stops it (run)
        member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        pipeline = self.pipeline
        self.units = Units(self.topics)
        self.membership = Membership(
            pipeline, self.units, self.engine_topics.members, self.prefix, self.group_id, member
        )
        self.peers = PeerParts(pipeline, self.units, self.membership, self.http_security)
        self.dead_letters = DeadLetters(
            pipeline,
            self.units,
            self.topics.dead_letters,
            bootstrap,
            self.security,
            self.background.spawn,
        )
        self.changelog = Changelog(
            pipeline, self.engine_topics.checkpoints, self.group_id, bootstrap, self.security
        )
        self.commits = Commits(
            pipeline,
            self.units,
            self.dead_letters,
            self.membership,
            self.changelog,
            checkpoint_every,
        )
        self.finals = Finals(
            pipeline,
            self.membership,
            self.peers,
            self.dead_letters,
            bootstrap,
            self.security,
            self.engine_topics,
            output_dir,
            self.state_dir,
            self._fail,
        )
        self.eviction = Eviction(pipeline, self.finals, evict_after)
        self.decisions = Decisions(pipeline, decisions_topic(self.topics), self.group_id)
        self.consume = ConsumeLoop(
            pipeline,
            self.units,
            self.membership,
            self.dead_letters,
            self.commits,
            self.finals,
            self.eviction,
            self.decisions,
            self.background,
        )

    # -- what the HTTP endpoint asks of the processor (processors/http/server.Peers) ----------
    def identity(self) -> dict[str, str]:
        return self.membership.identity()

    async def gather(
        self, run_id: str, at_least: dict[str, int] | None = None, timeout: float = PART_TIMEOUT_S
    ) -> tuple[dict[str, PartView], dict[str, int]]:
        return await self.peers.gather(run_id, at_least, timeout)

    async def final_files(self, run_id: str) -> ProfilePaths:
        return await self.finals.final_files(run_id)

    # -- running ------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        """Stop :meth:`run` with ``exc`` (the first such error only)."""
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_exception(exc)

    async def run(self, stop: asyncio.Event, http: tuple[str, int] | None = None) -> None:
        """Process until ``stop`` is set, serving parts, snapshots and metrics on ``http``
        (host, port; default 127.0.0.1 on a free port: peers ask every processor for parts)."""
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(young_collections(_GC_YOUNG))
            stack.enter_context(self.quiet_start)
            if self._own_state:
                stack.callback(shutil.rmtree, self.state_dir, True)
            stack.callback(self.pipeline.close)
            self.membership.url = await open_endpoint(
                stack,
                self.pipeline,
                self.metrics.registry,
                self,
                self.snapshot_limits,
                self.http_security,
                http,
                self.idle_timeout,
                self.advertise,
                self.compare_rule,
            )
            await ensure_topics(self.bootstrap, self.security, self.topics, "processor")
            stack.push_async_callback(self.peers.open().close)
            secure = self.security.client_kwargs()
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, enable_idempotence=True, **secure
            )
            await start_client(producer, self.bootstrap, self.security)
            stack.push_async_callback(producer.stop)
            self.changelog.producer = producer
            finals = await self._reader(stack)
            async for record in read_finals(finals, self.engine_topics.finals, self.prefix, None):
                self.finals.read(record)  # every run already finished is known before any data
            control = reader(self.bootstrap, self.security)
            control.subscribe([self.topics.control])
            await start_client(control, self.bootstrap, self.security)
            stack.push_async_callback(control.stop)
            members = await self._reader(stack)
            # a state it must refuse stops it here, before it writes
            self.membership.heard(
                [r async for r in read_to_end(members, self.engine_topics.members)]
            )
            self.finals.claim_output_dir()
            data = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                **secure,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=8 << 20,
                partition_assignment_strategy=(RangePartitionAssignor,),
            )
            listener = Rebalance(self.consume, data, self.group_id, self.quiet_start)
            data.subscribe(list(self.units.kinds), listener=listener)
            await start_client(data, self.bootstrap, self.security)
            stack.push_async_callback(data.stop)
            stack.push_async_callback(self.membership.leave, producer)
            stack.push_async_callback(self.commits.commit)
            self.units.consumer = data
            stack.push_async_callback(self.background.cancel)  # before the clients stop
            fetched: asyncio.Queue[tuple[int, Batch]] = asyncio.Queue(maxsize=1)
            self._stopped = asyncio.get_running_loop().create_future()
            loops: list[asyncio.Future[None]] = [
                self._stopped,
                asyncio.create_task(self.consume.fetch(data, fetched)),
                asyncio.create_task(self.consume.consume(fetched, producer, stop)),
                asyncio.create_task(self.consume.control(control, producer, stop)),
                asyncio.create_task(self.finals.tail(finals, stop)),
                asyncio.create_task(self.membership.tail(members, stop)),
                asyncio.create_task(self.membership.announce(producer, stop)),
            ]
            try:
                await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for task in loops:  # a loop that failed raises here
                    if task.done():
                        task.result()
            except OSError as exc:
                if exc.filename is None:  # not a file's: a bug or the network's, as it is
                    raise
                # the state folder full or gone: state is in Kafka, a restart rebuilds it
                raise InputError(f"{exc.filename}: {exc.strerror}; stopping") from None
            finally:
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)

    async def _reader(self, stack: contextlib.AsyncExitStack) -> AIOKafkaConsumer:
        """A started reader of a whole topic outside the group, stopped with ``stack``."""
        consumer = reader(self.bootstrap, self.security)
        await start_client(consumer, self.bootstrap, self.security)
        stack.push_async_callback(consumer.stop)
        return consumer
