"""Following a run's early-stop decisions on ``<prefix>.decisions``, for its collector.

The collector of a run that asked for an early stop reads what the processors of its group
decide (:mod:`rewardstream.contract.decisions`) while it collects, and skips the rows they
cover. A record it cannot read is said once and passed over: a decision only ever saves work,
so missing one costs rollouts, never a wrong result.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import msgspec
from aiokafka import TopicPartition

from rewardstream.contract.decisions import decisions_topic, decode_decision
from rewardstream.contract.events import Topics
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.processors.core.stopping import Verdict
from rewardstream.sinks.topics.profiles import ensure_topics, reader

__all__ = ["follow_decisions", "start_offset"]


async def start_offset(bootstrap: str, security: KafkaSecurity, topics: Topics) -> int:
    """The decisions topic's end now (created if missing): a new run's decisions all come
    after it, so its collector need not read what came before."""
    await ensure_topics(bootstrap, security, topics, "publisher")
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        tp = TopicPartition(decisions_topic(topics), 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def follow_decisions(
    bootstrap: str,
    security: KafkaSecurity,
    topics: Topics,
    group: str,
    run_id: str,
    start: int,
    take: Callable[[Verdict], None],
) -> None:
    """Hand every decision of ``group`` about ``run_id`` from offset ``start`` on to ``take``,
    until cancelled."""
    consumer = reader(bootstrap, security)
    await start_client(consumer, bootstrap, security)
    try:
        tp = TopicPartition(decisions_topic(topics), 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        said = False
        while True:
            for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                if record.value is None:
                    continue
                try:
                    decision = decode_decision(record.value)
                except msgspec.MsgspecError as exc:
                    if not said:
                        print(
                            f"WARNING: {tp.topic} offset {record.offset}: not a decision "
                            f"({exc}); passed over",
                            file=sys.stderr,
                        )
                        said = True
                    continue
                if decision.group == group and decision.run_id == run_id:
                    take(decision.verdict)
    finally:
        await consumer.stop()
