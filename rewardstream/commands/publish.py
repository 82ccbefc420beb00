"""``rewardstream publish``: the command-line face of
:func:`rewardstream.producers.publisher.publish.publish_files`.

Only :func:`add_parser` is public; the main CLI wires it in and turns a
:class:`~rewardstream.errors.RewardstreamError` into one line and exit code 2, so errors are
left to propagate here.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rewardstream.errors import InputError, LineError
from rewardstream.infra.command import run_loop
from rewardstream.kafka import options as kafka_options

if TYPE_CHECKING:
    from rewardstream.producers.publisher.publish import PublishReport

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``publish`` to a ``rewardstream``-style subcommand set."""
    p = subparsers.add_parser(
        "publish", help="publish a collection's inputs and rollouts files to Kafka"
    )
    p.add_argument("--inputs", required=True, type=Path, help="the *_materialized_inputs.jsonl")
    p.add_argument("--rollouts", required=True, type=Path, help="the rollouts .jsonl file")
    kafka_options.add_option(p, "--bootstrap", kafka_options.BOOTSTRAP_HELP, required=True)
    p.add_argument(
        "--run-id",
        help="default: <rollouts stem>-<8 hex> naming this collection (from the inputs file's "
        "identity): the same for a republish of the same files or a resumed collection, new "
        "for a new collection written to the same path; a run that has a final profile is "
        "sent nothing, and refused unless it is these files' profile",
    )
    kafka_options.add_option(
        p,
        "--topic-prefix",
        "topics <prefix>.inputs, <prefix>.rollouts, <prefix>.control (rewardstream)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep tailing the rollouts file while a collection appends to it; the run is "
        "finished once every expected rollout (one per input row) was published, and Ctrl-C/"
        "SIGTERM stops without finishing it",
    )
    p.add_argument(
        "--finish-when-idle",
        "--idle-timeout",
        type=float,
        metavar="S",
        help="with --follow: also finish the run after S seconds without a new line (off by "
        "default; --idle-timeout is its deprecated old name)",
    )
    p.add_argument(
        "--finish-on-stop",
        action="store_true",
        help="with --follow: Ctrl-C/SIGTERM finishes the run (a partial final profile)",
    )
    p.add_argument(
        "--wait-profile",
        action="store_true",
        help="once the run is finished, wait for the processors' final profile and write it "
        "next to the rollouts file, where ng_reward_profile would; a final that is not the "
        "profile of these files (a run id given to other content) is refused, nothing written",
    )
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="with --wait-profile: give up after S seconds (600)",
    )
    kafka_options.add_option(
        p, "--group-id", "with --wait-profile: the processors' group (default <prefix>-profiler)"
    )
    p.add_argument(
        "--aggregate-metrics",
        action="store_true",
        help="the run's snapshots and final also carry _aggregate_metrics.json (pass@k, "
        "avg-of-k, majority@k), _task_difficulty.json and _intervals.json",
    )
    p.add_argument(
        "--answer-key",
        metavar="FIELD",
        help="the result field majority@k votes on, in the run's aggregate file (asked for "
        "here or by the processors' --aggregate-metrics)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    kafka_options.add_arguments(p)
    p.set_defaults(func=_cmd_publish)


def _cmd_publish(args: argparse.Namespace) -> int:
    from rewardstream.producers.publisher.run_id import (
        default_run_id,
    )  # imported when run: see rewardstream.commands.cli

    try:
        report = run_loop(_publish(args))
    except LineError as exc:  # lines are sent as they are read: say what the topics now hold
        run_id = args.run_id or default_run_id(args.inputs, args.rollouts.stem)
        raise InputError(
            f"{exc} (publishing stopped at this line: the lines before it were published and "
            f"run {run_id!r} was left unfinished; once the line is fixed, publish again: "
            "events already sent are dropped as duplicates)"
        ) from None
    if report.final is not None:
        print(
            f"run {report.run_id} has its final profile of these files already: nothing sent",
            file=sys.stderr,
        )
    print(
        f"published run_id={report.run_id} inputs={report.inputs_sent} "
        f"rollouts={report.rollouts_sent} in {report.seconds:.2f}s"
    )
    if not report.finished:
        print(
            f"stopped following: run {report.run_id!r} was left open (no run_finished); to "
            "finish it, publish the same files without --follow and with --run-id "
            f"{report.run_id} (events already sent are dropped as duplicates)",
            file=sys.stderr,
        )
    elif args.wait_profile:
        print(*run_loop(_wait(args, report.run_id)), sep="\n")
    return 0


async def _wait(args: argparse.Namespace, run_id: str) -> list[str]:
    from rewardstream.contract.events import Topics
    from rewardstream.kafka import config as kafka_config
    from rewardstream.sinks.files import profile_lines
    from rewardstream.sinks.topics.content import files_content
    from rewardstream.sinks.topics.wait import wait_profile

    # what the final must hold: these files' content (computed while the processors work)
    content = await asyncio.to_thread(
        files_content, args.inputs, args.rollouts, run_id, args.answer_key
    )
    paths = await wait_profile(
        args.bootstrap,
        Topics.for_prefix(args.topic_prefix),
        args.group_id,
        run_id,
        args.rollouts.parent,
        args.wait_timeout,
        kafka_config.from_args(args),
        of=(content, str(args.rollouts), "publish the files with a new --run-id"),
    )
    return profile_lines(paths, extras=False)


async def _publish(args: argparse.Namespace) -> PublishReport:
    from rewardstream.contract.events import Topics
    from rewardstream.kafka import config as kafka_config
    from rewardstream.producers.publisher.publish import publish_files

    security = kafka_config.from_args(args)  # a bad setting fails before anything starts
    if args.wait_profile:  # the final goes next to the rollouts file: never over an input
        from rewardstream.contract.names import ProfilePaths
        from rewardstream.sinks.files import refuse_inputs

        given = {args.inputs: "--inputs", args.rollouts: "--rollouts"}
        refuse_inputs(ProfilePaths.next_to(args.rollouts), given)
    stop = asyncio.Event()
    if args.follow:  # a stop sends what is complete, then ends; without --follow, Ctrl-C aborts
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    return await publish_files(
        args.inputs,
        args.rollouts,
        args.bootstrap,
        run_id=args.run_id,
        topics=Topics.for_prefix(args.topic_prefix),
        follow=args.follow,
        finish_when_idle=args.finish_when_idle,
        finish_on_stop=args.finish_on_stop,
        stop=stop,
        progress=not args.quiet,
        security=security,
        aggregate_metrics=args.aggregate_metrics,
        answer_key=args.answer_key,
    )
