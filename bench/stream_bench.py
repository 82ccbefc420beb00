"""Stream processor throughput from pre-filled topics, in two numbers.

    python -m bench.stream_bench [--tasks 20000] [--repeats 8] [--bootstrap HOST:PORT]
                                 [--aggregates] [--early-stop]

Generates a collection (bench/generate.py) and writes its events to fresh topics. Then:

1. **mixed**: a :class:`rewardstream.processors.stream.StreamProcessor` starts on topics holding
   every input row and every rollout, and is timed from partition assignment until the run's final
   profile is written (consume + decode + dedupe + fold + final build and write);
2. **rollouts**: the production shape, where a collection's inputs arrive before its rollouts:
   a processor on topics holding both consumes the inputs with the rollouts partition paused,
   then is timed from the first slice it folds after the resumption (the resumed fetch's own
   latency left out) until it has folded the last rollout (before the final profile; its
   write is reported on its own).

Each is reported against its **floors**, measured in the same run: a bare ``AIOKafkaConsumer``
(the processor's fetch settings, no group) reading the same topic and doing nothing with its
records, and the processor's own stages timed in process on the same event bytes (decoding a
slice, folding it), so the CPU per event splits into Kafka's share and ours.

Without ``--bootstrap`` it starts its own broker from the Maven jars. With ``--aggregates`` the
run asks for pass@k and task difficulty and its rollout events carry answers (the per-rollout
cost of the live statistics, and of their files in the final). With ``--early-stop`` the run
asks for an early stop (a band and a half-width): the processor decides after every slice and
publishes its decisions (their cost per rollout; without it, deciding is a check that no run
asked).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.generate import generate
from bench.measure import kafka_workspace
from rewardstream.contract.events import (
    EarlyStop,
    RunStarted,
    Topics,
    decode_inputs,
    decode_rollout_batch,
    decode_rollouts,
    encode,
)
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Run
from rewardstream.processors.stream import StreamProcessor
from rewardstream.producers.events import WireEvent, input_events, rollout_events
from rewardstream.sinks.topics.profiles import ensure_topics


async def prefill(bootstrap: str, topics: Topics, events: list[WireEvent]) -> None:
    await ensure_topics(bootstrap, KafkaSecurity(), topics, "publisher")  # control: one partition
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20, max_request_size=8 << 20
    )
    await producer.start()
    try:
        topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
        for event in events:
            await producer.send(topic[event.kind], event.value, key=event.key)
        await producer.flush()
    finally:
        await producer.stop()


async def consume_floor(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """Seconds and CPU seconds for a bare consumer to fetch ``n`` records of ``topic`` (the
    processor's fetch size and batch; nothing done with them): what Kafka costs a consumer."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
    )
    await consumer.start()
    try:
        partitions = await consumer._client._wait_on_metadata(topic)
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        first, cpu, seen = time.monotonic(), time.process_time(), 0
        while seen < n:
            batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
            seen += sum(map(len, batch.values()))
        return time.monotonic() - first, time.process_time() - cpu
    finally:
        await consumer.stop()


def confluent_floor(bootstrap: str, topic: str, n: int) -> tuple[float, float] | None:
    """:func:`consume_floor` with confluent-kafka's batch ``consume(num_messages=...)``
    (librdkafka fetching on its own threads; each value read once), or None when it is not
    installed (``pip install -e '.[bench]'``): the yardstick for a batch consumer."""
    try:
        from confluent_kafka import OFFSET_BEGINNING, Consumer
        from confluent_kafka import TopicPartition as Partition
    except ImportError:
        return None
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"floor-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 8 << 20,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([Partition(topic, p, OFFSET_BEGINNING) for p in partitions])
        first, cpu, seen = time.monotonic(), time.process_time(), 0
        while seen < n:
            messages = consumer.consume(num_messages=10_000, timeout=0.2)
            seen += len([m.value() for m in messages if m.error() is None])
        return time.monotonic() - first, time.process_time() - cpu
    finally:
        consumer.close()


def stage_costs(work: Path, inputs: list[bytes], rollouts: list[bytes], started: bytes) -> str:
    """CPU per event of the processor's stages, in process on the same bytes, in its slices of
    2,000: decoding (with the checks; rollouts into columns, the processor's path, and into
    events, the reference it falls back to), then the whole apply (decode, dedupe, fold, and the
    early-stop decisions after each slice, as the processor makes them after each batch) of
    the run ``started`` announces."""

    def per_event(step: Callable[[list[bytes], range], object], raws: list[bytes]) -> float:
        cpu = time.process_time()
        for start in range(0, len(raws), 2_000):
            chunk = raws[start : start + 2_000]
            step(chunk, range(start, start + len(chunk)))
        return (time.process_time() - cpu) / len(raws) * 1e6

    pipeline = Pipeline(work / "stages")
    pipeline.handle("control", started)
    costs = {
        "decode input": per_event(lambda raws, _: decode_inputs(raws), inputs),
        "apply input": per_event(lambda r, at: pipeline.apply("input", r, "input-0", at), inputs),
        "decode rollout": per_event(lambda raws, _: decode_rollout_batch(raws), rollouts),
        "(as events, the reference)": per_event(lambda raws, _: decode_rollouts(raws), rollouts),
        "apply rollout": per_event(lambda r, at: _apply_and_decide(pipeline, r, at), rollouts),
    }
    parts = [f"{stage} {cost:.1f}" for stage, cost in costs.items()]
    return "in process, us of CPU per event: " + ", ".join(parts)


