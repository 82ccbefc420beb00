"""``rewardstream stream``: the Kafka stream processor, sharing nothing with its peers but Kafka.

faust-streaming 0.15.3 was measured to lose a record when a restarted worker finds a backlog
(docs/development.md), so the processor is a plain aiokafka consumer feeding the engine's
:class:`rewardstream.processors.engine.pipeline.Pipeline`; its state lives in Kafka the way Kafka
Streams' and Quix Streams' does (docs/engine-on-kafka.md §Reference engines):

- **Data** (inputs and rollouts topics) is consumed in a consumer group with the range assignor,
  so partition ``p`` of both topics (the same tasks: both are keyed by task) goes to one
  processor. The data topics are the changelog: the offset committed for a partition is where
  its state can be rebuilt from (the first offset of any run still open in it, with the
  position in the commit's metadata), so a new owner, after a rebalance or a pod lost with
  its disk, replays from there. ``--state-dir`` is scratch that may vanish at any time.
- **Checkpoints** (``<prefix>.checkpoints``): from time to time a unit's open parts are
  written there and its commit names them, so a new owner holds them again in bulk and replays
  only what follows (:mod:`~rewardstream.processors.stream.changelog`); one that cannot be
  read whole is refused, and the unit replayed as above.
- **Members** (``<prefix>.members``): each processor publishes what it owns (positions, counts
  per run) and where it serves its parts; peers learn from it when a run is complete and whom
  to ask for a part. Parts travel over HTTP as versioned bytes
  (:mod:`rewardstream.processors.engine.partwire`).
- **Finals** (``<prefix>.finals`` and ``<prefix>.profiles``): the owner of ``rollout-0`` (the
  leader) merges every unit's part and writes the run's final files in one transaction
  (:mod:`rewardstream.sinks.topics.profiles`), which fences a paused-and-resumed leader; every
  processor reads the final records, retires the run, and from then on parks the run's late events.
- **Control** events are read by every processor, from the start, outside the group.

:class:`~rewardstream.processors.stream.processor.StreamProcessor` wires one collaborator per
job, as quix-streams' ``Application`` delegates to its managers (imports run down this list):

- ``consume``: the consume loop (fetch, apply slices, control events) and the rebalance listener;
- ``eviction``: the leader's eviction of runs idle for ``--evict-after``, on its timer;
- ``finals``: terminal records read and written (the transaction, fencing), the final files;
- ``commits``: committed offsets, their metadata (position, parked ranges, checkpoint), the
  commit timer;
- ``changelog``: units' checkpoints in Kafka (written, named by commits, restored, deleted);
- ``dead_letters``: rejected events parked (with the processor's producer), strays and late events
  read again;
- ``peers``: parts fetched from the other members over HTTP;
- ``membership``: this member's record, the group's records, each unit's owner;
- ``units``: data partitions as unit names, and the group consumer;
- ``endpoint`` (the HTTP face wired in), ``runtime`` (GC threshold, aiokafka's start-up log
  levels) and ``tasks`` (background tasks), used by the wiring.

Every module logs as ``rewardstream.processors.stream``.
"""

from rewardstream.processors.stream.dead_letters import DEAD_LETTER_CUT, KILL_AFTER_PARK
from rewardstream.processors.stream.peers import Unavailable
from rewardstream.processors.stream.processor import MAX_EVENT_BYTES, StreamProcessor

__all__ = [
    "DEAD_LETTER_CUT",
    "KILL_AFTER_PARK",
    "MAX_EVENT_BYTES",
    "StreamProcessor",
    "Unavailable",
]
