"""The default run id of a collection, shared by ``rewardstream publish`` and the collector.

A run id must name one collection, not a path: the processor merges every event of a run id
into one profile. The collector writes the materialized inputs file once, atomically, when a
collection starts (a new file, so a new inode and mtime), and a resume reads it back without
rewriting it. That file's identity therefore names the collection: a resume, or republishing
unchanged files, keeps the run id (so the processor deduplicates), while a second collection
written to the same path gets a new one instead of being merged into the first.

A new rollouts file next to an *unchanged* inputs file (collected by other means, or the inputs
file kept) keeps the id too; content then tells the collections apart
(:mod:`rewardstream.sinks.topics.content`): a run that has a final profile of other content is
refused before anything is sent, and under an open run the keys sent again with other content
are conflicts, whose final ``--wait-profile`` refuses.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rewardstream.contract.names import run_id_from

__all__ = ["default_run_id"]


def default_run_id(inputs: Path, stem: str) -> str:
    """``<stem>-<8 hex>``, the hex from the materialized ``inputs`` file's resolved path, inode,
    mtime (ns) and size."""
    st = inputs.stat()
    ident = f"{inputs.resolve()}|{st.st_ino}|{st.st_mtime_ns}|{st.st_size}"
    return f"{run_id_from(stem)}-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"
