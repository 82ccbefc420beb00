"""Reading topics back from the start, as tests check what was published."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from rewardstream.contract.events import ControlEvent, Topics, decode_control


async def read_all(
    bootstrap: str, topic: str, partitions: int, timeout: float = 30.0
) -> list[ConsumerRecord]:
    """Every record up to each partition's current end, partition by partition."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                assert time.monotonic() < deadline, f"stuck reading {tp}"
                for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                    records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def control_events(bootstrap: str, topics: Topics) -> list[ControlEvent]:
    return [decode_control(r.value) for r in await read_all(bootstrap, topics.control, 1)]
