"""Where a run's live page is, for the publishers' start line: the processors' member records.

Every processor announces the URL it serves at in ``<prefix>.members`` and renews it every few
seconds while it runs, so a publisher reads that topic once, briefly, and names the page of the
freshest member (any processor shows the whole run). Finding none (no processor yet, or no
``--http``) is not an error: the line then says how to find it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse

from aiokafka.errors import KafkaError

from rewardstream.contract.engine import EngineTopics, ForeignState, MemberRecord, decode_member
from rewardstream.contract.events import Topics
from rewardstream.errors import RewardstreamError
from rewardstream.kafka.config import KafkaSecurity, start_client
from rewardstream.sinks.topics.profiles import read_to_end, reader

__all__ = ["page_line"]

FRESH = 30.0  # seconds: a member record renewed more recently than this is a live processor
LOOKUP = 3.0  # seconds the publisher spends looking at most


async def page_urls(bootstrap: str, security: KafkaSecurity, topics: Topics) -> list[str]:
    """The URLs live processors of ``topics`` serve at, the freshest first ([] when none is
    found within :data:`LOOKUP` seconds)."""
    prefix = topics.control.removesuffix(".control")
    members: dict[bytes, MemberRecord] = {}
    consumer = reader(bootstrap, security)
    try:
        async with asyncio.timeout(LOOKUP):
            await start_client(consumer, bootstrap, security)
            members_topic = EngineTopics.of(topics).members
            if members_topic not in await consumer.topics():  # asked for, aiokafka would warn
                return []
            async for record in read_to_end(consumer, members_topic):
                key = record.key or b""
                members.pop(key, None)
                if record.value is not None:
                    with contextlib.suppress(ForeignState):  # another version's: not ours
                        members[key] = decode_member(record.value, prefix)
    except (TimeoutError, KafkaError, OSError, RewardstreamError):
        pass  # none found (or no broker: the publisher's own start says so)
    finally:
        await consumer.stop()
    now = time.time()
    fresh = sorted(
        (m for m in members.values() if m.url and now - m.at < FRESH), key=lambda m: -m.at
    )
    return [m.url for m in fresh if m.url]


async def page_line(bootstrap: str, security: KafkaSecurity, topics: Topics, run_id: str) -> str:
    """The start line's second half: the run's live page, or where it will be."""
    urls = await page_urls(bootstrap, security, topics)
    if not urls:
        return "live page: no processor is serving these topics yet (any one's --http address)"
    return f"live page: {urls[0]}/runs/{urllib.parse.quote(run_id, safe='')}"
