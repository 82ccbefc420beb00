"""The processor's background tasks: finals being written and late events being parked, each
started where it is decided and outliving the loop pass that started it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background"]


class Background:
    """Owns the tasks started beside the loops: keeps them until done, and on stop cancels
    them and waits for them, before the Kafka clients they use are stopped."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel(self) -> None:
        """Stop the finals being written (another leader writes them) and wait for them."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
