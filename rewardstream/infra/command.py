"""How every command ends: one line on stderr and exit code 2 for a user error (a file or
folder it cannot use included, named), never a traceback; 130 on Ctrl-C and 143 on SIGTERM
(both after the command's own cleanup: temporary files removed, worker processes ended); 141
when stdout's reader went away (``... | head -2``). Shared by ``rewardstream``,
``ng_reward_profile``, ``ng_run`` and ``ng_collect_rollouts``, so the rule lives in one
place."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from rewardstream.errors import RewardstreamError

__all__ = [
    "SIGPIPE_EXIT",
    "fail",
    "override_command",
    "package_version",
    "run_guarded",
    "run_loop",
]

_T = TypeVar("_T")

SIGPIPE_EXIT = 141
"""128 + SIGPIPE: what a shell reports for ``cat`` or ``grep`` whose reader went away, so
``set -o pipefail`` scripts see the same for these commands."""


def package_version() -> str:
    """The installed rewardstream's version (what ``--version`` prints)."""
    from importlib.metadata import version  # ~25 ms: only when asked

    return version("rewardstream")


def fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _stdout_closed() -> bool:
    """Whether stdout's reader went away: a pipe without a reader polls as an error. Tells a
    closed stdout from a broken pipe elsewhere (a forked worker's), which stays an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout: not what broke
        return False
    if not hasattr(select, "poll"):  # cannot tell: as Python's own recipe, assume stdout
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


class _Terminated(BaseException):
    """SIGTERM, raised where the command is, so it unwinds as for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """``uvloop.run(main)``, SIGTERM cancelling ``main`` as Ctrl-C does. Inside the loop a
    handler that raises (:func:`run_guarded`'s) is no use: uvloop logs its exception and goes
    on. So the loop's own handler cancels ``main``, which cleans up; then the signal is
    raised again, to the handler there was before (143 under :func:`run_guarded`). Every
    async command runs its loop here; one that ends normally on a signal (``stream``,
    ``ng_run``, ``publish --follow``) adds its own handlers over these."""
    import asyncio  # only the commands that run a loop pay for these

    import uvloop

    terminated = False

    async def cancelled_by_sigterm() -> _T:
        previous = signal.getsignal(signal.SIGTERM) or signal.SIG_DFL  # None: not set in Python
        if previous == signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
            return await main
        task = asyncio.current_task()
        assert task is not None

        def cancel() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, cancel)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    try:
        return uvloop.run(cancelled_by_sigterm())
    finally:  # also when ``main`` took its cancellation as a normal end: terminated is 143
        if terminated:
            signal.raise_signal(signal.SIGTERM)


def run_guarded(prog: str, func: Callable[[], int]) -> int:
    """``func()``'s exit code, with the rules above. Stdout is flushed here, not at exit,
    where a closed pipe could no longer be caught; after one, the rest of stdout goes to
    /dev/null (Python's recipe), or flushing it at exit would fail again. SIGTERM, left to
    its default, would end the process where it stands (a half-written temporary file, a
    pool's workers orphaned): here it unwinds like Ctrl-C (a command that handles SIGTERM
    itself, such as ``stream``, installs its own handler over this one)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        try:
            return func()
        finally:
            sys.stdout.flush()
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except RewardstreamError as exc:
        return fail(prog, str(exc))
    except KeyboardInterrupt:
        return 130
    except _Terminated:
        return 143
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT
    except OSError as exc:  # a folder or file the user named that cannot be used
        if exc.filename is None:
            raise
        where = f"'{exc.filename}'" + (f" -> '{exc.filename2}'" if exc.filename2 else "")
        return fail(prog, f"Cannot use {where}: {exc.strerror or exc}")


def override_command(
    prog: str, usage: Callable[[], str], argv: Sequence[str] | None, run: Callable[[list[str]], int]
) -> int:
    """A command in NeMo Gym's style (``+key=value`` arguments): ``-h``/``--help`` prints
    ``usage()``, ``--version`` the version, anything else is ``run(args)``; all of it under
    :func:`run_guarded`."""
    args = list(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        if {"-h", "--help"} & set(args):
            print(usage())
        elif "--version" in args:
            print(f"{prog} {package_version()}")
        else:
            return run(args)
        return 0

    return run_guarded(prog, go)
