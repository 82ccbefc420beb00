"""Whether a run's final profile is the profile of a collection's files: content is identity.

A run id names what the processors fold under it; an event whose key they hold already is a
duplicate when its content is the same, a conflict when not (parked, never folded). So a
final record carries its run's *content*, the digests of the keys it holds summed
(:func:`rewardstream.contract.events.content_sum`), and a producer compares it with its own files'
(:func:`files_content`, the same digests of the same decoded events): before it sends
anything to a run that is final already (:func:`finals_of_run`, :func:`refuse`: identical
files are not sent again, other files are refused), and before it writes a final profile next
to its files
(``--wait-profile``, ``+kafka_wait_profile``): a final of other content is never written
there.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any, NamedTuple

from rewardstream.contract.engine import EngineTopics, FinalRecord
from rewardstream.contract.events import (
    Topics,
    content_digest,
    content_hex,
    content_sum,
    decode_input,
    decode_rollout,
)
from rewardstream.errors import InputError
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.processors.core.state import row_key
from rewardstream.producers.events import input_events, rollout_events
from rewardstream.sinks.topics.profiles import list_finals

__all__ = ["Conflict", "FilesContent", "files_content", "finals_of_run", "refuse"]


Key = tuple[Any, Any]  # a row's (task, rollout), as the collector keeps it


class Conflict(InputError):
    """A run id that holds other content than the files given: one line, what to do."""


class FilesContent(NamedTuple):
    """What a final of a collection's files holds: its content and how many keys of each."""

    digest: str  # as FinalRecord.content
    inputs: int
    rollouts: int


def files_content(
    inputs: Path,
    rollouts: Path,
    run_id: str,
    answer_key: str | None,
    unsent: tuple[Container[Key], Container[Key]] = ((), ()),
) -> FilesContent:
    """The content (as a final record carries it) of a run holding these files: each key's
    first input row and first result, decoded as a processor decodes their events, but those
    of the keys ``unsent`` (of input rows, of results) never sent (too large for a topic)."""
    seen: set[tuple[str, int, int]] = set()
    digests = []
    for event in input_events(inputs, run_id):
        row = decode_input(event.value)
        key = row_key(row.row)
        if ("i", *key) not in seen and key not in unsent[0]:
            seen.add(("i", *key))
            digests.append(content_digest(row))
    rows = len(digests)
    for event in rollout_events(rollouts, run_id, answer_key):
        result = decode_rollout(event.value)
        key = (result.task, result.rollout)
        if ("r", *key) not in seen and key not in unsent[0] and key not in unsent[1]:
            seen.add(("r", *key))
            digests.append(content_digest(result))
    return FilesContent(content_hex(content_sum(digests)), rows, len(digests) - rows)


def refuse(final: FinalRecord, content: FilesContent, what: str, flag: str) -> None:
    """Raise :class:`Conflict` unless ``final`` is the profile of ``what`` (of ``content``);
    ``flag``: how the user names a new run. A final holding fewer keys than the files says
    so: the processors may have rejected some (a new run id would not help then)."""
    if final.content == content.digest:
        return
    new_run = f"a new collection needs its own run id: {flag}"
    if final.content is None:
        differs = "its final record has no content digest to compare"
    elif final.conflicts:
        differs = f"{final.conflicts} events of its collection had the key of another with "
        differs += "other content"
    elif (final.inputs, final.rollouts) == (content.inputs, content.rollouts):
        differs = f"it holds {final.inputs} input rows and {final.rollouts} rollouts of other "
        differs += "content"
    else:
        differs = (
            f"it holds {final.inputs} input rows and {final.rollouts} rollouts, the files "
            f"{content.inputs} and {content.rollouts}"
        )
        if final.inputs <= content.inputs and final.rollouts <= content.rollouts:
            new_run = (
                "events the processors rejected (e.g. larger than their --max-event-bytes) "
                f"are in the dead-letter topic, each with its reason; if none is, {new_run}"
            )
    raise Conflict(
        f"run {final.run_id!r} (group {final.group!r}) has a final profile that is not the "
        f"profile of {what}: {differs}; nothing written; {new_run}"
    )


async def finals_of_run(
    bootstrap: str, security: KafkaSecurity, topics: Topics, run_id: str
) -> list[FinalRecord]:
    """The run's standing final records, of every group (none: no final, or evicted)."""
    prefix = topics.control.removesuffix(".control")
    finals = await list_finals(bootstrap, security, EngineTopics.of(topics), prefix, None)
    return [f for (_, run), f in sorted(finals.items()) if run == run_id and f.state == "final"]
