"""Run the batch profile with either reader: the lean one and the reference it must equal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rewardstream.infra import readers

READERS = ("lean", "reference")

_CHOICES = {
    "lean": (readers.load_inputs_lean, readers.load_results_lean),
    "reference": (readers.load_inputs_reference, readers.load_results_reference),
}


@contextlib.contextmanager
def reading_with(reader: str) -> Iterator[None]:
    """Swap the reader module's one choice for the test's duration (forked workers inherit
    it, as they inherit ``REWARDSTREAM_READER``'s)."""
    saved = readers.load_inputs, readers.load_results
    readers.load_inputs, readers.load_results = _CHOICES[reader]
    try:
        yield
    finally:
        readers.load_inputs, readers.load_results = saved
