"""Command-line entry points: ``rewardstream <verb>`` and NeMo Gym's ``ng_*`` names.

Every user error ends as one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from rewardstream import kafka_local
from rewardstream.batch import ProfileConfig, print_summary, run_profile
from rewardstream.errors import ProfileError, RewardstreamError
from rewardstream.overrides import parse_overrides

__all__ = ["main", "ng_reward_profile"]

_PROFILE_REQUIRED = ("materialized_inputs_jsonl_fpath", "rollouts_jsonl_fpath")


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _profile(prog: str, config: dict[str, Any]) -> int:
    missing = [k for k in _PROFILE_REQUIRED if k not in config]
    if missing:
        return _fail(
            prog,
            f"missing required configuration: {', '.join(missing)}. Provide each via its flag "
            f"(see --help) or as a +{missing[0]}=<value> override.",
        )
    try:
        cfg = ProfileConfig.model_validate(config)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        return _fail(prog, f"invalid configuration {field!r}: {err['msg']}")
    try:
        profile, paths = run_profile(cfg)
    except ProfileError as exc:
        return _fail(prog, f"{exc.kind}: {exc}")
    except RewardstreamError as exc:
        return _fail(prog, str(exc))
    print_summary(profile, paths)
    return 0


def _run_guarded(prog: str, func: Callable[[], int]) -> int:
    try:
        return func()
    except RewardstreamError as exc:
        return _fail(prog, str(exc))
    except KeyboardInterrupt:
        return 130


def ng_reward_profile(argv: Sequence[str] | None = None) -> int:
    """``ng_reward_profile +materialized_inputs_jsonl_fpath=M +rollouts_jsonl_fpath=R``."""
    prog = "ng_reward_profile"
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(
            f"usage: {prog} +materialized_inputs_jsonl_fpath=M +rollouts_jsonl_fpath=R "
            "[++allow_partial_rollouts=True] [+quiet=true]"
        )
        return 0
    return _run_guarded(prog, lambda: _profile(prog, parse_overrides(args)))


def _cmd_profile(args: argparse.Namespace) -> int:
    config = parse_overrides(args.overrides)
    for key, value in (
        ("materialized_inputs_jsonl_fpath", args.inputs),
        ("rollouts_jsonl_fpath", args.rollouts),
        ("allow_partial_rollouts", args.allow_partial_rollouts or None),
        ("quiet", args.quiet or None),
    ):
        if value is not None:
            config[key] = value
    return _profile("rewardstream profile", config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewardstream", description="Streaming reward profiler for LLM RL rollouts."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="profile a finished collection (ng_reward_profile)")
    p.add_argument("--inputs", help="the *_materialized_inputs.jsonl file")
    p.add_argument("--rollouts", help="the rollouts .jsonl file")
    p.add_argument("--allow-partial-rollouts", action="store_true", help="profile a partial run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "overrides", nargs="*", help="NeMo Gym overrides, e.g. ++allow_partial_rollouts=True"
    )
    p.set_defaults(func=_cmd_profile)
    kafka_local.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return _run_guarded("rewardstream", lambda: func(args))


if __name__ == "__main__":
    sys.exit(main())
