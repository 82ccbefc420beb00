"""``rewardstream demo``: from the bundled dataset to a live profile, with this project alone.

It starts the bundled servers (:data:`rewardstream.gym_servers.ng_run.BUNDLED_CONFIG`: the SIMULATED
policy, the arithmetic resources server, a simple agent) as child processes, collects the bundled
dataset with repeats (seeded, so the run is reproducible) and streams every event, as it
happens, into a profiler:

- by default the in-process :class:`~rewardstream.processors.engine.pipeline.Pipeline` (no broker);
- with ``--bootstrap HOST:PORT``, through Kafka: the collector publishes on the contract's topics
  and a :class:`~rewardstream.processors.stream.StreamProcessor` started here, in its own consumer
  group, writes the profile (a ``rewardstream stream`` of your own on the same topics profiles it
  too).

The output folder then holds, under NeMo Gym's names, ``rollouts.jsonl``,
``rollouts_materialized_inputs.jsonl``, the three profile files (equal, byte for byte, to what
``ng_reward_profile`` writes for those two files), ``rollouts_failures.jsonl``,
``rollouts_aggregate_metrics.json`` and ``servers.log``.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from aiokafka.errors import KafkaError

from rewardstream.contract.events import Topics
from rewardstream.contract.names import DEFAULT_TOPIC_PREFIX
from rewardstream.errors import InputError
from rewardstream.gym_servers.math_env import DATASET
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, ServerGroup, load_config
from rewardstream.infra.command import run_loop
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.local import free_port
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.inprocess import PipelineSink
from rewardstream.producers.gym.collect import CollectConfig, CollectReport, collect
from rewardstream.producers.publisher.live import KafkaSink
from rewardstream.sinks.files import ProfilePaths

__all__ = ["run_demo"]

STEM = "rollouts"

log = logging.getLogger(__name__)


async def _through_pipeline(cfg: CollectConfig, state: Path) -> tuple[CollectReport, ProfilePaths]:
    with Pipeline(state) as pipeline:
        sink = PipelineSink(pipeline)
        report = await collect(cfg, sink)
    assert sink.paths is not None  # a finished collection always closes its run
    return report, sink.paths


async def _through_kafka(
    cfg: CollectConfig,
    state: Path,
    bootstrap: str,
    topics: Topics,
    security: KafkaSecurity | None = None,
    timeout: float = 120.0,
) -> tuple[CollectReport, ProfilePaths]:
    from rewardstream.processors.stream import StreamProcessor

    sink = await KafkaSink(bootstrap, topics, security).start()  # fails first, and clearly
    group = f"rewardstream-demo-{uuid.uuid4().hex}"
    processor = StreamProcessor(bootstrap, state, topics, group, security=security)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    try:
        report = await collect(cfg, sink)
        deadline = time.monotonic() + timeout
        while (run := processor.pipeline.runs.get(report.run_id)) is None or not run.done:
            if task.done() or time.monotonic() > deadline:
                raise InputError(f"the stream processor did not finish run {report.run_id}")
            await asyncio.sleep(0.1)
        return report, processor.pipeline.paths(run)
    finally:
        stop.set()
        try:
            await task
        except (asyncio.CancelledError, KafkaError) as exc:
            log.warning("stream processor stopped with %r", exc)


async def _demo(
    output_dir: Path,
    bootstrap: str | None,
    topic_prefix: str,
    repeats: int,
    parallel: int,
    limit: int | None,
    security: KafkaSecurity | None,
) -> ProfilePaths:
    output_dir.mkdir(parents=True, exist_ok=True)
    config = load_config([f"+config_paths=[{BUNDLED_CONFIG}]", f"+head_server.port={free_port()}"])
    with (output_dir / "servers.log").open("wb") as log:
        async with ServerGroup(config, log) as servers:
            cfg = CollectConfig(
                input_jsonl_fpath=DATASET,
                output_jsonl_fpath=output_dir / f"{STEM}.jsonl",
                num_repeats=repeats,
                num_repeats_add_seed=True,
                num_samples_in_parallel=parallel,
                limit=limit,
                responses_create_params={"temperature": 1.0},
                head_server_url=servers.head_url,
            )
            with tempfile.TemporaryDirectory(prefix=".stream-", dir=output_dir) as state:
                if bootstrap is None:
                    report, made = await _through_pipeline(cfg, Path(state))
                else:
                    topics = Topics.for_prefix(topic_prefix)
                    report, made = await _through_kafka(
                        cfg, Path(state), bootstrap, topics, security
                    )
                final = ProfilePaths.next_to(report.paths.rollouts)
                for src, dst in zip(made, final, strict=True):
                    src.replace(dst)
    print(
        f"demo: {report.completed} rollouts of {report.rows} rows collected in "
        f"{report.seconds:.1f}s (run {report.run_id}, {report.failed} failed attempts)"
    )
    print(f"Rollouts: {report.paths.rollouts}")
    print(f"Fully materialized inputs: {report.paths.inputs}")
    print("\n".join(f"Profile: {p}" for p in final))
    for entry in orjson.loads(final.agent_metrics.read_bytes()):
        print(f"{entry['agent_ref']['name']}: mean reward {entry.get('mean/reward')}")
    return final


def run_demo(
    output_dir: Path,
    bootstrap: str | None = None,
    topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    repeats: int = 4,
    parallel: int = 32,
    limit: int | None = None,
    security: KafkaSecurity | None = None,
) -> ProfilePaths:
    """Run the demo into ``output_dir``; returns where the profile files are. ``security``:
    Kafka SASL/TLS settings with ``bootstrap`` (default: ``REWARDSTREAM_KAFKA_*``)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_loop(_demo(output_dir, bootstrap, topic_prefix, repeats, parallel, limit, security))
