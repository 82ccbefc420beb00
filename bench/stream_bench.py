"""Stream processor throughput: rollouts consumed and folded per second from a pre-filled topic.

    python -m bench.stream_bench [--tasks 20000] [--repeats 8] [--bootstrap HOST:PORT]

Generates a collection (bench/generate.py), writes its events to fresh topics, then starts a
:class:`processors.stream.StreamProcessor` and times it from start until the run's final
profile is written (consume + decode + dedupe + fold + final build and write). Without
``--bootstrap`` it starts its own broker from the Maven jars.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.generate import generate
from bench.measure import kafka_workspace
from processors.stream import StreamProcessor
from producers.events import input_events, rollout_events
from rewardstream.contract import RunStarted, Topics, encode


async def prefill(bootstrap: str, topics: Topics, inputs: Path, rollouts: Path, run_id: str) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20, max_request_size=8 << 20
    )
    await producer.start()
    n = 0
    try:
        topic = {"input": topics.inputs, "rollout": topics.rollouts}
        for event in [*input_events(inputs, run_id), *rollout_events(rollouts, run_id)]:
            await producer.send(topic[event.kind], event.value, key=event.key)
            n += event.kind == "input"
        started = RunStarted(run_id=run_id, expected_rollouts=n, output_stem=rollouts.stem)
        await producer.send(topics.control, encode(started), key=run_id.encode())
        await producer.flush()
    finally:
        await producer.stop()
    return n


async def measure(bootstrap: str, tasks: int, repeats: int, work: Path) -> None:
    stem = work / "r"
    generate(tasks, repeats, stem, text_bytes=2000, seed=0)
    inputs, rollouts = stem.with_name("r_materialized_inputs.jsonl"), stem.with_name("r.jsonl")
    topics = Topics.for_prefix(f"bench-{uuid.uuid4().hex[:8]}")
    t0 = time.perf_counter()
    n = await prefill(bootstrap, topics, inputs, rollouts, "run")
    fill = time.perf_counter() - t0
    print(f"pre-filled {n} inputs + {n} rollouts in {fill:.1f} s (not counted)")
    processor = StreamProcessor(bootstrap, work / "out", topics, checkpoint_every=1e9)
    stop = asyncio.Event()
    start = time.monotonic()
    task = asyncio.create_task(processor.run(stop))
    while processor.assigned_at is None:  # timed from the end of the group join
        await asyncio.sleep(0.001)
    first = processor.assigned_at
    while not ("run" in processor.pipeline.runs and processor.pipeline.runs["run"].done):
        await asyncio.sleep(0.005)
    done = time.monotonic()
    stop.set()
    await task
    print(f"start to partition assignment (group join): {first - start:.1f} s")
    print(
        f"processor: {n} rollouts (+{n} inputs) consumed, folded and final profile written "
        f"(timed from assignment) in {done - first:.1f} s = {n / (done - first):,.0f} rollouts/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--bootstrap", default=None)
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        asyncio.run(measure(bootstrap, a.tasks, a.repeats, work))


if __name__ == "__main__":
    main()
