"""``rewardstream kafka start|status|stop|fetch``: a detached local broker or 3-broker cluster
for development, recorded in a state folder (wired into ``rewardstream`` by :func:`add_parser`).

* ``start [--port N] [--partitions N] [--brokers 1|3] [--state-dir DIR]``: start a detached
  broker (or cluster), print ``bootstrap=127.0.0.1:<port>[,...]`` as the last stdout line and
  record every broker in ``DIR/broker.json`` (default DIR:
  :func:`~rewardstream.kafka.local.state.state_dir`, the project's ``.rewardstream/kafka``;
  ``status`` and ``stop`` take the same option). If it is still alive, fail with exit code 1
  and ``a broker is already running at 127.0.0.1:<port> (pid N); run 'rewardstream kafka stop'
  first``.
* ``status``: ``running bootstrap=127.0.0.1:<port> pid=N`` (exit 0; a cluster prints ``pids=``),
  ``degraded bootstrap=... pids=... down=...`` (exit 2: part of a cluster died) or ``not
  running (no broker recorded in DIR)`` (exit 1), with a line on stderr for each broker of
  this package running elsewhere (another state folder's, named, or a test's).
* ``stop``: SIGTERM, then after 30 s SIGKILL of each recorded broker's own process group; removes
  the workdirs and the state file. Prints ``not running (...)`` as ``status`` does (exit 0)
  when the folder records nothing running.
* ``fetch``: only download the jars and print the libs directory.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rewardstream.kafka.local.cluster import LocalCluster
from rewardstream.kafka.local.errors import KafkaLocalError
from rewardstream.kafka.local.jars import fetch_jars
from rewardstream.kafka.local.state import (
    brokers_elsewhere,
    is_our_broker,
    running_state,
    state_dir,
    state_lock,
    stop_detached,
    write_state,
)

__all__ = ["CLI_PARTITIONS", "add_parser", "main"]

ALREADY_RUNNING = (
    "a broker is already running at {bootstrap} (pid {pid}); run 'rewardstream kafka stop' first"
)
# `kafka start` default: a consumer group of up to 4 processors all get partitions (with 1, a
# second processor sits idle). LocalBroker keeps 1, which the test fixtures rely on.
CLI_PARTITIONS = 4
ALREADY_RUNNING_CLUSTER = (
    "a cluster is already running at {bootstrap} (pids {pids}); run 'rewardstream kafka stop' first"
)

# The package's logger: its modules log below it, so the command's handler shows them all.
log = logging.getLogger("rewardstream.kafka.local")


def _cli_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kafka: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _cmd_start(args: argparse.Namespace) -> int:
    _cli_logging()
    folder = args.state_dir or state_dir()
    with state_lock(folder):
        running = running_state(folder)
        if running is not None:
            pids = ",".join(map(str, running.pids))
            msg = ALREADY_RUNNING if len(running.brokers) == 1 else ALREADY_RUNNING_CLUSTER
            print(msg.format(bootstrap=running.bootstrap, pid=pids, pids=pids), file=sys.stderr)
            return 1
        cluster = LocalCluster(brokers=args.brokers, partitions=args.partitions, port=args.port)
        try:
            cluster.start()
            state = cluster.state()
            write_state(state, folder)
        except (KafkaLocalError, ValueError) as exc:
            cluster.stop()
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except BaseException:
            cluster.stop()
            raise
        cluster.detach()
    for b in state.brokers:
        log.info("pid %d, workdir %s, log %s/kafka.out", b.pid, b.workdir, b.workdir)
    print(f"bootstrap={state.bootstrap}", flush=True)
    return 0


def _not_running(folder: Path) -> None:
    """Say that ``folder`` records no running broker, and where the ones running are."""
    print(f"not running (no broker recorded in {folder})")
    for other in brokers_elsewhere(folder):
        pids = ",".join(map(str, other.pids))
        if other.folder is None:
            where = "not started by 'rewardstream kafka start' (a test's, or a LocalBroker)"
        else:
            shown = f"rewardstream kafka status --state-dir {other.folder}"
            where = f"recorded in {other.folder}: '{shown}'"
        print(f"a broker runs elsewhere, pid(s) {pids}, {where}", file=sys.stderr)


def _cmd_status(args: argparse.Namespace) -> int:
    folder = args.state_dir or state_dir()
    if not folder.exists():  # nothing recorded: nothing to create
        _not_running(folder)
        return 1
    with state_lock(folder):
        state = running_state(folder)
    if state is None:
        _not_running(folder)
        return 1
    if len(state.brokers) == 1:
        print(f"running bootstrap={state.bootstrap} pid={state.brokers[0].pid}")
        return 0
    pids = ",".join(map(str, state.pids))
    down = ",".join(str(b.pid) for b in state.brokers if not is_our_broker(b))
    if down:
        print(f"degraded bootstrap={state.bootstrap} pids={pids} down={down}")
        return 2
    print(f"running bootstrap={state.bootstrap} pids={pids}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    _cli_logging()
    folder = args.state_dir or state_dir()
    with state_lock(folder):
        state = stop_detached(folder)
    if state is None:
        _not_running(folder)
    elif len(state.brokers) == 1:
        print(f"stopped pid={state.brokers[0].pid}")
    else:
        print(f"stopped pids={','.join(map(str, state.pids))}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    _cli_logging()
    print(fetch_jars())
    return 0


def _one_line(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A ``kafka`` subcommand whose failure (a :class:`KafkaLocalError`, or a folder or file
    it cannot use) is one line on stderr and exit code 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except KafkaLocalError as exc:
            print(f"error: {exc}", file=sys.stderr)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1

    return run


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError("port must be 1-65535 (0 is not allowed)")
    return port


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kafka start|stop|status|fetch``; each sets ``func(args) -> exit code``."""
    kafka = subparsers.add_parser("kafka", help="run a local Kafka broker or 3-broker cluster")
    sub = kafka.add_subparsers(dest="kafka_command", required=True)
    start = sub.add_parser(
        "start", help="start a detached broker or cluster; last stdout line: bootstrap="
    )
    start.add_argument(
        "--port", type=_port, default=None, help="port of the (first) broker (default: free)"
    )
    start.add_argument(
        "--partitions",
        type=_positive,
        default=CLI_PARTITIONS,
        metavar="N",
        help=f"num.partitions of auto-created topics (default {CLI_PARTITIONS}, so a consumer "
        "group of up to that many processors all get partitions; with 1 a second one sits idle)",
    )
    start.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="1 (default): one broker, replication 1; 3: a KRaft cluster of three broker+"
        "controller nodes, replication 3, min ISR 2, so one broker may die without loss",
    )
    start.set_defaults(func=_one_line(_cmd_start))
    stop = sub.add_parser("stop", help="stop the broker(s) this state folder records")
    stop.set_defaults(func=_one_line(_cmd_stop))
    status = sub.add_parser("status", help="are the broker(s) this state folder records running?")
    status.set_defaults(func=_one_line(_cmd_status))
    for command in (start, stop, status):
        command.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            metavar="DIR",
            help="where the broker is recorded: start, status and stop with the same DIR see the "
            "same broker (default: $REWARDSTREAM_KAFKA_STATE_DIR, else .rewardstream/kafka in "
            "the current folder)",
        )
    sub.add_parser("fetch", help="download the broker jars only").set_defaults(
        func=_one_line(_cmd_fetch)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m rewardstream.kafka.local kafka start``) for tests/scripts."""
    parser = argparse.ArgumentParser(prog="rewardstream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)