def _apply_and_decide(pipeline: Pipeline, raws: list[bytes], at: range) -> None:
    pipeline.apply("rollout", raws, "rollout-0", at)
    pipeline.decide()


async def run_until(processor: StreamProcessor, done: Callable[[Run], bool]) -> tuple[float, float]:
    """Run ``processor`` until ``done(run)``: seconds from partition assignment (the end of
    the group join), and this process's CPU seconds in that time (the processor's, robust to
    other jobs on the machine)."""
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    while processor.consume.assigned_at is None:
        await asyncio.sleep(0.001)
    first, cpu = processor.consume.assigned_at, time.process_time()
    runs = processor.pipeline.runs
    while not ("run" in runs and done(runs["run"])):
        await asyncio.sleep(0.002)
    seconds, cpu = time.monotonic() - first, time.process_time() - cpu
    stop.set()
    await task
    return seconds, cpu


async def measure(
    bootstrap: str,
    tasks: int,
    repeats: int,
    work: Path,
    aggregates: bool = False,
    early_stop: bool = False,
) -> None:
    stem = work / "r"
    generate(tasks, repeats, stem, text_bytes=2000, seed=0)
    answer_key = "extracted_answer" if aggregates else None
    inputs = list(input_events(stem.with_name("r_materialized_inputs.jsonl"), "run"))
    rollouts = list(rollout_events(stem.with_name("r.jsonl"), "run", answer_key))
    started = RunStarted(
        run_id="run",
        expected_rollouts=len(inputs),
        output_stem="r",
        aggregate_metrics=aggregates,
        answer_key=answer_key,
        early_stop=EarlyStop(repeats=repeats, band=(0.25, 0.75), half_width=0.05)
        if early_stop
        else None,
    )
    control = WireEvent("control", b"run", encode(started))
    n = len(rollouts)
    raws = [e.value for e in inputs], [e.value for e in rollouts]
    print(stage_costs(work, *raws, control.value))

    topics = Topics.for_prefix(f"bench-{uuid.uuid4().hex[:8]}")
    await prefill(bootstrap, topics, [*inputs, *rollouts, control])
    mixed = StreamProcessor(bootstrap, work / "mixed", topics, checkpoint_every=1e9)
    seconds, cpu = await run_until(mixed, lambda run: run.done)
    print(
        f"mixed: {n:,} rollouts + {len(inputs):,} inputs consumed, folded, final profile "
        f"written in {seconds:.2f} s = {n / seconds:,.0f} rollouts/s "
        f"({(n + len(inputs)) / seconds:,.0f} events/s); CPU {cpu:.2f} s"
    )

    # run_started comes last here, so the run cannot complete (and be written) while the
    # rollouts are folded: the fold is timed alone, the final profile after it
    topics = Topics.for_prefix(f"bench-{uuid.uuid4().hex[:8]}")
    await prefill(bootstrap, topics, [*inputs, *rollouts])
    processor = StreamProcessor(bootstrap, work / "split", topics, checkpoint_every=1e9)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    while processor.consume.assigned_at is None:
        await asyncio.sleep(0.001)
    data = processor.units.consumer
    assert data is not None
    held = [tp for tp in data.assignment() if tp.topic == topics.rollouts]
    data.pause(*held)
    runs = processor.pipeline.runs
    while not ("run" in runs and runs["run"].inputs == len(inputs)):
        await asyncio.sleep(0.002)
    data.resume(*held)
    early = runs["run"].local_rollouts  # fetched before the pause took
    while runs["run"].local_rollouts == early:  # timed from the first fold after the resume
        await asyncio.sleep(0.0005)
    early, first, cpu = runs["run"].local_rollouts, time.monotonic(), time.process_time()
    while runs["run"].local_rollouts < n:
        await asyncio.sleep(0.002)
    seconds, cpu = time.monotonic() - first, time.process_time() - cpu
    await prefill(bootstrap, topics, [control])
    written = time.monotonic()
    while not runs["run"].done:
        await asyncio.sleep(0.002)
    final = time.monotonic() - written
    stop.set()
    await task
    folded = n - early
    floor, floor_cpu = await consume_floor(bootstrap, topics.rollouts, n)
    print(
        f"floor: a bare consumer fetches the {n:,} rollout events in {floor:.2f} s = "
        f"{n / floor:,.0f}/s (CPU {floor_cpu / n * 1e6:.1f} us per record)"
    )
    batch_floor = confluent_floor(bootstrap, topics.rollouts, n)
    if batch_floor is not None:
        wall, batch_cpu = batch_floor
        print(
            f"floor, confluent-kafka consume(num_messages=10000): {wall:.2f} s = "
            f"{n / wall:,.0f}/s (CPU {batch_cpu / n * 1e6:.1f} us per record, its threads included)"
        )
    print(
        f"rollouts: {folded:,} consumed and folded in {seconds:.2f} s = {folded / seconds:,.0f} "
        f"rollouts/s (CPU {cpu:.2f} s = {cpu / folded * 1e6:.1f} us per rollout); final "
        f"profile written {final:.2f} s later; ratio to the floor "
        f"{(n / floor) / (folded / seconds):.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--aggregates", action="store_true", help="pass@k, difficulty, answers")
    ap.add_argument("--early-stop", action="store_true", help="a band and a half-width")
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        asyncio.run(measure(bootstrap, a.tasks, a.repeats, work, a.aggregates, a.early_stop))


if __name__ == "__main__":
    main()
