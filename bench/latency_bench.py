"""Publish-to-visible latency at a steady rate: how long until a rollout is in the live profile.

    python -m bench.latency_bench [--rate 10000] [--seconds 20] [--bootstrap HOST:PORT]

A paced producer sends rollout events (stamped with their send time, as the publisher does) at
``--rate`` per second, once an in-process :class:`StreamProcessor` has joined its group (one
warm-up rollout of another run creates the topic first); the processor consumes them. Its
``rewardstream_publish_to_visible_seconds`` histogram is read at the end and its quantiles are
reported as bucket upper bounds (Prometheus' own resolution). Without ``--bootstrap`` it starts
its own broker from the Maven jars.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.measure import kafka_workspace
from rewardstream.contract.events import Topics, encode_rollout, task_key
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.stream import StreamProcessor


def quantiles(processor: StreamProcessor, qs: tuple[float, ...]) -> dict[float, float]:
    text = generate_latest(processor.metrics.registry).decode()
    buckets = [
        (float(s.labels["le"]), s.value)
        for f in text_string_to_metric_families(text)
        if f.name == "rewardstream_publish_to_visible_seconds"
        for s in f.samples
        if s.name.endswith("_bucket")
    ]
    total = buckets[-1][1]
    return {q: next(le for le, n in buckets if n >= q * total) for q in qs}


async def run(bootstrap: str, rate: int, seconds: float, work: Path) -> None:
    topics = Topics.for_prefix(f"lat-{uuid.uuid4().hex[:8]}")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    await producer.start()
    result = {"reward": 1.0, "response": {"usage": {"input_tokens": 10, "output_tokens": 20}}}

    async def send(i: int, run: str = "run") -> None:
        task, rollout = divmod(i, 8)
        record = extract_result(result, task, rollout)
        value = encode_rollout(run, task, rollout, "a", record, time.time())
        await producer.send(topics.rollouts, value, key=task_key(task))

    # steady state: the topic exists and the processor has joined its group before the paced
    # sending starts (a rollout sent during the join would wait for it: ~0.5-3 s, not latency)
    await send(0, "warm-up")  # creates the topic
    await producer.flush()
    processor = StreamProcessor(bootstrap, work, topics)
    stop = asyncio.Event()
    consumer = asyncio.create_task(processor.run(stop))
    while processor.consume.assigned_at is None:
        await asyncio.sleep(0.01)
    sent, start, tick = 0, time.perf_counter(), 0.01
    try:
        while (elapsed := time.perf_counter() - start) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                await send(sent)
                sent += 1
            await asyncio.sleep(tick)
        await producer.flush()
        while (
            processor.pipeline.runs.get("run") is None
            or processor.pipeline.runs["run"].rollouts < sent
        ):
            await asyncio.sleep(0.05)
    finally:
        await producer.stop()
        stop.set()
        await consumer
    q = quantiles(processor, (0.5, 0.9, 0.99))
    achieved = sent / seconds
    print(
        f"sent {sent} rollouts at {achieved:,.0f}/s; publish-to-visible p50 <= {q[0.5]} s, "
        f"p90 <= {q[0.9]} s, p99 <= {q[0.99]} s (histogram bucket bounds)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--bootstrap", default=None)
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        asyncio.run(run(bootstrap, a.rate, a.seconds, work))


if __name__ == "__main__":
    main()
