"""A checkpoint read back while the group rebalances is never half used: the unit, revoked or
placed again meanwhile, is left to what the rebalance decided, and what was built for it is
deleted (real broker: the read is the processor's own, from its checkpoints topic); nor is one
written for a unit the rebalance took."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from bench.checkpoint_bench import make_changelog
from rewardstream.contract.events import Topics
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.stream import changelog as changelog_module
from rewardstream.processors.stream.changelog import Changelog, Named
from rewardstream.processors.stream.commits import Commits
from rewardstream.processors.stream.dead_letters import DeadLetters
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.units import Units
from tests.test_checkpoints import CASES, _feed, _log


async def _written(bootstrap: str, topic: str, pipeline: Pipeline, name: str) -> Named:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        writer = Changelog(pipeline, topic, "g", bootstrap, KafkaSecurity())
        writer.producer = producer
        named = await writer.write(name)
    finally:
        await producer.stop()
    assert named is not None
    return named


async def _cancelled_while_built(
    reader: Changelog, name: str, named: Named, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel ``reader``'s restore of ``name`` while its thread builds the parts (the thread
    waits for the cancellation, so that the restore cannot finish first on a loaded machine)."""
    building, cancelled, built = threading.Event(), threading.Event(), changelog_module._built

    def observed(*args: Any) -> Any:
        building.set()
        cancelled.wait(60)
        return built(*args)

    with monkeypatch.context() as patch:
        patch.setattr(changelog_module, "_built", observed)
        restore = asyncio.ensure_future(reader.restore(name, named, lambda: True))
        assert await asyncio.to_thread(building.wait, 60), "the restore never built"
        restore.cancel()
        cancelled.set()
        with pytest.raises(asyncio.CancelledError):
            await restore


def test_a_checkpoint_read_across_a_rebalance_is_not_held(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(CASES[0], 1)
    last = max(i for i, e in enumerate(log) if e[0] == "rollout")
    name, topic = "input-0", f"ckpt-{tmp_path.name[-24:]}"
    asyncio.run(make_changelog(kafka_bootstrap, topic))
    with Pipeline(tmp_path / "a") as first:
        _feed(first, log[:last] + log[last + 1 :])  # one rollout short: the run stays open
        position = first.units[name].position
        named = asyncio.run(_written(kafka_bootstrap, topic, first, name))
    control = [e for e in log if e[2] is None][:1]
    calls: list[int] = []

    def stale_after(n: int) -> Callable[[], bool]:  # the rebalance lands after n checks
        def current() -> bool:
            calls.append(1)
            return len(calls) <= n

        return current

    for checks in (0, 1):  # during the read; while the parts were built
        calls.clear()
        folder = tmp_path / f"stale{checks}"
        with Pipeline(folder) as second:
            _feed(second, control)
            second.unit(name)
            reader = Changelog(second, topic, "g", kafka_bootstrap, KafkaSecurity())
            held = asyncio.run(reader.restore(name, named, stale_after(checks)))
            assert held is False and len(calls) == checks + 1
            unit = second.units[name]
            assert not unit.parts and unit.position == 0 and not list(folder.rglob("*.spill"))
            assert name not in reader.named
            # placed again after the rebalance: replayed, not restored (a restore overtaken
            # once may be every time), and restored again the time after
            assert asyncio.run(reader.restore(name, named, lambda: True)) is False
            assert not second.units[name].parts and second.units[name].position == 0
    with Pipeline(tmp_path / "gone") as second:  # revoked before the restore began
        _feed(second, control)
        reader = Changelog(second, topic, "g", kafka_bootstrap, KafkaSecurity())
        assert asyncio.run(reader.restore(name, named, lambda: True)) is False
        assert name not in second.units
    with Pipeline(tmp_path / "cancelled") as second:  # the processor stopping mid-build
        _feed(second, control)
        second.unit(name)
        reader = Changelog(second, topic, "g", kafka_bootstrap, KafkaSecurity())
        asyncio.run(_cancelled_while_built(reader, name, named, monkeypatch))
        assert not second.units[name].parts and second.units[name].position == 0
        assert not list((tmp_path / "cancelled").rglob("*.spill"))
    with Pipeline(tmp_path / "held") as second:  # no rebalance: held again
        _feed(second, control)
        second.unit(name)
        reader = Changelog(second, topic, "g", kafka_bootstrap, KafkaSecurity())
        assert asyncio.run(reader.restore(name, named, lambda: True)) is True
        assert second.units[name].position == position and second.units[name].parts
        assert list((tmp_path / "held").rglob("*.spill"))


def test_a_checkpoint_a_failed_commit_may_have_named_is_not_deleted_before_a_newer_one(
    tmp_path: Path,
) -> None:
    """A commit that fails may still have been applied (a timeout after the broker wrote it):
    its checkpoint counts as named until a later commit names a newer one."""
    with Pipeline(tmp_path) as pipeline:
        changelog = Changelog(pipeline, "t", "g", "localhost:1", KafkaSecurity())
        c1, c2, c3 = (Named(f"id{i}", i, i, i + 1, 1, 0) for i in (1, 2, 3))
        assert changelog.committed("input-0", c1) is None
        changelog.uncertain("input-0", c2)  # the commit naming c2 failed
        assert changelog.committed("input-0", c3) == c2  # c1 left to retention, c2 deleted


def test_a_unit_revoked_while_another_units_checkpoint_is_written_is_skipped(
    tmp_path: Path,
) -> None:
    """Writing a checkpoint awaits Kafka, so a rebalance may revoke a unit due after it: the
    commit timer skips that unit, and the processor goes on (it ended on a KeyError once)."""

    class Revoking(Changelog):  # the rebalance lands while input-0's checkpoint is written
        def due(self, now: float) -> list[str]:
            return ["input-0", "input-1"]

        async def write(self, name: str) -> Named | None:
            written.append(name)
            self.pipeline.release("input-1")
            return None

    written: list[str] = []
    with Pipeline(tmp_path) as pipeline:
        pipeline.unit("input-0"), pipeline.unit("input-1")
        units = Units(Topics.for_prefix("p"))
        changelog = Revoking(pipeline, "t", "g", "localhost:1", KafkaSecurity())
        dead_letters = DeadLetters(pipeline, units, "d", "localhost:1", KafkaSecurity(), print)
        membership = Membership(pipeline, units, "c", "p", "g", "m")
        commits = Commits(pipeline, units, dead_letters, membership, changelog, 1.0)
        asyncio.run(commits.checkpoint(0.0, idle=True))
        assert written == ["input-0"] and "input-1" not in pipeline.units
