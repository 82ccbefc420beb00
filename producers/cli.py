"""``rewardstream publish``: the command-line face of :func:`producers.publish.publish_files`.

Only :func:`add_parser` is public; the main CLI wires it in and turns a
:class:`~rewardstream.errors.RewardstreamError` into one line and exit code 2, so errors are
left to propagate here.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from rewardstream import kafka_options
from rewardstream.errors import InputError, LineError

if TYPE_CHECKING:
    from producers.publish import PublishReport

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``publish`` to a ``rewardstream``-style subcommand set."""
    p = subparsers.add_parser(
        "publish", help="publish a collection's inputs and rollouts files to Kafka"
    )
    p.add_argument("--inputs", required=True, type=Path, help="the *_materialized_inputs.jsonl")
    p.add_argument("--rollouts", required=True, type=Path, help="the rollouts .jsonl file")
    p.add_argument("--bootstrap", required=True, help="Kafka HOST:PORT")
    p.add_argument(
        "--run-id", help="default: <rollouts stem>-<hash of its path>, stable across republishes"
    )
    p.add_argument("--topic-prefix", default="rewardstream")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep tailing the rollouts file while a collection appends to it",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="with --follow: finish the run after S seconds without a new line (default 30)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    kafka_options.add_arguments(p)
    p.set_defaults(func=_cmd_publish)


def _cmd_publish(args: argparse.Namespace) -> int:
    from producers.publish import default_run_id  # imported when run: see rewardstream.cli

    try:
        report = asyncio.run(_publish(args))
    except LineError as exc:  # lines are sent as they are read: say what the topics now hold
        run_id = args.run_id or default_run_id(args.rollouts)
        raise InputError(
            f"{exc} (publishing stopped at this line: the lines before it were published and "
            f"run {run_id!r} was left unfinished; once the line is fixed, publish again: "
            "events already sent are dropped as duplicates)"
        ) from None
    print(
        f"published run_id={report.run_id} inputs={report.inputs_sent} "
        f"rollouts={report.rollouts_sent} in {report.seconds:.2f}s"
    )
    return 0


async def _publish(args: argparse.Namespace) -> PublishReport:
    from producers.publish import publish_files
    from rewardstream import kafka_config
    from rewardstream.contract import Topics

    security = kafka_config.from_args(args)  # a bad setting fails before anything starts
    stop = asyncio.Event()
    if args.follow:  # a graceful stop still publishes RunFinished; without --follow, Ctrl-C aborts
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
        idle_timeout=args.idle_timeout,
        stop=stop,
        progress=not args.quiet,
        security=security,
    )
