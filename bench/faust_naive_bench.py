"""Side by side: a naive faust agent (a table update per event) vs our stream processor.

    python -m bench.faust_naive_bench [--rollouts 200000] [--bootstrap HOST:PORT]

Pre-fills a topic with rollout events, then runs ``bench/faust_naive_app.py`` as a real
``faust worker`` and times it from its ``Ready`` log line until it has folded every event
(into two changelog-backed tables: count and reward sum per agent). The same events are then
consumed by :class:`rewardstream.processors.stream.StreamProcessor` (dedupe, full extraction, exact
per-value storage), timed from the end of its group join (its partitions assigned) until all
are folded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.measure import kafka_workspace
from rewardstream.contract.events import Topics, encode_rollout, task_key
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.stream import StreamProcessor

HERE = Path(__file__).resolve().parent


async def prefill(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        usage = {"input_tokens": 150, "output_tokens": 900, "total_tokens": 1050}
        for i in range(n):
            task, rollout = divmod(i, 8)
            result = {
                "reward": float(i % 3 == 0),
                "response": {"usage": usage},
                "is_correct": i % 3 == 0,
            }
            record = extract_result(result, task, rollout)
            value = encode_rollout("run", task, rollout, f"agent{task % 3}", record, time.time())
            await producer.send(topic, value, key=task_key(task))
        await producer.flush()
    finally:
        await producer.stop()


def run_faust(bootstrap: str, topic: str, n: int, work: Path) -> float:
    done, log = work / "done", work / "faust.log"
    env = {
        **os.environ,
        "RS_APP_ID": f"naive-{uuid.uuid4().hex[:8]}",
        "RS_BOOTSTRAP": bootstrap,
        "RS_TOPIC": topic,
        "RS_EXPECTED": str(n),
        "RS_DONE": str(done),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "faust_naive_app.py"), "worker", "-l", "info"],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    try:
        while b"[^Worker]: Ready" not in log.read_bytes():
            if proc.poll() is not None:
                raise SystemExit(f"faust worker exited:\n{log.read_text()[-3000:]}")
            time.sleep(0.01)
        ready = time.perf_counter()
        while not done.exists():
            if proc.poll() is not None:
                raise SystemExit(f"faust worker exited:\n{log.read_text()[-3000:]}")
            time.sleep(0.01)
        return time.perf_counter() - ready
    finally:
        proc.terminate()
        proc.wait(60)


async def run_ours(bootstrap: str, topics: Topics, n: int, work: Path) -> float:
    processor = StreamProcessor(bootstrap, work / "ours", topics, checkpoint_every=1e9)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    while processor.consume.assigned_at is None:  # timed from the end of the group join
        await asyncio.sleep(0.001)
    first = processor.consume.assigned_at
    while (run := processor.pipeline.runs.get("run")) is None or run.rollouts < n:
        await asyncio.sleep(0.005)
    elapsed = time.monotonic() - first
    stop.set()
    await task
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=200_000)
    ap.add_argument("--bootstrap", default=None)
    a = ap.parse_args()
    with kafka_workspace(a.bootstrap) as (bootstrap, work):
        topics = Topics.for_prefix(f"naive-{uuid.uuid4().hex[:8]}")
        asyncio.run(prefill(bootstrap, topics.rollouts, a.rollouts))
        faust_s = run_faust(bootstrap, topics.rollouts, a.rollouts, work)
        ours_s = asyncio.run(run_ours(bootstrap, topics, a.rollouts, work))
    n = a.rollouts
    print(
        f"naive faust agent (table update per event): {n} in {faust_s:.1f} s = {n / faust_s:,.0f}/s"
    )
    print(
        f"rewardstream processor (exact profile state): {n} in {ours_s:.1f} s = {n / ours_s:,.0f}/s"
    )


if __name__ == "__main__":
    main()
