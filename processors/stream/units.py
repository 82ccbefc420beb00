"""The data topics as the engine's units: partition ``p`` of the inputs topic is ``input-p``, of
the rollouts topic ``rollout-p``; one group consumer reads them."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition

from rewardstream.contract.events import EventKind, Topics

__all__ = ["Units"]


class Units:
    """Owns the mapping between data partitions and unit names, and the group consumer that
    reads them (:attr:`consumer`, once started): which units there are and where their logs
    end. Every collaborator names a partition through it."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.kinds: dict[str, EventKind] = {topics.inputs: "input", topics.rollouts: "rollout"}
        self.consumer: AIOKafkaConsumer | None = None  # the data consumer, once started

    def name(self, tp: TopicPartition) -> str:
        return f"{self.kinds[tp.topic]}-{tp.partition}"

    def tp(self, name: str) -> TopicPartition:
        kind, _, partition = name.rpartition("-")
        topic = self.topics.inputs if kind == "input" else self.topics.rollouts
        return TopicPartition(topic, int(partition))

    def partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Every partition of the inputs and rollouts topics, as far as ``consumer`` knows."""
        return [
            TopicPartition(topic, p)
            for topic in self.kinds
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]

    def every(self) -> set[str] | None:
        """Every data unit's name; None while the topics' metadata is not known yet."""
        consumer = self.consumer
        if consumer is None or any(consumer.partitions_for_topic(t) is None for t in self.kinds):
            return None
        return {self.name(tp) for tp in self.partitions(consumer)}

    def inputs(self) -> frozenset[str] | None:
        """Every input unit's name; None while the topics' metadata is not known yet."""
        every = self.every()
        return None if every is None else frozenset(n for n in every if n.startswith("input-"))

    async def ends(self) -> dict[str, int] | None:
        """The log end offset of every data partition, by unit name; None while the consumer
        has no metadata for a data topic yet (just after a start): a partial answer would let
        a finished run end before the other partitions' data is consumed."""
        if self.every() is None:
            return None
        assert self.consumer is not None
        ends = await self.consumer.end_offsets(self.partitions(self.consumer))
        return {self.name(tp): end for tp, end in ends.items()}
