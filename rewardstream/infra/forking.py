"""Work in a forked child: it sees this process's memory as it is (copy-on-write: consistent,
and nothing to copy) and runs on another core. One place owns how such a child starts and
ends: in a process group of its own, with default signal handlers and no garbage collector,
and always by ``os._exit``, so no cleanup of the parent's (event loop, clients, temporary
files) ever runs twice.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from collections.abc import Callable

__all__ = ["fork"]


def fork(work: Callable[[], None], failed: Callable[[BaseException], None]) -> int:
    """Run ``work`` in a forked child and return its pid; the child exits 0 when ``work``
    returned, else 1 after ``failed`` was told why (a reader gone away is said by nobody)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setpgid(0, 0)  # killed as a group with its own helpers, never with the parent's
        gc.disable()  # short-lived: a collection would only walk (and copy) the parent's objects
        with contextlib.suppress(ValueError):  # the parent's event loop must not hear signals
            signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        work()
        code = 0
    except BrokenPipeError:  # the reader went away: nothing to say
        pass
    except BaseException as exc:  # a child must reach os._exit whatever happens
        with contextlib.suppress(BaseException):
            failed(exc)
    finally:
        os._exit(code)
