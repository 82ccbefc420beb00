"""``rewardstream stream``: the Kafka stream processor, sharing nothing with its peers but Kafka.

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(docs/development.md), so the processor is a plain aiokafka consumer feeding the engine's
:class:`rewardstream.processors.engine.pipeline.Pipeline`; its state lives in Kafka the way Kafka
Streams' and Quix Streams' does (docs/engine-on-kafka.md §Reference engines):

- **Data** (inputs and rollouts topics) is consumed in a consumer group with the range assignor,
  so partition ``p`` of both topics (the same tasks: both are keyed by task) goes to one
  processor. The data topics are the changelog: the offset committed for a partition is where
  its state can be rebuilt from (the first offset of any run still open in it, with the
  position in the commit's metadata), so a new owner, after a rebalance or a pod lost with
  its disk, replays from there. ``--state-dir`` is scratch that may vanish at any time.
- **Members** (``<prefix>.members``): each processor publishes what it owns (positions, counts
  per run) and where it serves its parts; peers learn from it when a run is complete and whom
  to ask for a part. Parts travel over HTTP as versioned bytes
  (:mod:`rewardstream.processors.engine.partwire`).
- **Finals** (``<prefix>.finals`` and ``<prefix>.profiles``): the owner of ``rollout-0`` (the
  leader) merges every unit's part and writes the run's final files in one transaction
  (:mod:`rewardstream.sinks.topics.profiles`), which fences a paused-and-resumed leader; every
  processor reads the final records, retires the run, and from then on parks the run's late events.
- **Control** events are read by every processor, from the start, outside the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, KafkaError, MessageSizeTooLargeError

from rewardstream.contract.engine import (
    EngineTopics,
    FinalRecord,
    MemberRecord,
    UnitFinal,
    UnitProgress,
    decode_member,
    encode_record,
)
from rewardstream.contract.events import EventKind, Topics, content_hex, content_sum
from rewardstream.errors import InputError, KafkaUnreachable, RewardstreamError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.engine.live import AgentLive, final_agents, final_figures, of_state
from rewardstream.processors.engine.partwire import PART_LIST_TYPE, ReceivedPart, decode_answer
from rewardstream.processors.engine.pipeline import (
    STALL_AFTER,
    Late,
    Pipeline,
    Rejected,
    RemoteUnit,
    Stray,
    log_level,
)
from rewardstream.processors.engine.runs import Counts, Done, PartCounts, PartView, Run, merge_parts
from rewardstream.processors.http.server import IDLE_TIMEOUT, make_app, serve
from rewardstream.processors.http.snapshot import SnapshotLimits
from rewardstream.sinks.files import ProfilePaths, write_files, write_final
from rewardstream.sinks.metrics import Metrics
from rewardstream.sinks.topics.profiles import (
    ensure_topics,
    fetch_profile,
    finals_of,
    publish_final,
    read_finals,
    read_to_end,
    reader,
)

__all__ = ["MAX_EVENT_BYTES", "StreamProcessor"]

log = logging.getLogger(__name__)

_MEMBER_EVERY = 0.5  # seconds between member records while something changed
_MEMBER_RENEW = 5.0  # and at least this often
# above this a member record goes without its live summaries: Kafka's default message limit is
# 1 MiB, and a record is ~0.5 KB per partition, open run and agent
_MEMBER_LIVE_BYTES = 512 << 10
_BATCH = 10_000  # records per fetched batch
_SLICE = 2_000  # records applied between two chances for the fetcher to run
_GC_YOUNG = 50_000  # allocations between young collections while processing (CPython: 700)
_PART_TIMEOUT_S = 120.0  # a peer's answer to a part request, when nothing tighter is asked
_PART_TIMEOUT = aiohttp.ClientTimeout(total=_PART_TIMEOUT_S, sock_connect=5)
# offset ranges of ``unknown-key`` dead letters a commit's metadata keeps at most (Kafka's
# offset.metadata.max.bytes is 4096 by default); beyond, the oldest may be parked again
_PARKED_RANGES = 100
MAX_EVENT_BYTES = 1 << 20  # larger events are dead letters ("oversized"), never parsed
DEAD_LETTER_CUT = 64 << 10  # what is kept of a dead letter too large to park whole
COMMIT_FORMAT = 1  # version of the JSON in a committed offset's metadata
KILL_AFTER_PARK = "REWARDSTREAM_TEST_KILL_AFTER_PARK"  # test hook (see _park_strays)

Batch = dict[TopicPartition, list[ConsumerRecord]]

# glibc keeps freed heap pages resident (a final profile's build frees hundreds of MB, in
# pieces): malloc_trim hands them back once a run is retired. None where libc has no such call.
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)


class Unavailable(RewardstreamError):
    """A unit's part cannot be had right now (no owner yet, owner unreachable or behind)."""


