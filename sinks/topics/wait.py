"""Waiting for a streamed run's final profile, for the producers that ended the run.

``rewardstream publish --wait-profile`` and ``ng_collect_rollouts +kafka_wait_profile=true``
write the processors' final files next to the rollouts file, where ``ng_reward_profile`` would
put them: a NeMo Gym user finds the same files in the same place, already computed. Only the
three profile files go there: a ``S_aggregate_metrics.json`` beside them is the collector's
(from the agents), never replaced; ``rewardstream profiles get`` fetches the run's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from rewardstream.contract.engine import EngineTopics, FinalRecord
from rewardstream.contract.events import Topics
from rewardstream.contract.names import default_group
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.sinks.files import ProfilePaths
from rewardstream.sinks.topics.content import FilesContent, refuse
from rewardstream.sinks.topics.profiles import ensure_topics, fetch_profile

__all__ = ["wait_profile"]


async def wait_profile(
    bootstrap: str,
    topics: Topics,
    group: str | None,
    run_id: str,
    out: Path,
    timeout: float,
    security: KafkaSecurity | None = None,
    extras: bool = False,
    of: tuple[FilesContent, str, str] | None = None,
    seen: Callable[[FinalRecord], None] | None = None,
) -> ProfilePaths:
    """The run's final profile, written into ``out`` (group default: ``<prefix>-profiler``);
    its aggregate and difficulty files too with ``extras``. ``of``: (content, what, flag):
    the final must be the profile of the files ``what`` names, of that content
    (:func:`rewardstream.sinks.topics.content.files_content`), else it is refused, nothing
    written (:class:`~rewardstream.sinks.topics.content.Conflict`, saying to pass ``flag``);
    ``seen`` is handed the final record before its files are written."""
    prefix = topics.control.removesuffix(".control")
    security = security or KafkaSecurity.from_env()
    await ensure_topics(bootstrap, security, topics)  # else it may wait on the wrong partition
    accept = seen
    if of is not None:
        content, what, flag = of
        refused = functools.partial(refuse, content=content, what=what, flag=flag)
        accept = refused if seen is None else _both(seen, refused)
    return await fetch_profile(
        bootstrap,
        security,
        EngineTopics.of(topics),
        prefix,
        group or default_group(prefix),
        run_id,
        out,
        timeout,
        extras,
        accept,
    )


def _both(
    first: Callable[[FinalRecord], None], then: Callable[[FinalRecord], None]
) -> Callable[[FinalRecord], None]:
    def both(final: FinalRecord) -> None:
        first(final)
        then(final)

    return both
