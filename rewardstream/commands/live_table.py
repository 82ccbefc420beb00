"""What ``watch`` and ``compare`` share: a processor's JSON polled, each agent's confidence
sequence rebuilt from it, and tables redrawn per poll that fit the terminal.

:func:`fitted` makes a table of the columns that fit: columns of less use give way first,
then names are cut; figures never are. :func:`poll_loop` prints one poll (``--once``: a
processor that cannot be reached is exit 2) or redraws until Ctrl-C, saying in place of the
table when the processor cannot be reached, and going on.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table

from rewardstream.errors import InputError
from rewardstream.infra.http_security import HttpSecurity, open_url
from rewardstream.processors.core.confseq import Tally

__all__ = ["Column", "fitted", "get_json", "poll_loop", "shown_tally"]


def get_json(base: str, path: str, security: HttpSecurity) -> Any:
    """The JSON a processor at ``base`` answers at ``path``."""
    with open_url(security, f"{base.rstrip('/')}{path}") as r:
        return json.loads(r.read())


def shown_tally(reward: dict[str, Any]) -> Tally | None:
    """An agent's confidence sequence rebuilt from its ``reward`` in ``/runs/<id>`` (the
    interval's ``sums``, ``range`` and ``outside``), so a client takes it at any level whatever
    the processor's: an empty one before any reward, None from a processor that shows no sums
    (an older version)."""
    interval = reward.get("interval")
    if not (interval and reward.get("count")):
        return Tally()
    if "sums" not in interval:
        return None
    (lo, hi), (n, total, spread) = interval["range"], interval["sums"]
    return Tally(lo, hi, n, total, spread, interval["outside"])


class Column(NamedTuple):
    name: str
    drop: int  # 0: always shown; higher numbers go first when the terminal is narrow


def _table(
    columns: tuple[Column, ...],
    rows: Sequence[tuple[str, ...]],
    keep: list[int],
    first_width: int | None,
    table: dict[str, Any],
) -> Table:
    """The ``keep`` columns of ``rows``: figures at their full width, the first (a name, cut
    with an ellipsis) at most ``first_width``."""
    built = Table(expand=False, **table)
    for i in keep:
        name = columns[i].name
        widest = max([len(name), *(len(row[i]) for row in rows)])
        built.add_column(
            name,
            justify="left" if i == 0 or name in ("state", "verdict") else "right",
            no_wrap=True,
            overflow="ellipsis" if i == 0 else "fold",
            min_width=None if i == 0 else widest,
            max_width=first_width if i == 0 else None,
        )
    for row in rows:
        built.add_row(*(row[i] for i in keep))
    return built


def fitted(
    console: Console,
    columns: tuple[Column, ...],
    rows: Sequence[tuple[str, ...]],
    **table: Any,
) -> Table:
    """A table of ``rows`` with the columns that fit the console: the highest ``drop`` first
    (the last of equals first) until it fits, then the first column (names) narrowed; figures
    are never cut."""
    keep = list(range(len(columns)))
    by_drop = sorted(keep, key=lambda i: (columns[i].drop, i), reverse=True)
    wide = console.options.update_width(10_000)
    while True:
        built = _table(columns, rows, keep, None, table)
        natural = console.measure(built, options=wide).maximum
        dropped = next((i for i in by_drop if i in keep and columns[i].drop > 0), None)
        if natural <= console.width:
            return built
        if dropped is None:
            names = max([len(columns[0].name), *(len(row[0]) for row in rows)])
            return _table(columns, rows, keep, max(6, names - (natural - console.width)), table)
        keep.remove(dropped)


def poll_loop(
    console: Console,
    poll: Callable[[], RenderableType],
    url: str,
    interval: float,
    once: bool,
    redraw: bool = True,
) -> int:
    """``poll`` printed once, or every ``interval`` seconds until interrupted: redrawn in place,
    or (``redraw`` False: JSON lines) printed one after another."""
    if once:
        try:
            console.print(poll(), soft_wrap=not redraw)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise InputError(f"cannot reach {url}: {reason}") from None
        return 0
    with Live(console=console, auto_refresh=False) if redraw else _Printer(console) as live:
        while True:
            try:
                live.update(poll(), refresh=True)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                live.update(f"cannot reach {url}: {reason} (retrying)", refresh=True)
            time.sleep(interval)


class _Printer:
    """:class:`Live`'s ``update`` for output that is appended, not redrawn."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __enter__(self) -> _Printer:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, renderable: RenderableType, refresh: bool = False) -> None:
        self.console.print(renderable, soft_wrap=True)
