"""The naive faust baseline for bench/faust_naive_bench.py: one table update per rollout event.

Run by the benchmark as ``python bench/faust_naive_app.py worker`` with RS_* environment
variables; it touches ``RS_DONE`` once it has processed ``RS_EXPECTED`` events.
"""

from __future__ import annotations

import os
from pathlib import Path

import faust
import orjson

app = faust.App(
    os.environ["RS_APP_ID"],
    broker=f"kafka://{os.environ['RS_BOOTSTRAP']}",
    store="memory://",
    web_enabled=False,
    topic_partitions=1,
    stream_buffer_maxsize=131_072,
)
rollouts = app.topic(os.environ["RS_TOPIC"], key_serializer="raw", value_serializer="raw")
sums = app.Table("reward_sums", default=float, key_type=str, value_type=float, partitions=1)
counts = app.Table("reward_counts", default=int, key_type=str, value_type=int, partitions=1)
expected = int(os.environ["RS_EXPECTED"])
seen = 0


@app.agent(rollouts, concurrency=1)
async def fold(stream: faust.StreamT[bytes]) -> None:
    global seen
    async for value in stream:
        event = orjson.loads(value)
        agent = event.get("agent") or ""
        record = event["record"]
        names = record["names"]
        sums[agent] += record["values"][names.index("reward")] if "reward" in names else 0.0
        counts[agent] += 1
        seen += 1
        if seen == expected:
            Path(os.environ["RS_DONE"]).touch()


if __name__ == "__main__":
    app.main()