class StreamProcessor:
    """Consume inputs, rollouts and control events; finish each run exactly once."""

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
    ) -> None:
        self.bootstrap = bootstrap
        self.http_security = http_security or HttpSecurity()  # its endpoint's, and for peers
        if advertise is not None:
            self.http_security.check_advertised(advertise)
        self.http_security.check_peers()
        self.security = security or KafkaSecurity.from_env()  # SASL/TLS for every client
        self.topics = topics or Topics.for_prefix()
        self.prefix = self.topics.control.removesuffix(".control")
        self.engine_topics = EngineTopics.of(self.topics)
        self.group_id = group_id or f"{self.prefix}-profiler"
        self.output_dir = output_dir
        self._own_state = state_dir is None  # a fresh temporary folder, removed at the end
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="rewardstream-state-"))
        self.member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.advertise = advertise
        self.url: str | None = None  # where this processor serves its parts, once it does
        self.evict_after = evict_after
        self.snapshot_limits, self.idle_timeout = snapshot_limits, idle_timeout
        self.metrics = Metrics(lambda: self.pipeline.runs, self.lag, clock=time.monotonic)
        self.pipeline = Pipeline(
            output_dir or self.state_dir / "finals",
            metrics=self.metrics,
            max_event_bytes=max_event_bytes,
            state_dir=self.state_dir / "parts",
            aggregate_metrics=aggregate_metrics,
            stall_after=stall_after,
            clock=time.monotonic,
        )
        self._rejected: list[tuple[Rejected, str]] = []  # with "topic:partition:offset"
        self._parking = 0  # dead letters sent but not yet acknowledged
        self._quiet_start = _QuietStart()
        self._data: AIOKafkaConsumer | None = None
        self._kinds: dict[str, EventKind] = {
            self.topics.inputs: "input",
            self.topics.rollouts: "rollout",
        }
        self.consumed = 0
        self._generation = 0  # assignments so far: batches fetched under an older one are stale
        self.assigned_at: float | None = None  # time.monotonic() of the last partition assignment
        self.checkpoint_every = checkpoint_every
        self._members: dict[str, MemberRecord] = {}  # the group's latest record per member
        self._live_dropped = False  # a record had to go without its live summaries
        self._owners: dict[str, MemberRecord] = {}  # unit -> the member that owns it
        self._moved: set[str] = set()  # units consumed since their last commit
        self._unplaced: set[str] = set()  # new units whose committed offset is not read yet
        self._floor: dict[str, int] = {}  # unit -> the position its last owner committed
        self._late = 0  # units being read again for late events to park: no commit meanwhile
        self._finishing: set[str] = set()  # runs whose final is being written
        self._changed = True  # something a member record says changed since the last one
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # finals being written
        self._stopped: asyncio.Future[None] | None = None  # failed with what stops it (run)

    def unit_name(self, tp: TopicPartition) -> str:
        return f"{self._kinds[tp.topic]}-{tp.partition}"

    # -- running ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, http: tuple[str, int] | None = None) -> None:
        """Process until ``stop`` is set, serving parts, snapshots and metrics on ``http``
        (host, port; default 127.0.0.1 on a free port: peers ask every processor for parts)."""
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(_young_collections(_GC_YOUNG))
            stack.enter_context(self._quiet_start)
            if self._own_state:
                stack.callback(shutil.rmtree, self.state_dir, True)
            stack.callback(self.pipeline.close)
            secured = self.http_security
            limits = self.snapshot_limits
            app = make_app(self.pipeline, self.metrics.registry, self, limits, security=secured)
            host, port = http or ("127.0.0.1", 0)
            runner, bound = await serve(app, host, port, self.idle_timeout, security=secured)
            stack.push_async_callback(runner.cleanup)
            shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
            scheme = secured.scheme
            self.url = self.advertise or f"{scheme}://{_url_host(shown)}:{bound}"
            log.info(
                "serving snapshots, parts and metrics on %s://%s:%d", scheme, _url_host(host), bound
            )
            await ensure_topics(self.bootstrap, self.security, self.topics, "processor")
            self._session = self._peer_session()
            stack.push_async_callback(self._session.close)
            secure = self.security.client_kwargs()
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, enable_idempotence=True, **secure
            )
            await start_client(producer, self.bootstrap, self.security)
            stack.push_async_callback(producer.stop)
            finals = reader(self.bootstrap, self.security)
            await start_client(finals, self.bootstrap, self.security)
            stack.push_async_callback(finals.stop)
            async for record in read_finals(finals, self.engine_topics.finals, self.prefix, None):
                self._final(record)  # every run already finished is known before any data
            control = reader(self.bootstrap, self.security)
            control.subscribe([self.topics.control])
            await start_client(control, self.bootstrap, self.security)
            stack.push_async_callback(control.stop)
            members = reader(self.bootstrap, self.security)
            await start_client(members, self.bootstrap, self.security)
            stack.push_async_callback(members.stop)
            # a state it must refuse stops it here, before it writes
            self._heard([r async for r in read_to_end(members, self.engine_topics.members)])
            self._claim_output_dir()
            data = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                **secure,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=8 << 20,
                partition_assignment_strategy=(RangePartitionAssignor,),
            )
            data.subscribe(list(self._kinds), listener=_Rebalance(self, data))
            await start_client(data, self.bootstrap, self.security)
            stack.push_async_callback(data.stop)
            stack.push_async_callback(self._leave, producer)
            stack.push_async_callback(self.commit)
            self._data = data
            stack.push_async_callback(self._cancel_tasks)  # finals in flight: before the clients
            fetched: asyncio.Queue[tuple[int, Batch]] = asyncio.Queue(maxsize=1)
            self._stopped = asyncio.get_running_loop().create_future()
            loops: list[asyncio.Future[None]] = [
                self._stopped,
                asyncio.create_task(self._fetch(data, fetched)),
                asyncio.create_task(self._consume(fetched, producer, stop)),
                asyncio.create_task(self._control(control, producer, stop)),
                asyncio.create_task(self._tail_finals(finals, stop)),
                asyncio.create_task(self._tail_members(members, stop)),
                asyncio.create_task(self._announce(producer, stop)),
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

    async def _cancel_tasks(self) -> None:
        """Stop the finals being written (another leader writes them) and wait for them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _claim_output_dir(self) -> None:
        """``--output-dir`` mirrors one group's finals: a folder another group or prefix
        writes to would mix two profilers' files under one run id, so it is refused."""
        if self.output_dir is None:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        claim = self.output_dir / ".rewardstream-owner.json"
        mine = self.identity()
        # written whole, then linked into place: a peer starting beside this one reads the
        # claim complete or not at all (never an empty file between create and write)
        draft = claim.with_name(f".{claim.name}.{self.member}")
        draft.write_bytes(orjson.dumps(mine))
        try:
            with contextlib.suppress(FileExistsError):
                os.link(draft, claim)
        finally:
            draft.unlink(missing_ok=True)
        try:
            theirs = orjson.loads(claim.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise InputError(
                f"--output-dir {self.output_dir}: unreadable {claim.name}: {exc}"
            ) from None
        if theirs != mine:
            raise InputError(
                f"--output-dir {self.output_dir} holds the final profiles of group "
                f"{theirs.get('group')!r} (topic prefix {theirs.get('prefix')!r}); this processor "
                f"is group {self.group_id!r} (prefix {self.prefix!r}): give it another folder"
            )

    def lag(self) -> dict[str, int]:
        """Messages between this processor's position and the log end, per partition."""
        consumer = self._data
        if consumer is None:
            return {}
        out = {}
        for tp in consumer.assignment():
            end, unit = consumer.highwater(tp), self.pipeline.units.get(self.unit_name(tp))
            if end is not None and unit is not None:
                out[f"{tp.topic}:{tp.partition}"] = max(0, end - unit.position)
        return out

    # -- offsets ------------------------------------------------------------------------------
    async def commit(self, names: set[str] | None = None, force: bool = False) -> bool | None:
        """Commit, for each owned unit consumed since its last commit (``force``: each named
        one that has a position), where its state can be rebuilt from; not while rejected
        events wait to be parked (a restart must meet them again): then None. False when the
        group coordinator refused it: this processor lost its partitions meanwhile (a zombie,
        paused past its session timeout), and nothing of it is rolled back."""
        consumer = self._data
        if (
            consumer is None
            or self._rejected
            or self._parking
            or self._late
            or self.pipeline.strays
        ):
            return None
        if force and names is not None:
            todo = {
                n for n in names if n in self.pipeline.units and self.pipeline.units[n].position
            }
        else:
            todo = self._moved if names is None else self._moved & names
        units, floor = self.pipeline.units, self._floor  # see _place: never below the group's
        todo = {
            n
            for n in todo
            if n in units and n not in self._unplaced and units[n].position >= floor.get(n, 0)
        }
        offsets = {}
        for name in todo:
            unit, start = self.pipeline.units[name], self.pipeline.replay_start(name)
            meta: dict[str, Any] = {"v": COMMIT_FORMAT, "position": unit.position}
            unit.parked = {o for o in unit.parked if o >= start}  # a replay reads no other
            if unit.parked:
                meta["parked"] = _ranges(unit.parked, name)
            offsets[self._tp(name)] = (start, orjson.dumps(meta).decode())
        if not offsets:
            return None
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("offsets not committed (%s): the group has moved on", exc)
            return False
        self._moved -= todo
        return True

    def _tp(self, name: str) -> TopicPartition:
        kind, _, partition = name.rpartition("-")
        topic = self.topics.inputs if kind == "input" else self.topics.rollouts
        return TopicPartition(topic, int(partition))

    # -- dead letters -------------------------------------------------------------------------
    def _take_rejected(self, topic: str, partition: int) -> None:
        """The events the engine rejected, handed from ``topic``'s ``partition``: each to be
        parked, named by its ``topic:partition:offset``."""
        for rejected in self.pipeline.take_rejected():
            at = rejected.offset
            source = f"{topic}:{partition}:{at}" if at is not None else ""
            log.log(
                log_level(rejected.reason),
                "dead letter from %s (%s event, %s): %s",
                source,
                rejected.kind,
                rejected.reason,
                rejected.detail,
            )
            self._rejected.append((rejected, source))

    async def _dead_letters(self, producer: AIOKafkaProducer) -> None:
        """Park rejected events, original bytes and reason, before their offsets are saved.

        An event too large for the producer or the dead-letter topic is parked as its first
        :data:`DEAD_LETTER_CUT` bytes, with its full length in a ``size`` header. A failure to
        park raises: the offsets are not saved, so a restarted processor parks them again.
        """
        rejected, self._rejected = self._rejected, []
        self._parking += len(rejected)  # until delivered: no commit may cover them
        sent = []
        for event, at in rejected:
            try:
                delivery = await self._park(producer, event, at, whole=True)
            except MessageSizeTooLargeError:  # above the producer's max_request_size
                delivery = await self._park(producer, event, at, whole=False)
            sent.append((event, at, delivery))
        for event, at, delivery in sent:
            try:
                await delivery
            except MessageSizeTooLargeError:  # above the topic's max.message.bytes
                await (await self._park(producer, event, at, whole=False))
        self._parking -= len(rejected)

    async def _park(
        self, producer: AIOKafkaProducer, event: Rejected, at: str, whole: bool
    ) -> asyncio.Future[object]:
        """Send one dead letter (cut short unless ``whole``); returns its delivery. Its key is
        its ``source`` (``topic:partition:offset``, empty for none): dead letters are at least
        once (a crash before the commit that covers them parks them again), and a copy has
        the same key, in the same partition, so readers count each source once (a compacted
        dead-letter topic keeps one)."""
        headers = [
            ("reason", event.reason.encode()),
            ("kind", event.kind.encode()),
            ("source", at.encode()),
            ("detail", event.detail.encode()),
        ]
        value = event.raw
        if not whole and len(value) > DEAD_LETTER_CUT:
            value = value[:DEAD_LETTER_CUT]
            headers.append(("size", b"%d" % len(event.raw)))
        delivery: asyncio.Future[object] = await producer.send(
            self.topics.dead_letters, value, key=at.encode() or None, headers=headers
        )
        return delivery

    # -- partitions ---------------------------------------------------------------------------
    def data_partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Every partition of the inputs and rollouts topics, as far as ``consumer`` knows."""
        return [
            TopicPartition(topic, p)
            for topic in self._kinds
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]

    def all_units(self) -> set[str] | None:
        """Every data unit's name; None while the topics' metadata is not known yet."""
        consumer = self._data
        if consumer is None or any(consumer.partitions_for_topic(t) is None for t in self._kinds):
            return None
        return {self.unit_name(tp) for tp in self.data_partitions(consumer)}

    async def _end_offsets(self) -> dict[str, int] | None:
        """The log end offset of every data partition, by unit name; None while the consumer
        has no metadata for a data topic yet (just after a start): a partial answer would let
        a finished run end before the other partitions' data is consumed."""
        if self.all_units() is None:
            return None
        assert self._data is not None
        ends = await self._data.end_offsets(self.data_partitions(self._data))
        return {self.unit_name(tp): end for tp, end in ends.items()}

    # -- members ------------------------------------------------------------------------------
    def _record(self) -> MemberRecord:
        units = {}
        now = time.monotonic()
        sharing = sum(  # every open part's figures, within one budget
            part.final is None
            for unit in self.pipeline.units.values()
            for part in unit.parts.values()
        )
        for name, unit in self.pipeline.units.items():
            held = {run_id: part for run_id, part in unit.parts.items() if part.final is None}
            units[name] = UnitProgress(
                position=unit.position,
                runs={
                    run_id: (part.inputs, part.rollouts, part.duplicates)
                    for run_id, part in held.items()
                },
                live={
                    run_id: {
                        agent: s.to_wire() for agent, s in part.summary(now, True, sharing).items()
                    }
                    for run_id, part in held.items()
                },
            )
        generation = self._data._coordinator.generation if self._data is not None else -1
        return MemberRecord(
            prefix=self.prefix,
            group=self.group_id,
            member=self.member,
            generation=generation,
            url=self.url,
            units=units,
            at=time.time(),
        )

    async def _announce(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        """Publish this member's record while something changed (and now and then anyway)."""
        last = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if self._changed or now - last >= _MEMBER_RENEW:
                self._changed = False
                record = self._record()
                raw = encode_record(record)
                if len(raw) > _MEMBER_LIVE_BYTES:  # many runs and agents: counts only
                    if not self._live_dropped:
                        log.warning(
                            "member record of %d bytes: its live summaries are left out (peers "
                            "show only their own share of these runs)",
                            len(raw),
                        )
                    self._live_dropped = True
                    bare = {n: u.model_copy(update={"live": {}}) for n, u in record.units.items()}
                    record = record.model_copy(update={"units": bare})
                    raw = encode_record(record)
                await producer.send(self.engine_topics.members, raw, key=self.member.encode())
                self._members[self.member] = record
                last = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _MEMBER_EVERY)

    async def _leave(self, producer: AIOKafkaProducer) -> None:
        """A tombstone for this member's record: peers stop asking it for parts."""
        if self.member in self._members:  # it announced itself
            with contextlib.suppress(KafkaError):
                await producer.send_and_wait(
                    self.engine_topics.members, None, key=self.member.encode()
                )

    async def _tail_members(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            self._heard([record for records in batch.values() for record in records])

    def _heard(self, records: list[ConsumerRecord]) -> None:
        """Member records of this group (raises :class:`ForeignState` on one to refuse)."""
        for record in records:
            member = (record.key or b"").decode()
            if record.value is None:
                self._members.pop(member, None)
                continue
            decoded = decode_member(record.value, self.prefix)
            if decoded.group == self.group_id:
                self._members[member] = decoded
        if records:
            self._update_owners()

    def _update_owners(self) -> None:
        """Each unit's owner: the member that claims it in the newest generation (a member
        paused past its session timeout still claims its old units, in an older one)."""
        owners: dict[str, MemberRecord] = {}
        for record in self._members.values():
            for name in record.units:
                held = owners.get(name)
                if held is None or (record.generation, record.at) > (held.generation, held.at):
                    owners[name] = record
        self._owners = owners
        self.pipeline.set_remote(
            {
                name: RemoteUnit(
                    record.units[name].position,
                    {r: Counts(*c) for r, c in record.units[name].runs.items()},
                    {
                        r: {agent: AgentLive.from_wire(p) for agent, p in agents.items()}
                        for r, agents in record.units[name].live.items()
                    },
                )
                for name, record in owners.items()
                if record.member != self.member and name not in self.pipeline.units
            }
        )

    # -- parts --------------------------------------------------------------------------------
    def identity(self) -> dict[str, str]:
        """What a part request and a part must match: parts never cross groups or prefixes."""
        return {"prefix": self.prefix, "group": self.group_id}

    async def gather(
        self, run_id: str, at_least: dict[str, int] | None = None, timeout: float = _PART_TIMEOUT_S
    ) -> tuple[dict[str, PartView], dict[str, int]]:
        """The run's parts of every unit not owned here, from their owners, with the offset each
        covers; raises :class:`Unavailable` when a unit has no reachable owner, one that does
        not answer within ``timeout`` seconds (a frozen peer), or one behind ``at_least`` (a
        finished run's ends)."""
        every = self.all_units()
        if every is None:
            raise Unavailable("the data topics' partitions are not known yet")
        missing = every - set(self.pipeline.units)
        by_url: dict[str, set[str]] = {}
        for name in sorted(missing):
            owner = self._owners.get(name)
            if owner is None or owner.member == self.member or owner.url is None:
                raise Unavailable(f"partition {name} has no owner serving parts right now")
            by_url.setdefault(owner.url, set()).add(name)
        answers = await asyncio.gather(
            *(asyncio.wait_for(self._fetch_parts(url, run_id), timeout) for url in by_url),
            return_exceptions=True,
        )
        parts: dict[str, PartView] = {}
        offsets: dict[str, int] = {}
        for (url, names), answer in zip(by_url.items(), answers, strict=True):
            if isinstance(answer, TimeoutError):
                raise Unavailable(
                    f"partitions {', '.join(sorted(names))}: their owner {url} did not answer "
                    f"within {timeout:g} s"
                )
            if isinstance(answer, BaseException):
                raise Unavailable(f"cannot get parts from {url}: {answer}") from None
            positions, received = answer
            for name in names:
                if name not in positions:
                    raise Unavailable(f"{url} no longer owns partition {name}")
                offsets[name] = positions[name]
            parts |= {n: p for n, p in received.items() if n in names}
        for name, end in (at_least or {}).items():
            if offsets.get(name, end) < end:
                raise Unavailable(f"partition {name} is consumed to {offsets[name]} of {end}")
        return parts, offsets

    def _peer_session(self) -> aiohttp.ClientSession:
        """The session parts are fetched with: the token, and peers' certificates checked."""
        return aiohttp.ClientSession(
            timeout=_PART_TIMEOUT,
            headers=self.http_security.headers(),
            connector=aiohttp.TCPConnector(ssl=self.http_security.client_context()),
        )

    async def _fetch_parts(
        self, url: str, run_id: str
    ) -> tuple[dict[str, int], dict[str, ReceivedPart]]:
        assert self._session is not None
        if refused := self.http_security.refuses_peer(url):  # member records can be forged
            raise Unavailable(refused)
        name = self.http_security.peer_name if url.startswith("https://") else None
        async with self._session.get(
            f"{url}/parts/{run_id}",
            params=self.identity(),
            server_hostname=name,
            allow_redirects=False,  # the token never follows a redirect elsewhere
        ) as response:
            body = await response.read()
            if response.status != 200 or response.content_type != PART_LIST_TYPE:
                raise Unavailable(f"HTTP {response.status}: {body[:200].decode(errors='replace')}")
        return decode_answer(body, {**self.identity(), "run_id": run_id})

    # -- finishing runs -----------------------------------------------------------------------
    def _final(self, record: FinalRecord) -> None:
        """A terminal record read from the finals topic (this group's only)."""
        if record.group != self.group_id:
            return
        done = Done(
            record.inputs,
            record.rollouts,
            {
                n: PartCounts(u.inputs, u.rollouts, u.duplicates, u.tasks)
                for n, u in record.units.items()
            },
            {n: u.cut for n, u in record.units.items()},
            record.stem,
            record.state == "evicted",
            final_agents(record),
        )
        run = self.pipeline.runs.get(record.run_id)
        if run is None or run.terminal is None:
            log.info("run %s: %s record read", record.run_id, record.state)
        held = run is not None and bool(run.parts)
        for late in self.pipeline.mark_final(record.run_id, done):
            self._late += 1  # until parked: no commit may move past these events
            task = asyncio.create_task(self._park_late(late))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if held and _malloc_trim is not None:
            _malloc_trim(0)
        self._changed = True

    async def _read_again(
        self, unit: str, start: int, end: int, pick: Callable[[ConsumerRecord], None]
    ) -> None:
        """Read a unit's records in offsets [``start``, ``end``) again, handing each to ``pick``;
        what the engine rejects meanwhile is parked as from there."""
        tp = self._tp(unit)
        consumer = reader(self.bootstrap, self.security)
        try:
            await start_client(consumer, self.bootstrap, self.security)
            consumer.assign([tp])
            consumer.seek(tp, start)
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                    if record.offset >= end:
                        break
                    pick(record)
                    self._take_rejected(record.topic, record.partition)
        finally:
            await consumer.stop()

    async def _park_strays(self, producer: AIOKafkaProducer) -> None:
        """Park the rollouts the engine found foreign (``unknown-key``), read again by offset,
        then commit their units at once: the commit's metadata keeps their offsets
        (:attr:`~rewardstream.processors.engine.runs.Unit.parked`), so a replay parks none again.

        A crash between the dead letters' acknowledgement and that commit (or more parked
        ranges than a commit keeps) parks one again on replay: a copy, recognisable as such,
        for a dead letter is keyed by its ``source`` (see :meth:`_park`). The environment
        variable :data:`KILL_AFTER_PARK`, set, makes the processor SIGKILL itself in that
        window: a test hook, nothing else reads it."""
        strays, self.pipeline.strays = self.pipeline.strays, []
        by_unit: dict[str, dict[int, Stray]] = {}
        for stray in strays:
            by_unit.setdefault(stray.unit, {})[stray.offset] = stray
        self._late += 1  # no commit until they are parked
        try:
            for unit, found in by_unit.items():
                pick = functools.partial(self._stray_at, found)
                await self._read_again(unit, min(found), max(found) + 1, pick)
            await self._dead_letters(producer)
        finally:
            self._late -= 1
        if os.environ.get(KILL_AFTER_PARK):  # test hook: a crash in the window (see above)
            os.kill(os.getpid(), signal.SIGKILL)
        await self.commit(set(by_unit), force=True)

    def _stray_at(self, found: dict[int, Stray], record: ConsumerRecord) -> None:
        stray = found.get(record.offset)
        if stray is not None:
            self.pipeline.reject_stray(stray, record.value or b"")

    async def _park_late(self, late: Late) -> None:
        """Read a unit again from the final's cut to where it was, and reject every event of
        the run found there: they came too late for the final, and none is dropped silently."""
        kind, found = self._kinds[self._tp(late.unit).topic], 0

        def pick(record: ConsumerRecord) -> None:
            nonlocal found
            if _run_of(record.value or b"") == late.run_id:
                self.pipeline.reject_late(kind, record.value or b"", late.run_id, record.offset)
                found += 1

        try:
            await self._read_again(late.unit, late.cut, late.position, pick)
        finally:
            self._late -= 1
        log.warning(
            "run %s: %d events in %s [%d, %d) came after its final profile; parked (%d expected)",
            late.run_id,
            found,
            late.unit,
            late.cut,
            late.position,
            late.events,
        )

    async def _tail_finals(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for final in finals_of(records, self.prefix, self.group_id):
                    self._final(final)

    async def _maybe_finish(self, run: Run) -> None:
        """Write the run's final profile, if this processor leads and the run is ready; on
        anything not ready yet (a peer's part), try again with the next batch."""
        if (
            not self.pipeline.leader
            or run.run_id in self._finishing
            or not self.pipeline.ready(run)
        ):
            return
        self._finishing.add(run.run_id)
        try:
            await self._finish(run)
        except Unavailable as exc:
            log.info("run %s: final profile waits: %s", run.run_id, exc)
        except KafkaUnreachable as exc:  # the broker away mid-run: tried again on the next pass
            log.warning("run %s: final profile waits for Kafka: %s", run.run_id, exc)
        except KafkaError as exc:  # e.g. fenced: a newer leader finishes the run
            log.warning("run %s: final profile not written here: %r", run.run_id, exc)
        except InputError as exc:  # its files cannot be written (the state folder full): stop
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_exception(InputError(f"run {run.run_id}: {exc}; stopping"))
        finally:
            self._finishing.discard(run.run_id)

    def _terminal_record(self, run: Run, **fields: Any) -> FinalRecord:
        """A terminal record (``fields``: its state, stem, counts, units) of ``run``, written
        by this member of this group and prefix, now."""
        return FinalRecord(
            prefix=self.prefix,
            group=self.group_id,
            run_id=run.run_id,
            expected=run.expected,
            written_by=self.member,
            at=time.time(),
            **fields,
        )

    async def _finish(self, run: Run) -> None:
        received, offsets = await self.gather(run.run_id, run.finish_at)
        if run.terminal is not None:
            return
        parts: dict[str, PartView] = {**received, **run.parts}
        cuts = {**offsets, **{n: u.position for n, u in self.pipeline.units.items()}}
        partial = not run.complete
        merged = merge_parts((parts[n] for n in sorted(parts)), known_only=True)
        if not partial and merged.state.num_results != run.expected:
            raise Unavailable(f"{merged.state.num_results} of {run.expected} rollouts gathered")
        folder = self.state_dir / "finals" / run.run_id
        stem = run.started.output_stem if run.started else "rollouts"
        paths = ProfilePaths.next_to(folder / f"{stem}.jsonl")
        aggregates = self.pipeline.aggregates(run)
        run.failed(write_final(run.run_id, merged, paths, partial, run.expected, aggregates))
        files = [*paths, *(paths.extras() if aggregates is not None else [])]
        if run.error is not None:  # say so, keep serving
            return
        agents = of_state(merged.state)  # exact, for every processor's page once done
        del merged
        counts = Pipeline.counts_by_unit(parts)
        record = self._terminal_record(
            run,
            state="final",
            stem=stem,
            partial=partial,
            content=content_hex(content_sum(p.content for p in parts.values())),
            conflicts=sum(p.conflicts for p in parts.values()),
            **final_figures(agents),
            inputs=sum(c.inputs for c in counts.values()),
            rollouts=sum(c.rollouts for c in counts.values()),
            units={
                n: UnitFinal(
                    inputs=c.inputs,
                    rollouts=c.rollouts,
                    duplicates=c.duplicates,
                    tasks=c.tasks,
                    cut=cuts.get(n, 0),
                )
                for n, c in counts.items()
            },
        )
        standing = await publish_final(
            self.bootstrap, self.security, self.engine_topics, record, files
        )
        if standing.written_by == self.member:
            self._mirror(run.run_id, files)
            log.info("run %s: final profile written (%d rollouts)", run.run_id, standing.rollouts)
        self._final(standing)
        shutil.rmtree(folder, ignore_errors=True)

    def _mirror(self, run_id: str, files: list[Path]) -> None:
        """The final files in ``--output-dir`` too (atomically), where users look for them."""
        if self.output_dir is None:
            return
        target = self.output_dir / run_id
        try:
            target.mkdir(parents=True, exist_ok=True)
            write_files([(target / p.name, _blocks(p)) for p in files])
        except (RewardstreamError, OSError) as exc:  # a mirror: never worth stopping for
            log.error(
                "run %s: the final profile is in Kafka but not in %s: %s",
                run_id,
                self.output_dir,
                exc,
            )

    async def final_files(self, run_id: str) -> ProfilePaths:
        """A done run's final files on this host: the mirror, or fetched from Kafka."""
        run = self.pipeline.runs[run_id]
        assert run.terminal is not None
        if self.output_dir is not None:
            mirror = self.pipeline.paths(run)
            if all(p.exists() for p in mirror):
                return mirror
        folder = self.state_dir / "fetched" / run_id
        return await fetch_profile(
            self.bootstrap,
            self.security,
            self.engine_topics,
            self.prefix,
            self.group_id,
            run_id,
            folder,
            timeout=30,
        )

    async def _evict_idle(self) -> None:
        """Evict runs that never finish (no event for ``evict_after`` seconds): a terminal
        record, so every processor drops them and parks their later events."""
        if not self.pipeline.leader:
            return
        for run in self.pipeline.idle_runs(self.evict_after):
            if run.run_id in self._finishing:
                continue
            log.warning(
                "run %s: no event for %.0fs, evicting it unfinished (%d rollouts held)",
                run.run_id,
                self.evict_after,
                run.rollouts,
            )
            record = self._terminal_record(
                run,
                state="evicted",
                stem=run.started.output_stem if run.started else "rollouts",
                partial=True,
                inputs=run.inputs,
                rollouts=run.rollouts,
                units={
                    n: UnitFinal(inputs=0, rollouts=0, duplicates=0, tasks=0, cut=p)
                    for n, p in self.pipeline.positions().items()
                },
            )
            self._finishing.add(run.run_id)
            try:
                self._final(
                    await publish_final(
                        self.bootstrap, self.security, self.engine_topics, record, []
                    )
                )
            except KafkaError as exc:
                log.warning("run %s: not evicted here: %r", run.run_id, exc)
            finally:
                self._finishing.discard(run.run_id)

    # -- consuming ----------------------------------------------------------------------------
    async def _control(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            if not batch:
                continue
            ends = await self._end_offsets()  # fetched after the records: covers what preceded
            for records in batch.values():
                for record in records:
                    value, at, stamp = record.value or b"", record.offset, record.timestamp
                    run = self.pipeline.handle("control", value, offset=at, timestamp=stamp)
                    self._take_rejected(record.topic, record.partition)
                    if run is not None and run.finished and not run.finish_at:
                        run.finish_at = ends
            if self._rejected:
                await self._dead_letters(producer)

    async def _fetch(
        self, consumer: AIOKafkaConsumer, out: asyncio.Queue[tuple[int, Batch]]
    ) -> None:
        """Fetch the next batch while the current one is applied (the queue holds one), tagged
        with the assignment generation it was fetched in."""
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=_BATCH)
            await out.put((self._generation, batch))

    async def _consume(
        self,
        fetched: asyncio.Queue[tuple[int, Batch]],
        producer: AIOKafkaProducer,
        stop: asyncio.Event,
    ) -> None:
        last_commit = last_evict = time.monotonic()
        while not stop.is_set():
            generation, batch = await fetched.get()
            if generation != self._generation:  # fetched before a rebalance: positions moved
                continue
            if self._unplaced:
                await self._place()
            for tp, records in batch.items():
                await self._apply(tp, records, generation)
            if self.pipeline.strays:
                await self._park_strays(producer)
            if self._rejected:
                await self._dead_letters(producer)
            for run in list(self.pipeline.runs.values()):
                if run.terminal is not None:
                    continue
                if run.finished and run.finish_at is None:  # ends unknown when it was read
                    run.finish_at = await self._end_offsets()
                if self.pipeline.ready(run) and run.run_id not in self._finishing:
                    task = asyncio.create_task(self._maybe_finish(run))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            now = time.monotonic()
            if not batch or now - last_commit >= self.checkpoint_every:
                await self.commit()
                last_commit = now
            if now - last_evict >= 1.0:
                await self._evict_idle()
                last_evict = now

    async def _place(self) -> None:
        """A new unit is consumed from its committed offset: everything before it belongs to
        runs that are closed, so that is its position until a record moves it (a partition
        with no new record must not look unconsumed to a finished run's end offsets). The
        position its last owner had reached (the commit's metadata) is its *floor*: until the
        replay gets there, the unit commits nothing, so the group's position never goes back."""
        consumer = self._data
        assert consumer is not None
        names = [n for n in self._unplaced if n in self.pipeline.units]
        self._unplaced.clear()
        coordinator = consumer._coordinator
        committed = await coordinator.fetch_committed_offsets([self._tp(n) for n in names])
        for name in names:
            unit, got = self.pipeline.units.get(name), committed.get(self._tp(name))
            if unit is None or got is None or got.offset < 0:
                continue
            self._floor[name] = _committed_position(got.metadata, got.offset)
            unit.parked |= _committed_parked(got.metadata)
            if got.offset > unit.position:
                unit.position = got.offset
                self._changed = True

    async def _apply(
        self, tp: TopicPartition, records: list[ConsumerRecord], generation: int
    ) -> None:
        """Apply one partition's records, a slice at a time: between slices the fetcher (and a
        rebalance) may run. After a rebalance (``generation`` moved) the rest is stale: the
        unit may be gone, or be a new one to rebuild from its committed offset, which records
        from the middle of the log must not reach."""
        name, kind = self.unit_name(tp), self._kinds[tp.topic]
        for start in range(0, len(records), _SLICE):
            unit = self.pipeline.units.get(name)
            if unit is None or generation != self._generation:
                return
            part = records[start : start + _SLICE]
            raws, offsets = [r.value or b"" for r in part], [r.offset for r in part]
            self.pipeline.apply(kind, raws, name, offsets, [r.timestamp for r in part])
            self._take_rejected(tp.topic, tp.partition)
            self.consumed += len(part)
            unit.position = part[-1].offset + 1
            self._moved.add(name)
            self._changed = True
            await asyncio.sleep(0)


def _committed_position(metadata: str, offset: int) -> int:
    """The position in a commit's metadata (see :meth:`StreamProcessor.commit`); the offset
    itself for a commit without one (another tool's)."""
    try:
        meta = orjson.loads(metadata or "{}")
    except orjson.JSONDecodeError:
        return offset
    position = meta.get("position") if isinstance(meta, dict) else None
    return position if type(position) is int and position >= offset else offset


def _committed_parked(metadata: str) -> set[int]:
    """The offsets of ``unknown-key`` dead letters in a commit's metadata (see
    :meth:`StreamProcessor.commit`): ``[[first, last], ...]`` ranges."""
    try:
        meta = orjson.loads(metadata or "{}")
    except orjson.JSONDecodeError:
        return set()
    ranges = meta.get("parked") if isinstance(meta, dict) else None
    if not isinstance(ranges, list):
        return set()
    return {
        o
        for r in ranges
        if isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
        for o in range(r[0], min(r[1], r[0] + (1 << 20)) + 1)
    }


def _ranges(offsets: set[int], unit: str) -> list[list[int]]:
    """Offsets as ``[first, last]`` ranges, the last :data:`_PARKED_RANGES` of them."""
    ranges: list[list[int]] = []
    for offset in sorted(offsets):
        if ranges and ranges[-1][1] == offset - 1:
            ranges[-1][1] = offset
        else:
            ranges.append([offset, offset])
    if len(ranges) > _PARKED_RANGES:
        log.warning(
            "%s: %d ranges of unknown-key dead letters, more than a commit keeps: those before "
            "offset %d may be parked again after a restart",
            unit,
            len(ranges),
            ranges[-_PARKED_RANGES][0],
        )
    return ranges[-_PARKED_RANGES:]


def _blocks(path: Path) -> Iterator[bytes]:
    """A file's bytes a MiB at a time (a final profile can be hundreds of MiB)."""
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(1 << 20), b"")


def _run_of(raw: bytes) -> str | None:
    """An event's run id, or None when it has none (such an event was rejected already)."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    run_id = event.get("run_id") if isinstance(event, dict) else None
    return run_id if isinstance(run_id, str) else None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def _young_collections(threshold: int) -> Iterator[None]:
    """Collect the youngest generation every ``threshold`` allocations instead of 700.

    A fetched batch keeps ~10 objects per record alive while it is applied (aiokafka's
    records, decoded events); with CPython's default they survive young collections and drive
    full ones, which scan the whole heap (docs/history/benchmarks.md: raising the threshold
    was one of the changes that took a rollout's processor CPU from 9.6-15 us to 5.2-6.6 us).
    Cycles are still collected, just later.
    """
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class _QuietStart(logging.Filter):
    """aiokafka logs ERROR for what every healthy start goes through: topics the broker
    creates on first use (``Topic ... not found in cluster metadata``), a topic just created
    whose leader is still being elected (``NotLeaderForPartitionError`` when fetching its
    offsets) and a new group's coordinator still loading (``GroupCoordinatorNotAvailableError``).
    Until the first assignment (``started``) those lines are INFO; after it they are errors
    again. A context manager that filters aiokafka's loggers while it is entered."""

    _LOGGERS = (
        "aiokafka.cluster",
        "aiokafka.consumer.group_coordinator",
        "aiokafka.consumer.fetcher",
    )
    _EXPECTED = (
        "not found in cluster metadata",
        "CoordinatorNotAvailable",
        "NotLeaderForPartition",
    )

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.started and record.levelno == logging.ERROR:
            text = record.getMessage()
            if any(expected in text for expected in self._EXPECTED):
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = f"{text} (as expected while starting)", ()
        return True

    def __enter__(self) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).addFilter(self)

    def __exit__(self, *_: object) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).removeFilter(self)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Units follow their partitions: committed when revoked; kept when assigned back (their
    state is a fold of the log up to their position, whoever held them meanwhile), rebuilt
    from the committed offset when new."""

    def __init__(self, processor: StreamProcessor, consumer: AIOKafkaConsumer) -> None:
        self.processor, self.consumer = processor, consumer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        processor = self.processor
        processor._generation += 1
        names = {processor.unit_name(tp) for tp in revoked}
        if await processor.commit(names, force=True) is False:
            # fenced: others may have consumed these partitions meanwhile, so this state of
            # them is stale; whatever comes back is rebuilt from what the group committed
            log.warning(
                "lost partitions %s while stopped past the session timeout: their state here "
                "is dropped and rebuilt from Kafka if they come back",
                sorted(names),
            )
            for name in names:
                processor.pipeline.release(name)
                processor._moved.discard(name)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        processor, pipeline = self.processor, self.processor.pipeline
        processor.assigned_at = time.monotonic()
        processor._generation += 1
        owned = {processor.unit_name(tp) for tp in assigned}
        for name in set(pipeline.units) - owned:
            pipeline.release(name)
            processor._moved.discard(name)
        for tp in assigned:
            unit = pipeline.units.get(processor.unit_name(tp))
            if unit is not None and unit.position:
                self.consumer.seek(tp, unit.position)  # kept: go on from where it is
            else:
                pipeline.unit(processor.unit_name(tp))  # new: from the committed offset
                processor._unplaced.add(processor.unit_name(tp))
        pipeline.leader = "rollout-0" in owned  # whoever owns every unit owns it too
        processor._changed = True
        if not owned:
            counts = (len(self.consumer.partitions_for_topic(t) or ()) for t in processor._kinds)
            log.warning(
                "this processor owns no partition: group %s has more members than the data "
                "topics have partitions (%d); it serves snapshots but folds nothing",
                processor.group_id,
                max(counts),
            )
        log.info("assigned %s; leader=%s", sorted(owned), pipeline.leader)
        processor._quiet_start.started = True
