"""``gym``: NeMo Gym 0.7.0's command names for the commands rewardstream has.

    gym env start --config C [--config C2] [+key=value ...]          # ng_run
    gym eval run --no-serve -i I -o O [--num-repeats N] [...]        # ng_collect_rollouts
    gym eval run --config C --split train -o O [...]                 # ng_e2e_collect_rollouts
    gym eval profile --inputs M --rollouts R [+key=value ...]        # ng_reward_profile
    gym eval aggregate -i GLOB -o O [+key=value ...]                 # ng_aggregate_rollouts

As 0.7.0 does, each flag becomes a ``+key=value`` override (``--config`` repeated becomes
``+config_paths=[...]``) and every other argument is passed on as an override; an unknown flag
is an error. ``gym eval run`` without ``--no-serve`` (prepare the split, start the servers,
collect, stop them) is ``ng_e2e_collect_rollouts``. The health-check flags are accepted and
have no effect: rewardstream writes no rollout health reports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from rewardstream.infra.command import package_version
from rewardstream.infra.guiding_parser import GuidingParser

__all__ = ["main"]


class _Flag(NamedTuple):
    names: tuple[str, ...]  # "--input", "-i"
    key: str | None  # the override it becomes (None: accepted, no effect)
    kind: str = "value"  # value, bool, or config (repeatable, +config_paths=[...])


_HEALTH = (
    _Flag(("--no-health-check",), None, "bool"),
    _Flag(("--health-check-workers",), None),
    _Flag(("--health-check-ignore",), None),
)
_RUN = (
    _Flag(("--config",), "config_paths", "config"),
    _Flag(("--no-serve",), None, "bool"),
    _Flag(("--split",), "split"),
    _Flag(("--resume",), "resume_from_cache", "bool"),
    _Flag(("--agent", "-a"), "agent_name"),
    _Flag(("--input", "-i"), "input_jsonl_fpath"),
    _Flag(("--output", "-o"), "output_jsonl_fpath"),
    _Flag(("--limit",), "limit"),
    _Flag(("--num-repeats",), "num_repeats"),
    _Flag(("--interleave-repeats",), "interleave_repeats", "bool"),
    _Flag(("--prompt-config",), "prompt_config"),
    _Flag(("--concurrency",), "num_samples_in_parallel"),
    _Flag(("--temperature",), "responses_create_params.temperature"),
    _Flag(("--top-p",), "responses_create_params.top_p"),
    _Flag(("--max-output-tokens",), "responses_create_params.max_output_tokens"),
    _Flag(("--disable-aggregation",), "disable_aggregation", "bool"),
    *_HEALTH,
)
_PROFILE = (
    _Flag(("--inputs",), "materialized_inputs_jsonl_fpath"),
    _Flag(("--rollouts",), "rollouts_jsonl_fpath"),
)
_AGGREGATE = (
    _Flag(("--config",), "config_paths", "config"),
    _Flag(("--input-glob", "-i"), "input_glob"),
    _Flag(("--output", "-o"), "output_jsonl_fpath"),
    *_HEALTH,
)
_START = (_Flag(("--config",), "config_paths", "config"),)


def _collect(argv: list[str]) -> int:
    from rewardstream.producers.gym.collect import main

    return main(argv)


def _e2e(argv: list[str]) -> int:
    from rewardstream.producers.gym.e2e import main

    return main(argv)


def _profile(argv: list[str]) -> int:
    from rewardstream.commands.cli import ng_reward_profile

    return ng_reward_profile(argv)


def _aggregate(argv: list[str]) -> int:
    from rewardstream.producers.gym.aggregate_rollouts import main

    return main(argv)


def _start(argv: list[str]) -> int:
    from rewardstream.gym_servers.ng_run import main

    return main(argv)


_COMMANDS: dict[tuple[str, str], tuple[str, tuple[_Flag, ...], Callable[[list[str]], int]]] = {
    ("env", "start"): ("Start the servers of a config (ng_run).", _START, _start),
    ("eval", "run"): ("Collect rollouts (ng_collect_rollouts).", _RUN, _collect),
    ("eval", "profile"): ("A reward profile (ng_reward_profile).", _PROFILE, _profile),
    ("eval", "aggregate"): ("Merge and aggregate shards.", _AGGREGATE, _aggregate),
}


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = GuidingParser(  # subparsers are GuidingParsers too
        prog="gym", description=__doc__.splitlines()[0].replace("``", "")
    )
    parser.add_argument("--version", action="version", version=f"gym {package_version()}")
    groups = parser.add_subparsers(dest="group", required=True)
    subs: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for (group, name), (summary, flags, _) in _COMMANDS.items():
        if group not in subs:
            subs[group] = groups.add_parser(group, help=f"gym {group} ...").add_subparsers(
                dest="command", required=True
            )
        sub = subs[group].add_parser(name, help=summary, description=summary)
        for flag in flags:
            dest = flag.names[0].lstrip("-").replace("-", "_")
            if flag.kind == "bool":
                sub.add_argument(*flag.names, dest=dest, action="store_true")
            elif flag.kind == "config":
                sub.add_argument(*flag.names, dest=dest, action="append", metavar="PATH")
            else:
                sub.add_argument(*flag.names, dest=dest, metavar="VALUE")
        sub.add_argument("overrides", nargs="*", help="+key=value overrides, passed on")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    parsed = parser.parse_args(args)  # an unknown flag: argparse's usage error, exit 2
    _, flags, target = _COMMANDS[(parsed.group, parsed.command)]
    if (parsed.group, parsed.command) == ("eval", "run") and not parsed.no_serve:
        target = _e2e  # 0.7.0: serve, then collect
    overrides = []
    for flag in flags:
        value = getattr(parsed, flag.names[0].lstrip("-").replace("-", "_"))
        if flag.key is None or value in (None, False):
            continue
        if flag.kind == "bool":
            overrides.append(f"+{flag.key}=true")
        elif flag.kind == "config":
            overrides.append(f"+{flag.key}=[{','.join(value)}]")
        else:
            overrides.append(f"+{flag.key}={value}")
    return target([*overrides, *parsed.overrides])


if __name__ == "__main__":
    sys.exit(main())
