"""The members topic (``<prefix>.members``): each processor's record of what it owns (positions,
counts and live summaries per run) and where it serves its parts; peers learn from it when a run
is complete and whom to ask for a part."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import KafkaError

from rewardstream.contract.engine import MemberRecord, UnitProgress, decode_member, encode_record
from rewardstream.processors.core.sequence import WIRE_ENTRIES, Ladder
from rewardstream.processors.engine.live import AgentLive
from rewardstream.processors.engine.pipeline import Pipeline, RemoteUnit
from rewardstream.processors.engine.runs import Counts
from rewardstream.processors.stream.units import Units

__all__ = ["Membership"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

_MEMBER_EVERY = 0.5  # seconds between member records while something changed
_MEMBER_RENEW = 5.0  # and at least this often
# a member record's size at most: Kafka's default message limit is 1 MiB. A record holds a
# summary (up to ~1.3 KB) and a ladder per partition, open run and agent; the ladders carry as
# many entries as fit, and past ~390 summaries the record goes without them (peers withhold
# these runs' intervals: no cut reaches past a unit they hear no ladder from)
_MEMBER_LIVE_BYTES = 512 << 10


class Membership:
    """Owns this member's record (built from the pipeline, published while something changed,
    a tombstone on leaving) and the group's records as heard: each unit's owner, and what the
    peers hold, handed to the pipeline (:meth:`Pipeline.set_remote`)."""

    def __init__(
        self, pipeline: Pipeline, units: Units, topic: str, prefix: str, group_id: str, member: str
    ) -> None:
        self.pipeline, self.units, self.topic = pipeline, units, topic
        self.prefix, self.group_id, self.member = prefix, group_id, member
        self.url: str | None = None  # where this processor serves its parts, once it does
        self.members: dict[str, MemberRecord] = {}  # the group's latest record per member
        self.owners: dict[str, MemberRecord] = {}  # unit -> the member that owns it
        self.changed = True  # something a member record says changed since the last one
        self._live_dropped = False  # a record had to go without its live summaries
        self._frontiers: dict[tuple[str, str, str], int | None] = {}  # as the last record's

    def _ladders(self) -> dict[str, dict[str, dict[str, Ladder]]]:
        """Every open run's sequences, each partition's folded once (see
        :meth:`~rewardstream.processors.engine.runs.Run.ladders`)."""
        runs = self.pipeline.runs
        return {run_id: run.ladders() for run_id, run in runs.items() if run.terminal is None}

    def identity(self) -> dict[str, str]:
        """What a part request and a part must match: parts never cross groups or prefixes."""
        return {"prefix": self.prefix, "group": self.group_id}

    def record(self) -> tuple[MemberRecord, bytes]:
        """This member's record and its bytes, within :data:`_MEMBER_LIVE_BYTES`: its ladders
        carry as many entries as fit (fewer, the cuts move up more slowly), and past that the
        record goes without its live summaries (peers then withhold these runs' intervals)."""
        now = time.monotonic()
        sharing = sum(  # every open part's figures, within one budget
            part.final is None
            for unit in self.pipeline.units.values()
            for part in unit.parts.values()
        )
        runs = self.pipeline.runs
        for run in runs.values():  # each run's cut now: entries below it are sent no more
            if run.terminal is None:
                run.whole(now, figures=False)
        ladders = self._ladders()
        self._frontiers = _frontiers(ladders)
        held = {
            name: {run_id: part for run_id, part in unit.parts.items() if part.final is None}
            for name, unit in self.pipeline.units.items()
        }
        live = {
            name: {
                run_id: runs[run_id].summary(name, now, True, sharing, ladders.get(run_id, {}))
                for run_id in parts
            }
            for name, parts in held.items()
        }

        def build(entries: int | None) -> MemberRecord:
            units = {
                name: UnitProgress(
                    position=self.pipeline.units[name].position,
                    runs={r: (p.inputs, p.rollouts, p.duplicates) for r, p in parts.items()},
                    live={}
                    if entries is None
                    else {
                        run_id: {agent: s.to_wire(entries) for agent, s in agents.items()}
                        for run_id, agents in live[name].items()
                    },
                )
                for name, parts in held.items()
            }
            data = self.units.consumer
            generation = data._coordinator.generation if data is not None else -1
            return MemberRecord(
                prefix=self.prefix,
                group=self.group_id,
                member=self.member,
                generation=generation,
                url=self.url,
                units=units,
                at=time.time(),
            )

        entries: int | None = WIRE_ENTRIES
        record = build(entries)
        raw = encode_record(record)
        if len(raw) > _MEMBER_LIVE_BYTES:  # as many entries as fit, from one with one each
            least = encode_record(build(1))
            sent = sum(
                min(len(ladder.keys), WIRE_ENTRIES)
                for units in ladders.values()
                for agents in units.values()
                for ladder in agents.values()
            )
            per = (len(raw) - len(least)) / max(sent, 1)  # bytes per entry above the first
            room = _MEMBER_LIVE_BYTES - len(least)
            entries = None if room < 0 else 1 + int(room / per / max(len(self._frontiers), 1))
            record = build(entries)
            raw = encode_record(record)
            if len(raw) > _MEMBER_LIVE_BYTES:  # the estimate was off: no summaries
                entries = None
                record = build(entries)
                raw = encode_record(record)
        if entries is None and not self._live_dropped:
            log.warning(
                "member record of %d parts' summaries above %d bytes: they are left out (peers "
                "show only their own share of these runs)",
                sum(len(agents) for runs_ in live.values() for agents in runs_.values()),
                _MEMBER_LIVE_BYTES,
            )
        self._live_dropped = self._live_dropped or entries is None
        return record, raw

    @staticmethod
    def _ladder_list(ladders: dict[str, dict[str, dict[str, Ladder]]]) -> list[Ladder]:
        return [
            ld for units in ladders.values() for agents in units.values() for ld in agents.values()
        ]

    async def announce(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        """Publish this member's record while something changed (and now and then anyway)."""
        last = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if (
                self.changed
                or now - last >= _MEMBER_RENEW
                or _frontiers(self._ladders()) != self._frontiers  # e.g. all rows known now
            ):
                self.changed = False
                record, raw = self.record()
                await producer.send(self.topic, raw, key=self.member.encode())
                self.members[self.member] = record
                last = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _MEMBER_EVERY)

    async def leave(self, producer: AIOKafkaProducer) -> None:
        """A tombstone for this member's record: peers stop asking it for parts."""
        if self.member in self.members:  # it announced itself
            with contextlib.suppress(KafkaError):
                await producer.send_and_wait(self.topic, None, key=self.member.encode())

    async def tail(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            self.heard([record for records in batch.values() for record in records])

    def heard(self, records: list[ConsumerRecord]) -> None:
        """Member records of this group (raises :class:`ForeignState` on one to refuse)."""
        for record in records:
            member = (record.key or b"").decode()
            if record.value is None:
                self.members.pop(member, None)
                continue
            decoded = decode_member(record.value, self.prefix)
            if decoded.group == self.group_id:
                self.members[member] = decoded
        if records:
            self._update_owners()

    def _update_owners(self) -> None:
        """Each unit's owner: the member that claims it in the newest generation (a member
        paused past its session timeout still claims its old units, in an older one)."""
        owners: dict[str, MemberRecord] = {}
        for record in self.members.values():
            for name in record.units:
                held = owners.get(name)
                if held is None or (record.generation, record.at) > (held.generation, held.at):
                    owners[name] = record
        self.owners = owners
        if (inputs := self.units.inputs()) is not None:  # e.g. before this one is assigned
            self.pipeline.set_input_units(inputs)
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


def _frontiers(
    ladders: dict[str, dict[str, dict[str, Ladder]]],
) -> dict[tuple[str, str, str], int | None]:
    """Per (run, unit, agent), its sequence's frontier: one that moved without an event of a
    data unit (a run_started making every row known, a failure for good) is news to peers."""
    return {
        (run_id, unit, agent): ladder.frontier
        for run_id, units in ladders.items()
        for unit, agents in units.items()
        for agent, ladder in agents.items()
    }
