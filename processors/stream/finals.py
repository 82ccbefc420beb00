"""Finals (``<prefix>.finals`` and ``<prefix>.profiles``): the owner of ``rollout-0`` (the leader)
merges every unit's part and writes the run's final files with its terminal record in one
transaction (:mod:`rewardstream.sinks.topics.profiles`), whose transactional id fences a
paused-and-resumed leader; every processor reads the terminal records, retires the run, and
from then on parks the run's late events."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from rewardstream.contract.engine import EngineTopics, FinalRecord, UnitFinal
from rewardstream.contract.events import content_hex, content_sum
from rewardstream.errors import InputError, KafkaUnreachable, RewardstreamError
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.engine.live import final_agents, final_figures, of_state
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Done, PartCounts, PartView, Run, merge_parts
from rewardstream.processors.stream.dead_letters import DeadLetters
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.peers import PeerParts, Unavailable
from rewardstream.sinks.files import ProfilePaths, write_files, write_final
from rewardstream.sinks.topics.profiles import fetch_profile, finals_of, publish_final

__all__ = ["Finals"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name

# glibc keeps freed heap pages resident (a final profile's build frees hundreds of MB, in
# pieces): malloc_trim hands them back once a run is retired. None where libc has no such call.
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)


class Finals:
    """Owns the runs' terminal records: reading them (every processor: the run retires, late
    events go to the dead letters), writing them (the leader: a run's final once it is ready,
    an eviction), the runs being finished, and the final files on this host (``--output-dir``,
    claimed by one group and prefix, or fetched from Kafka)."""

    def __init__(
        self,
        pipeline: Pipeline,
        membership: Membership,
        peers: PeerParts,
        dead_letters: DeadLetters,
        bootstrap: str,
        security: KafkaSecurity,
        topics: EngineTopics,
        output_dir: Path | None,
        state_dir: Path,
        fail: Callable[[BaseException], None],
    ) -> None:
        self.pipeline, self.membership = pipeline, membership
        self.peers, self.dead_letters = peers, dead_letters
        self.bootstrap, self.security, self.topics = bootstrap, security, topics
        self.output_dir, self.state_dir = output_dir, state_dir
        self.fail = fail  # stops the processor with this error
        self.prefix, self.group_id = membership.prefix, membership.group_id
        self.finishing: set[str] = set()  # runs whose final is being written
        self.held: dict[str, FinalRecord] = {}  # our own records the tail read meanwhile

    def read(self, record: FinalRecord) -> None:
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
            record.skipped,
        )
        run = self.pipeline.runs.get(record.run_id)
        if run is None or run.terminal is None:
            log.info("run %s: %s record read", record.run_id, record.state)
        held = run is not None and bool(run.parts)
        for late in self.pipeline.mark_final(record.run_id, done):
            self.dead_letters.park_late(late)
        if held and _malloc_trim is not None:
            _malloc_trim(0)
        self.membership.changed = True

    async def tail(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Read the terminal records as they come. One this member is still writing is held
        for its writer (:meth:`_finish`, :meth:`evict`), which reads it once the files are in
        ``--output-dir`` (a run is never done here before they are), or, if it stops short,
        reads the held copy (:meth:`_done_writing`)."""
        me = self.membership.member
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for final in finals_of(records, self.prefix, self.group_id):
                    if final.written_by == me and final.run_id in self.finishing:
                        self.held[final.run_id] = final
                    else:
                        self.read(final)

    def _done_writing(self, run: Run) -> None:
        """The writer of ``run``'s record is through: a record the tail held for it is read
        now if the writer did not read one (it failed after the record was committed)."""
        self.finishing.discard(run.run_id)
        held = self.held.pop(run.run_id, None)
        if held is not None and run.terminal is None:
            self.read(held)

    async def evict(self, run: Run) -> None:
        """Write the run's ``evicted`` record: every processor drops the run and parks its later
        events. Not here when Kafka refuses it (a newer leader evicts it)."""
        record = self.terminal_record(
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
        self.finishing.add(run.run_id)
        try:
            self.read(await publish_final(self.bootstrap, self.security, self.topics, record, []))
        except KafkaError as exc:
            log.warning("run %s: not evicted here: %r", run.run_id, exc)
        finally:
            self._done_writing(run)

    async def maybe_finish(self, run: Run) -> None:
        """Write the run's final profile, if this processor leads and the run is ready; on
        anything not ready yet (a peer's part), try again with the next batch."""
        if not self.pipeline.leader or run.run_id in self.finishing or not self.pipeline.ready(run):
            return
        self.finishing.add(run.run_id)
        try:
            await self._finish(run)
        except Unavailable as exc:
            log.info("run %s: final profile waits: %s", run.run_id, exc)
        except KafkaUnreachable as exc:  # the broker away mid-run: tried again on the next pass
            log.warning("run %s: final profile waits for Kafka: %s", run.run_id, exc)
        except KafkaError as exc:  # e.g. fenced: a newer leader finishes the run
            log.warning("run %s: final profile not written here: %r", run.run_id, exc)
        except InputError as exc:  # its files cannot be written (the state folder full): stop
            self.fail(InputError(f"run {run.run_id}: {exc}; stopping"))
        finally:
            self._done_writing(run)

    def terminal_record(self, run: Run, **fields: Any) -> FinalRecord:
        """A terminal record (``fields``: its state, stem, counts, units) of ``run``, written
        by this member of this group and prefix, now."""
        return FinalRecord(
            prefix=self.prefix,
            group=self.group_id,
            run_id=run.run_id,
            expected=run.expected,
            written_by=self.membership.member,
            at=time.time(),
            **fields,
        )

    async def _finish(self, run: Run) -> None:
        received, offsets = await self.peers.gather(run.run_id, run.finish_at)
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
        agents = of_state(
            merged.state, run.repeat_major
        )  # exact: every processor shows it once done
        del merged
        counts = Pipeline.counts_by_unit(parts)
        record = self.terminal_record(
            run,
            state="final",
            stem=stem,
            partial=partial,
            content=content_hex(content_sum(p.content for p in parts.values())),
            conflicts=sum(p.conflicts for p in parts.values()),
            skipped=run.skipped,
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
        standing = await publish_final(self.bootstrap, self.security, self.topics, record, files)
        if standing.written_by == self.membership.member:
            self._mirror(run.run_id, files)
            log.info("run %s: final profile written (%d rollouts)", run.run_id, standing.rollouts)
        self.read(standing)
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
            self.topics,
            self.prefix,
            self.group_id,
            run_id,
            folder,
            timeout=30,
        )

    def claim_output_dir(self) -> None:
        """``--output-dir`` mirrors one group's finals: a folder another group or prefix
        writes to would mix two profilers' files under one run id, so it is refused."""
        if self.output_dir is None:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        claim = self.output_dir / ".rewardstream-owner.json"
        mine = self.membership.identity()
        # written whole, then linked into place: a peer starting beside this one reads the
        # claim complete or not at all (never an empty file between create and write)
        draft = claim.with_name(f".{claim.name}.{self.membership.member}")
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


def _blocks(path: Path) -> Iterator[bytes]:
    """A file's bytes a MiB at a time (a final profile can be hundreds of MiB)."""
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(1 << 20), b"")
