"""Early-stop decisions (``<prefix>.decisions``): what the engine decided after a batch
(:meth:`~rewardstream.processors.engine.pipeline.Pipeline.decide`), published for the run's
collector (:mod:`rewardstream.contract.decisions`)."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rewardstream.contract.decisions import encode_decision
from rewardstream.processors.engine.pipeline import Pipeline

__all__ = ["Decisions"]

log = logging.getLogger(__package__)  # the processor's one logger: its lines keep their name


class Decisions:
    """Publishes the engine's new decisions, keyed by run id, in the order they were made.
    One that Kafka refuses is logged and not sent again: a decision only saves rollouts, so
    a lost one costs rollouts, never a wrong profile."""

    def __init__(self, pipeline: Pipeline, topic: str, group_id: str) -> None:
        self.pipeline, self.topic, self.group_id = pipeline, topic, group_id

    async def publish(self, producer: AIOKafkaProducer) -> None:
        if not self.pipeline.stops:  # no open run asked for an early stop
            return
        made = self.pipeline.decide()
        if not made:
            return
        sent = [
            await producer.send(
                self.topic, encode_decision(self.group_id, run_id, v), key=run_id.encode()
            )
            for run_id, v in made
        ]
        for (run_id, verdict), outcome in zip(
            made, await asyncio.gather(*sent, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, KafkaError):
                log.warning("run %s: decision %s not published: %r", run_id, verdict, outcome)
            else:
                log.info("run %s: decided %s", run_id, verdict)
