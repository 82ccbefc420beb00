"""How every command ends: one line on stderr and exit code 2 for a user error, never a
traceback; 130 on Ctrl-C. Shared by ``rewardstream``, ``ng_reward_profile`` and
``ng_collect_rollouts``, so the rule lives in one place."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rewardstream.errors import RewardstreamError

__all__ = ["fail", "run_guarded"]


def fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def run_guarded(prog: str, func: Callable[[], int]) -> int:
    try:
        return func()
    except RewardstreamError as exc:
        return fail(prog, str(exc))
    except KeyboardInterrupt:
        return 130
