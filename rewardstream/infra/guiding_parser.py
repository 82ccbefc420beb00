"""An argument parser whose usage errors suggest the closest subcommand or flag.

argparse (before Python 3.14's ``suggest_on_error``) answers ``rewardstream snapshoot`` with
the list of every command and ``--run_id`` with ``unrecognized arguments``; users meet these
first, so the line ends with ``did you mean ...?`` (:func:`difflib.get_close_matches`, as
Hydra and newer argparse do). Subparsers are of the parser's class, so one root covers a tree.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["GuidingParser"]

_CHOICE = re.compile(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)$")


def _closest(word: str, known: Sequence[str]) -> str | None:
    """The one or two known words nearest ``word``, quoted, or None."""
    found = difflib.get_close_matches(word, known, n=2, cutoff=0.6)
    return " or ".join(f"'{w}'" for w in found) if found else None


class GuidingParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose :meth:`error` names the closest known word."""

    _argv: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads; same behaviour
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        super().error(message + self._hint(message))

    def _hint(self, message: str) -> str:
        choice = _CHOICE.search(message)
        if choice is not None:
            known = [c.strip().strip("'") for c in choice.group(2).split(",")]
            best = _closest(choice.group(1), known)
            return f" (did you mean {best}?)" if best else ""
        if message.startswith("unrecognized arguments: "):
            tokens = message.removeprefix("unrecognized arguments: ").split()
        elif message.startswith("the following arguments are required: "):
            tokens = list(self._argv)  # a mistyped required flag is reported as missing
        else:
            return ""
        options = list(self._chosen()._option_string_actions)
        hints = {}
        for token in tokens:
            flag = token.split("=", 1)[0]
            if not flag.startswith("-") or any(o.startswith(flag) for o in options):
                continue  # a value, a known flag or its abbreviation
            best = _closest(flag.replace("_", "-"), options)
            if best is not None:
                hints[flag] = best
        if len(hints) == 1:
            return f" (did you mean {next(iter(hints.values()))}?)"
        said = ", ".join(f"{best} for {flag}" for flag, best in hints.items())
        return f" (did you mean {said}?)" if hints else ""

    def _chosen(self) -> argparse.ArgumentParser:
        """The (sub)parser the command line chose: its flags are the ones to suggest."""
        parser: argparse.ArgumentParser = self
        for token in self._argv:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            chosen: Any = subs[0].choices.get(token) if subs else None
            if isinstance(chosen, argparse.ArgumentParser):
                parser = chosen
        return parser
