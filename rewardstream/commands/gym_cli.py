"""``gym``: NeMo Gym 0.7.0's command names for the commands rewardstream has.

    gym env start --config C [--config C2] [+key=value ...]          # ng_run
    gym eval run --no-serve -i I -o O [--num-repeats N] [...]        # ng_collect_rollouts
    gym eval run --config C --split train -o O [...]                 # ng_e2e_collect_rollouts
    gym eval profile --inputs M --rollouts R [+key=value ...]        # ng_reward_profile
    gym eval aggregate -i GLOB -o O [+key=value ...]                 # ng_aggregate_rollouts
    gym eval compare --baseline A/r.jsonl --candidates B/r.jsonl [...]  # 0.7.0's, no ng_ name

As 0.7.0 does, each flag becomes a ``+key=value`` override (``--config`` repeated becomes
``+config_paths=[...]``, a path of ``compare`` a JSON string, a comma list a JSON list) and
every other argument is passed on as an override; an unknown flag is an error, and so is a
configuration a command refuses as a whole (``UsageError``: the command's usage, then the
line). ``gym eval run`` without ``--no-serve`` (prepare the split, start the servers,
collect, stop them) is ``ng_e2e_collect_rollouts``. The health-check flags are accepted and
have no effect: rewardstream writes no rollout health reports.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn

from rewardstream.errors import UsageError
from rewardstream.infra.command import package_version

__all__ = ["compare_overrides", "main"]


class _Flag(NamedTuple):
    names: tuple[str, ...]  # "--input", "-i"
    key: str | None  # the override it becomes (None: accepted, no effect)
    kind: str = "value"  # value, json (a quoted string), list (a,b), bool, or config
    metavar: str | None = "VALUE"  # None: argparse's, the name in capitals
    choices: tuple[str, ...] | None = None


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
_COMPARE = (  # 0.7.0's flags, names and metavars, so its usage line is the same
    _Flag(("-v", "--verbose"), "verbose", "bool"),
    _Flag(("--baseline",), "baseline_rollouts_jsonl_fpath", "json", None),
    _Flag(("--candidates",), "candidate_rollouts_jsonl_fpaths", "list", "PATH[,PATH...]"),
    _Flag(("--baseline-agg-metrics",), "baseline_aggregate_metrics_fpath", "json", None),
    _Flag(
        ("--candidates-agg-metrics",),
        "candidate_aggregate_metrics_fpaths",
        "list",
        "PATH[,PATH...]",
    ),
    _Flag(("--agent",), "agent_name", "value", None),
    _Flag(("--baseline-agent",), "baseline_agent_name", "value", None),
    _Flag(("--candidate-agents",), "candidate_agent_names", "list", "NAME[,NAME...]"),
    _Flag(("--output-dir", "-o"), "output_dirpath", "json", None),
    _Flag(("--report-format",), "report_format", "value", None, ("md", "json", "both")),
)


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


def _compare(argv: list[str]) -> int:
    from rewardstream.commands.compare import main

    return main(argv)


_COMMANDS: dict[tuple[str, str], tuple[str, tuple[_Flag, ...], Callable[[list[str]], int]]] = {
    ("env", "start"): ("Start the servers of a config (ng_run).", _START, _start),
    ("eval", "run"): ("Collect rollouts (ng_collect_rollouts).", _RUN, _collect),
    ("eval", "profile"): ("A reward profile (ng_reward_profile).", _PROFILE, _profile),
    ("eval", "aggregate"): ("Merge and aggregate shards.", _AGGREGATE, _aggregate),
    ("eval", "compare"): (
        "Compare a baseline eval run against candidate runs.",
        _COMPARE,
        _compare,
    ),
}


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


class _GymParser(argparse.ArgumentParser):
    """0.7.0's ``gym`` parser: an invalid choice (a command, ``--report-format``) ends with
    the closest one, in its words."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']+)' \(choose from (.+)\)", message)
        if choice:
            known = re.findall(r"'([^']+)'", choice[2]) or [c.strip() for c in choice[2].split(",")]
            message += _did_you_mean(choice[1], known)
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _GymParser(  # subparsers are of its class too
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
        sub.set_defaults(parser=sub)  # its errors name the command, as 0.7.0's
        for flag in flags:
            dest = _dest(flag)
            if flag.kind == "bool":
                sub.add_argument(*flag.names, dest=dest, action="store_true")
            elif flag.kind == "config":
                sub.add_argument(*flag.names, dest=dest, action="append", metavar="PATH")
            else:
                sub.add_argument(*flag.names, dest=dest, metavar=flag.metavar, choices=flag.choices)
    return parser


def _dest(flag: _Flag) -> str:
    return flag.names[0].lstrip("-").replace("-", "_")


def _override(flag: _Flag, value: str | list[str] | bool) -> str:
    """The ``+key=value`` a given flag becomes."""
    if flag.kind == "bool":
        return f"+{flag.key}=true"
    if flag.kind == "config":
        return f"+{flag.key}=[{','.join(value)}]"  # type: ignore[arg-type]
    if flag.kind == "json":
        return f"+{flag.key}={json.dumps(value)}"
    if flag.kind == "list":
        items = [json.dumps(item.strip()) for item in str(value).split(",") if item.strip()]
        return f"+{flag.key}=[{','.join(items)}]"
    return f"+{flag.key}={value}"


def compare_overrides(baseline: str, candidate: str, output_dir: str) -> list[str]:
    """What ``gym eval compare --baseline B --candidates C --output-dir D`` passes on: a report
    written from them (``rewardstream compare --output-dir``) names that command."""
    given = {"--baseline": baseline, "--candidates": candidate, "--output-dir": output_dir}
    return [_override(flag, given[flag.names[0]]) for flag in _COMPARE if flag.names[0] in given]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parsed, rest = _parser().parse_known_args(args)
    chosen: argparse.ArgumentParser = parsed.parser  # the command's: its usage, its name
    unknown = [token for token in rest if token.startswith("-")]  # overrides never start so
    if unknown:  # argparse's usage error, exit 2, each flag with its closest known one
        options = [name for action in chosen._actions for name in action.option_strings]
        names = [token.split("=", 1)[0] for token in unknown]
        hints = "".join(_did_you_mean(name, [o for o in options if o != name]) for name in names)
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}{hints}")
    _, flags, target = _COMMANDS[(parsed.group, parsed.command)]
    if (parsed.group, parsed.command) == ("eval", "run") and not parsed.no_serve:
        target = _e2e  # 0.7.0: serve, then collect
    given = [(flag, getattr(parsed, _dest(flag))) for flag in flags if flag.key is not None]
    overrides = [_override(flag, value) for flag, value in given if value not in (None, False)]
    try:
        return target([*overrides, *rest])
    except UsageError as exc:
        chosen.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
