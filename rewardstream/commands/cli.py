"""Command-line entry points: ``rewardstream <verb>`` and NeMo Gym's ``ng_*`` names.

Every user error ends as one line on stderr and exit code 2 (never a traceback), and a reader
that goes away (``ng_reward_profile ... | head -2``) ends a command quietly with exit code 141
(:mod:`rewardstream.infra.command`). Each command imports what it
needs when it runs (numpy, pydantic, aiokafka take ~0.4 s to import), so a light one such as
``rewardstream snapshot`` starts in ~0.1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import logging
import math
import re
import signal
import sys
import tempfile
import urllib.error
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from rewardstream.commands import publish as publish_cli
from rewardstream.contract.names import RUN_ID, ProfilePaths, run_id_from
from rewardstream.errors import InputError, ProfileError, RewardstreamError
from rewardstream.infra import http_security
from rewardstream.infra.command import (
    fail,
    override_command,
    package_version,
    run_guarded,
    run_loop,
)
from rewardstream.infra.config_errors import config_error
from rewardstream.infra.guiding_parser import GuidingParser
from rewardstream.infra.jsonl import check_input_file
from rewardstream.infra.overrides import parse_overrides
from rewardstream.kafka import local as kafka_local
from rewardstream.kafka import options as kafka_options
from rewardstream.kafka.options import BOOTSTRAP_HELP

if TYPE_CHECKING:
    from rewardstream.contract.engine import FinalRecord
    from rewardstream.processors.core.stopping import Reason
    from rewardstream.sinks.snapshot_wire import SnapshotHead

__all__ = ["main", "ng_reward_profile"]

_PROFILE_REQUIRED = ("materialized_inputs_jsonl_fpath", "rollouts_jsonl_fpath")
_PROFILE_NAMES = ("+materialized_inputs_jsonl_fpath", "+rollouts_jsonl_fpath")  # in errors
_PROFILE_USAGE = """\
usage: ng_reward_profile +materialized_inputs_jsonl_fpath=M +rollouts_jsonl_fpath=R \
[++allow_partial_rollouts=True] [+quiet=true] [+aggregate_metrics=true [+answer_key=FIELD]
[+interval_level=LEVEL]]

Profile a finished collection: writes R's _reward_profiling.jsonl, _agent_metrics.json and
_repeat_level_metrics.json next to R, as NeMo Gym 0.7.0 does.

overrides (+key=value, ++key=value or key=value):
  +materialized_inputs_jsonl_fpath=PATH  (required) the collection's *_materialized_inputs.jsonl
  +rollouts_jsonl_fpath=PATH             (required) its rollouts .jsonl file
  ++allow_partial_rollouts=BOOL          profile even if some rollouts are missing (false)
  +quiet=BOOL                            no progress bar (false)
  +aggregate_metrics=BOOL                also write R's _aggregate_metrics.json (pass@k,
                                         avg-of-k, majority@k per agent, as NeMo Gym's pass@k
                                         servers compute them), _task_difficulty.json and
                                         _intervals.json (false)
  +answer_key=FIELD                      the result field majority@k votes on (e.g.
                                         extracted_answer); adds the no_answer score
  +interval_level=LEVEL                  the level of _intervals.json's anytime-valid
                                         intervals, in (0, 1) (0.95)

options:
  -h, --help                             show this help and exit
  --version                              show the version and exit"""


def _profile(
    prog: str, config: dict[str, Any], names: tuple[str, str] = ("--inputs", "--rollouts")
) -> int:
    """Profile as ``ng_reward_profile`` does; ``names``: how the user gave the two files, for
    the error that names one."""
    from pydantic import ValidationError

    from rewardstream.processors.batch import ProfileConfig, print_summary, run_profile
    from rewardstream.sinks.files import refuse_inputs

    missing = [k for k in _PROFILE_REQUIRED if k not in config]
    if missing:
        return fail(
            prog,
            f"missing required configuration: {', '.join(missing)}. Provide each via its flag "
            f"(see --help) or as a +{missing[0]}=<value> override.",
        )
    try:
        cfg = ProfileConfig.model_validate(config)
    except ValidationError as exc:
        return fail(prog, config_error(exc.errors(), ProfileConfig.model_fields))
    check_input_file(cfg.materialized_inputs_jsonl_fpath, names[0])
    check_input_file(cfg.rollouts_jsonl_fpath, names[1])
    paths = ProfilePaths.next_to(cfg.rollouts_jsonl_fpath)
    inputs = {cfg.materialized_inputs_jsonl_fpath: names[0], cfg.rollouts_jsonl_fpath: names[1]}
    refuse_inputs([*paths, *paths.extras()], inputs)
    try:
        profile, paths = run_profile(cfg)
    except ProfileError as exc:
        return fail(prog, f"{exc.kind}: {exc}")
    except RewardstreamError as exc:
        return fail(prog, str(exc))
    print_summary(profile, paths, cfg.aggregate_metrics)
    return 0


def ng_reward_profile(argv: Sequence[str] | None = None) -> int:
    """``ng_reward_profile +materialized_inputs_jsonl_fpath=M +rollouts_jsonl_fpath=R``."""
    prog = "ng_reward_profile"
    return override_command(
        prog,
        lambda: _PROFILE_USAGE,
        argv,
        lambda args: _profile(prog, parse_overrides(args), _PROFILE_NAMES),
    )


def _cmd_profile(args: argparse.Namespace) -> int:
    config = parse_overrides(args.overrides)
    for key, value in (
        ("materialized_inputs_jsonl_fpath", args.inputs),
        ("rollouts_jsonl_fpath", args.rollouts),
        ("allow_partial_rollouts", args.allow_partial_rollouts or None),
        ("quiet", args.quiet or None),
        ("aggregate_metrics", args.aggregate_metrics or None),
        ("answer_key", args.answer_key),
        ("interval_level", args.interval_level),
    ):
        if value is not None:
            config[key] = value
    return _profile("rewardstream profile", config)


def _host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` too), or a bare ``PORT`` meaning 127.0.0.1: nothing
    listens beyond loopback unless a host is named."""
    host, colon, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536 or (colon and not host.strip("[]")):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _http_url(text: str) -> str:
    """A processor's URL: ``http(s)://HOST:PORT``, or the forms ``--http`` takes (``HOST:PORT``,
    ``[::1]:PORT``, ``PORT`` on 127.0.0.1), which get ``http://``: the address is usually
    copied from a ``--http`` option."""
    url = f"127.0.0.1:{text}" if text.isdigit() else text
    if "://" not in url:
        url = f"http://{url}"
    parts = urllib.parse.urlsplit(url)
    try:
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is no number, or out of range
        valid = False
    if not valid:
        raise argparse.ArgumentTypeError(
            f"expected http://HOST:PORT, HOST:PORT or PORT, got {text!r}"
        )
    return url


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """A finite number of seconds > 0 (0, a negative number, nan or inf would make a timer
    fire at once or never)."""
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _wait_seconds(text: str) -> float:
    """A finite number of seconds >= 0 (0: do not wait)."""
    value = _finite(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _level(text: str) -> float:
    """A confidence level strictly between 0 and 1."""
    value = _number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1), e.g. 0.95, got {text!r}")
    return value


def _noise_floor(text: str) -> float:
    """A finite difference of mean reward >= 0."""
    value = _number(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _run_pair(text: str) -> tuple[str, str]:
    """``BASELINE:CANDIDATE``, two different run ids (a run id has no colon)."""
    baseline, colon, candidate = text.partition(":")
    ids = (baseline, candidate)
    if not colon or baseline == candidate or not all(re.match(RUN_ID, r) for r in ids):
        raise argparse.ArgumentTypeError(
            f"expected BASELINE_RUN:CANDIDATE_RUN, two different run ids, got {text!r}"
        )
    return baseline, candidate


def _add_rule(parser: argparse.ArgumentParser, prefix: str) -> None:
    """``--[PREFIX]level`` and ``--[PREFIX]noise-floor``: what a comparison is judged by."""
    parser.add_argument(
        f"--{prefix}level",
        type=_level,
        default=0.95,
        metavar="LEVEL",
        help="the difference's level, in (0, 1); each run's interval is taken at 1 - (1 - "
        "LEVEL) / 2 (0.95)",
    )
    parser.add_argument(
        f"--{prefix}noise-floor",
        type=_noise_floor,
        default=0.01,
        metavar="D",
        help="better: the interval is above D; worse: below -D; no difference: within "
        "[-D, D] (0.01)",
    )


def _add_level(parser: argparse.ArgumentParser, where: str) -> None:
    """``--level``: the level of each agent's mean reward interval; ``where``: where it shows."""
    parser.add_argument(
        "--level",
        type=_level,
        default=0.95,
        metavar="LEVEL",
        help=f"the level of each agent's mean reward interval, in (0, 1): {where} (0.95)",
    )


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def _cmd_stream(args: argparse.Namespace) -> int:
    from rewardstream.contract.events import Topics
    from rewardstream.kafka import config as kafka_config
    from rewardstream.processors.core.difference import Rule
    from rewardstream.processors.http.snapshot import SnapshotLimits
    from rewardstream.processors.stream import StreamProcessor

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    processor = StreamProcessor(
        args.bootstrap,
        None if args.output_dir is None else Path(args.output_dir),
        Topics.for_prefix(args.topic_prefix),
        args.group_id,
        checkpoint_every=args.checkpoint_every,
        security=kafka_config.from_args(args),
        max_event_bytes=args.max_event_bytes,
        state_dir=None if args.state_dir is None else Path(args.state_dir),
        advertise=args.advertise_url,
        evict_after=args.evict_after,
        aggregate_metrics=args.aggregate_metrics,
        stall_after=args.stall_after,
        snapshot_limits=SnapshotLimits(
            args.snapshot_timeout, args.max_snapshot_builds, args.max_snapshot_requests
        ),
        idle_timeout=args.http_idle_timeout,
        http_security=http_security.from_args(args),
        compares=args.compare,
        compare_rule=Rule(args.compare_level, args.compare_noise_floor),
        level=args.level,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await processor.run(stop, args.http)

    asyncio.run(main())
    return 0


def _digests(paths: ProfilePaths) -> list[bytes | None]:
    """Each file's SHA-256 (None: absent), to tell a rewritten profile from a changed one."""
    digests: list[bytes | None] = []
    for path in paths:
        try:
            with path.open("rb") as fh:
                digests.append(hashlib.file_digest(fh, "sha256").digest())
        except OSError:
            digests.append(None)
    return digests


def _cmd_replay(args: argparse.Namespace) -> int:
    """Replay is idempotent: the same files into the same folder write the same profile
    again, and a second run says it found one there, unchanged or replaced."""
    from rewardstream.contract.events import BadEvent
    from rewardstream.processors.inprocess import stream_files
    from rewardstream.sinks.files import check_replaceable, profile_lines, refuse_inputs

    inputs, rollouts = Path(args.inputs), Path(args.rollouts)
    check_input_file(inputs, "--inputs")
    check_input_file(rollouts, "--rollouts")
    run_id = args.run_id or run_id_from(rollouts.stem)
    expected = ProfilePaths.next_to(Path(args.output_dir) / run_id / f"{rollouts.stem}.jsonl")
    for path in [*expected, *expected.extras()]:
        check_replaceable(path)  # a device or FIFO there: refused, never read
    refuse_inputs([*expected, *expected.extras()], {inputs: "--inputs", rollouts: "--rollouts"})
    before = _digests(expected)
    try:
        if args.answer_key is not None and not args.aggregate_metrics:
            raise InputError("--answer-key applies with --aggregate-metrics")
        paths = stream_files(
            inputs,
            rollouts,
            Path(args.output_dir),
            run_id,
            aggregate_metrics=args.aggregate_metrics,
            answer_key=args.answer_key,
        )
    except BadEvent as exc:  # the run id or the stem
        value = run_id if exc.field == "run_id" else rollouts.stem
        raise InputError(f"invalid {exc.field} {value!r}: {exc.message}") from None
    print(*profile_lines(paths, args.aggregate_metrics), sep="\n")
    if paths == expected and any(d is not None for d in before):
        folder = paths.reward_profiling.parent
        if before == _digests(paths):
            print(f"Run {run_id} already had this profile in {folder}: written again, unchanged")
        else:
            print(f"Run {run_id} had a different profile in {folder}: replaced by this one")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from rewardstream.kafka import config as kafka_config
    from rewardstream.producers.gym.demo import run_demo

    security = kafka_config.from_args(args)
    run_demo(
        Path(args.output_dir),
        args.bootstrap,
        args.topic_prefix,
        args.repeats,
        args.parallel,
        args.limit,
        security,
    )
    return 0


def _cmd_snapshot(args: argparse.Namespace) -> int:
    head = _snapshot(args, Path(args.out))
    print(
        f"snapshot run_id={head.run_id} rollouts={head.rollouts} inputs={head.inputs} "
        f"offsets={orjson.dumps(head.offsets).decode()} -> {args.out}"
    )
    return 0


def _snapshot(args: argparse.Namespace, out: Path) -> SnapshotHead:
    """Fetch the snapshot of run ``args.run_id`` from the processor at ``args.url`` (with
    the HTTP security options) into ``out``."""
    from rewardstream.sinks.snapshot_wire import receive

    base, security = args.url, http_security.from_args(args)
    url = f"{base.rstrip('/')}/runs/{urllib.parse.quote(args.run_id, safe='')}/snapshot"
    try:
        with http_security.open_url(security, url, "POST", timeout=600) as r:
            return receive(r, out, url)
    except urllib.error.HTTPError as exc:
        said = " ".join(exc.read().decode(errors="replace").split())  # one line
        retry = exc.headers.get("Retry-After")
        again = f" (try again in {retry} s)" if retry else ""
        raise InputError(f"snapshot failed: HTTP {exc.code} {said}{again}"[:1000]) from None
    except urllib.error.URLError as exc:
        raise InputError(f"cannot reach {base}: {exc.reason}") from None
    except (http.client.HTTPException, ConnectionError) as exc:  # the stream broke off
        raise InputError(f"{url}: the snapshot response was cut short ({exc!r})"[:300]) from None


def _cmd_watch(args: argparse.Namespace) -> int:
    from rewardstream.commands.watch import watch

    return watch(
        args.url, args.run_id, args.interval, args.once, http_security.from_args(args), args.level
    )


_FINAL_WAIT = 30.0  # s: a final the processor shows is being read from Kafka


def _cmd_compare(args: argparse.Namespace) -> int:
    from rewardstream.commands.live_compare import TaskFlips, live_compare

    def snapshot(run_id: str, out: Path) -> None:
        _snapshot(_with(args, run_id=run_id), out)

    def final(run_id: str, out: Path) -> None:  # the processor said final: it is in Kafka
        _fetch_final(_with(args, run_id=run_id, timeout=_FINAL_WAIT), out)

    output_dir = None if args.output_dir is None else Path(args.output_dir)
    flips = TaskFlips(snapshot, args.flips_every, final if args.bootstrap else None, output_dir)
    return live_compare(
        args.url,
        args.baseline_run,
        args.candidate_run,
        level=args.level,
        noise_floor=args.noise_floor,
        agent=args.agent,
        interval=args.interval,
        once=args.once,
        as_json=args.json,
        security=http_security.from_args(args),
        flips=flips,
    )


def _with(args: argparse.Namespace, **more: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **more})


def _cmd_curate(args: argparse.Namespace) -> int:
    from rewardstream.sinks.curate import Criteria, curate, find_profile, report_lines

    criteria = Criteria(
        None if args.band is None else tuple(args.band), args.min_std, args.confidence
    )
    criteria.check()  # before anything is fetched
    sources = [args.profile is not None, args.url is not None, args.bootstrap is not None]
    if sum(sources) != 1:
        raise InputError("curate takes one source: a PROFILE, --url or --bootstrap")
    if (args.url or args.bootstrap) and not args.run_id:
        raise InputError("--url and --bootstrap need --run-id")
    with tempfile.TemporaryDirectory(prefix="rewardstream-curate-") as scratch:
        if args.profile is not None:
            profile = find_profile(Path(args.profile))
        elif args.url is not None:
            _snapshot(args, Path(scratch))
            profile = find_profile(Path(scratch))
        else:
            profile = _fetch_final(args, Path(scratch)).reward_profiling
        result = curate(profile, Path(args.out), criteria)
    print(*report_lines(result), sep="\n")
    print(f"curated tasks: {args.out}")
    return 0


def _cmd_profiles_get(args: argparse.Namespace) -> int:
    from rewardstream.sinks.files import profile_lines

    finals: list[FinalRecord] = []
    paths = _fetch_final(args, Path(args.out), finals.append)
    print(*profile_lines(paths), sep="\n")
    if finals and finals[0].skipped:
        print(f"Ended early, rows skipped: {_skipped(finals[0].skipped)}")
    return 0


def _skipped(skipped: Mapping[Reason, int]) -> str:
    """What an early stop left out, per reason: ``above-band:2,below-band:3``."""
    return ",".join(f"{reason}:{n}" for reason, n in sorted(skipped.items()))


def _fetch_final(
    args: argparse.Namespace, out: Path, seen: Callable[[FinalRecord], None] | None = None
) -> ProfilePaths:
    """A run's final profile from Kafka into ``out`` (``--bootstrap``, ``--topic-prefix``,
    ``--group-id``, ``--run-id``, ``--timeout`` and the Kafka security options); ``seen`` is
    handed its final record first."""
    from rewardstream.contract.events import Topics
    from rewardstream.kafka import config as kafka_config
    from rewardstream.sinks.topics.wait import wait_profile

    topics = Topics.for_prefix(args.topic_prefix)
    security = kafka_config.from_args(args)
    return run_loop(
        wait_profile(
            args.bootstrap,
            topics,
            args.group_id,
            args.run_id,
            out,
            args.timeout,
            security,
            True,
            seen=seen,
        )
    )


def _cmd_profiles_list(args: argparse.Namespace) -> int:
    from rewardstream.contract.engine import EngineTopics
    from rewardstream.contract.events import Topics
    from rewardstream.kafka import config as kafka_config
    from rewardstream.sinks.topics.profiles import ensure_topics, list_finals

    topics, security = Topics.for_prefix(args.topic_prefix), kafka_config.from_args(args)
    run_loop(ensure_topics(args.bootstrap, security, topics))
    finals = run_loop(
        list_finals(
            args.bootstrap, security, EngineTopics.of(topics), args.topic_prefix, args.group_id
        )
    )
    for (group, run_id), final in sorted(finals.items()):
        kind = "partial" if final.partial and final.state == "final" else final.state
        early = f"\tskipped={_skipped(final.skipped)}" if final.skipped else ""
        print(
            f"{run_id}\t{kind}\tgroup={group}\trollouts={final.rollouts}"
            f"\texpected={final.expected}\tstem={final.stem}{early}"
        )
    return 0


class _VersionAction(argparse.Action):
    """``--version``, which looks the version up only when asked (see :func:`package_version`)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = GuidingParser(  # subparsers are GuidingParsers too
        prog="rewardstream", description="Streaming reward profiler for LLM RL rollouts."
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="profile a finished collection (ng_reward_profile)")
    p.add_argument("--inputs", help="the *_materialized_inputs.jsonl file")
    p.add_argument("--rollouts", help="the rollouts .jsonl file")
    p.add_argument("--allow-partial-rollouts", action="store_true", help="profile a partial run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--aggregate-metrics",
        action="store_true",
        help="also write _aggregate_metrics.json (pass@k, avg-of-k, majority@k), "
        "_task_difficulty.json and _intervals.json",
    )
    p.add_argument("--answer-key", help="the result field majority@k votes on")
    p.add_argument(
        "--interval-level",
        type=_level,
        metavar="LEVEL",
        help="with --aggregate-metrics: _intervals.json's level, in (0, 1) (0.95)",
    )
    p.add_argument(
        "overrides", nargs="*", help="NeMo Gym overrides, e.g. ++allow_partial_rollouts=True"
    )
    p.set_defaults(func=_cmd_profile)
    st = sub.add_parser("stream", help="run the Kafka stream processor")
    kafka_options.add_option(st, "--bootstrap", BOOTSTRAP_HELP, required=True)
    st.add_argument(
        "--output-dir",
        help="also write each final profile this processor writes to DIR/<run_id>/ (they are "
        "in Kafka in any case: rewardstream profiles get)",
    )
    st.add_argument(
        "--state-dir",
        help="private scratch for this processor's spill files (default: a fresh temporary "
        "folder); it may vanish at any time: state is rebuilt from Kafka",
    )
    st.add_argument(
        "--http",
        type=_host_port,
        help="serve snapshots, parts and metrics on HOST:PORT (PORT: on 127.0.0.1; default "
        "127.0.0.1 on a free port: peers fetch parts from every processor)",
    )
    st.add_argument(
        "--advertise-url",
        type=_http_url,
        help="the http(s)://HOST:PORT (or HOST:PORT) peers reach this processor at (default: "
        "the --http address)",
    )
    kafka_options.add_option(st, "--topic-prefix", "topics <prefix>.inputs, ... (rewardstream)")
    kafka_options.add_option(st, "--group-id", "consumer group (default <prefix>-profiler)")
    st.add_argument(
        "--checkpoint-every",
        type=_seconds,
        default=5.0,
        help=(
            "seconds between offset commits (5); a new owner restores the state checkpoint a "
            "commit names (written when due: at most every 10 s) and replays the rest"
        ),
    )
    st.add_argument(
        "--evict-after",
        type=_seconds,
        default=24 * 3600.0,
        metavar="S",
        help="evict a run with no event for S seconds, unfinished (default 86400)",
    )
    st.add_argument(
        "--stall-after",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="show an open run with no event for S seconds as stalled (rate 0, no ETA) until "
        "its events resume (default 60)",
    )
    st.add_argument(
        "--max-event-bytes",
        type=_positive_int,
        default=1 << 20,
        help="larger events go to the dead-letter topic unparsed, reason 'oversized' (1 MiB)",
    )
    st.add_argument(
        "--aggregate-metrics",
        action="store_true",
        help="every run's snapshots and final carry _aggregate_metrics.json, "
        "_task_difficulty.json and _intervals.json, not only those whose publisher asked",
    )
    st.add_argument(
        "--snapshot-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="a snapshot answers within S seconds: the whole run, or 503 naming what did not "
        "answer (10)",
    )
    st.add_argument(
        "--max-snapshot-builds",
        type=_positive_int,
        default=2,
        metavar="N",
        help="snapshots built at once; requests for a run at the same positions share one, "
        "beyond N others get 429 with Retry-After (2)",
    )
    st.add_argument(
        "--max-snapshot-requests",
        type=_positive_int,
        default=32,
        metavar="N",
        help="snapshot and download requests served at once; beyond N, 429 with Retry-After (32)",
    )
    st.add_argument(
        "--http-idle-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="close an HTTP connection idle for S seconds (30)",
    )
    st.add_argument(
        "--compare",
        type=_run_pair,
        action="append",
        default=[],
        metavar="BASELINE_RUN:CANDIDATE_RUN",
        help="export the candidate-minus-baseline difference of mean reward per agent, its "
        "anytime-valid interval and verdict on /metrics (rewardstream_compare_*); repeatable",
    )
    _add_rule(st, "compare-")
    _add_level(st, "on /runs/<id>, the page, /metrics and the _intervals.json it writes")
    kafka_options.add_arguments(st)
    http_security.add_server_arguments(st)
    st.set_defaults(func=_cmd_stream)
    rp = sub.add_parser(
        "replay", help="stream a collection's files through the in-process pipeline"
    )
    rp.add_argument("--inputs", required=True, help="the *_materialized_inputs.jsonl file")
    rp.add_argument("--rollouts", required=True, help="the rollouts .jsonl file")
    rp.add_argument("--output-dir", required=True, help="the profile goes to DIR/<run_id>/")
    rp.add_argument("--run-id", default=None, help="default: the rollouts file's stem")
    rp.add_argument(
        "--aggregate-metrics",
        action="store_true",
        help="also write _aggregate_metrics.json, _task_difficulty.json and _intervals.json",
    )
    rp.add_argument("--answer-key", metavar="FIELD", help="the result field majority@k votes on")
    rp.set_defaults(func=_cmd_replay)
    sn = sub.add_parser("snapshot", help="fetch a partial profile from a running processor")
    sn.add_argument(
        "--url",
        required=True,
        type=_http_url,
        help="the processor's http://HOST:PORT (its --http; HOST:PORT or PORT also do)",
    )
    sn.add_argument("--run-id", required=True, help="the run to snapshot (see 'profiles list')")
    sn.add_argument("--out", required=True, help="folder for the three profile files")
    http_security.add_client_arguments(sn)
    sn.set_defaults(func=_cmd_snapshot)
    dm = sub.add_parser(
        "demo", help="start the bundled servers, collect the bundled dataset, profile it live"
    )
    dm.add_argument("--output-dir", default="demo-output", help="default ./demo-output")
    kafka_options.add_option(dm, "--bootstrap", f"go through Kafka: {BOOTSTRAP_HELP}")
    kafka_options.add_option(dm, "--topic-prefix", "with --bootstrap: topics <prefix>.*")
    dm.add_argument("--repeats", type=_positive_int, default=4, help="rollouts per task (4)")
    dm.add_argument("--parallel", type=_positive_int, default=32, help="rollouts in flight (32)")
    dm.add_argument("--limit", type=_positive_int, default=None, help="only the first N tasks")
    kafka_options.add_arguments(dm)
    dm.set_defaults(func=_cmd_demo)
    pr = sub.add_parser("profiles", help="final profiles kept in Kafka: list them, get one")
    psub = pr.add_subparsers(dest="profiles_command", required=True)
    get = psub.add_parser("get", help="wait for a run's final profile and write its files")
    kafka_options.add_option(get, "--bootstrap", BOOTSTRAP_HELP, required=True)
    get.add_argument("--run-id", required=True, help="the run (see 'profiles list')")
    get.add_argument("--out", required=True, help="folder for the three profile files")
    get.add_argument(
        "--timeout", type=_wait_seconds, default=0.0, metavar="S", help="wait up to S s (0)"
    )
    lst = psub.add_parser("list", help="the runs with a final (or evicted) record")
    kafka_options.add_option(lst, "--bootstrap", BOOTSTRAP_HELP, required=True)
    for p in (get, lst):
        kafka_options.add_option(p, "--topic-prefix", "topics <prefix>.*")
        kafka_options.add_option(
            p, "--group-id", "the processors' group (default <prefix>-profiler)"
        )
        kafka_options.add_arguments(p)
    get.set_defaults(func=_cmd_profiles_get)
    lst.set_defaults(func=_cmd_profiles_list)
    wa = sub.add_parser("watch", help="a processor's runs as a live table in the terminal")
    wa.add_argument(
        "--url", required=True, type=_http_url, help="the processor's http://HOST:PORT (or PORT)"
    )
    wa.add_argument("--run-id", help="only this run (default: every run the processor knows)")
    wa.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="S", help="poll every S s (2)"
    )
    wa.add_argument("--once", action="store_true", help="print the table once and exit")
    _add_level(wa, "rebuilt from the sums /runs/<id> shows, whatever the processor's --level")
    http_security.add_client_arguments(wa)
    wa.set_defaults(func=_cmd_watch)
    co = sub.add_parser(
        "compare",
        help="a candidate run against a baseline, live: the difference of mean reward per "
        "agent with an interval and a verdict valid however often you look",
    )
    co.add_argument(
        "--url", required=True, type=_http_url, help="the processor's http://HOST:PORT (or PORT)"
    )
    co.add_argument("--baseline-run", required=True, metavar="RUN", help="the baseline run id")
    co.add_argument("--candidate-run", required=True, metavar="RUN", help="the candidate run id")
    _add_rule(co, "")
    co.add_argument("--agent", metavar="NAME", help="only this agent (default: those in both)")
    co.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="S", help="poll every S s (2)"
    )
    co.add_argument("--once", action="store_true", help="print the comparison once and exit")
    co.add_argument("--json", action="store_true", help="the comparison as JSON, a line a poll")
    co.add_argument(
        "--flips-every",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="take the task flips again every S s: a snapshot of each run, seconds of the "
        "processor's work on a large run (60)",
    )
    co.add_argument(
        "--output-dir",
        metavar="DIR",
        help="once both runs are final: their final files in DIR/<run id>/ and gym eval "
        "compare's compare_report.json and .md in DIR",
    )
    kafka_options.add_option(
        co, "--bootstrap", f"with --output-dir: the final files from Kafka: {BOOTSTRAP_HELP}"
    )
    kafka_options.add_option(co, "--topic-prefix", "with --bootstrap: topics <prefix>.*")
    kafka_options.add_option(
        co, "--group-id", "with --bootstrap: the processors' group (default <prefix>-profiler)"
    )
    kafka_options.add_arguments(co)
    http_security.add_client_arguments(co)
    co.set_defaults(func=_cmd_compare)
    cu = sub.add_parser(
        "curate",
        help="write the tasks whose pass rate is in a band (and/or whose reward varies) as "
        "JSONL for the next collection",
    )
    cu.add_argument(
        "profile",
        nargs="?",
        help="a *_reward_profiling.jsonl (final or snapshot), or the folder holding one",
    )
    cu.add_argument("--url", type=_http_url, help="or: snapshot the run from this processor")
    kafka_options.add_option(
        cu, "--bootstrap", f"or: the run's final profile from Kafka: {BOOTSTRAP_HELP}"
    )
    cu.add_argument("--run-id", help="with --url or --bootstrap: the run")
    cu.add_argument("--out", required=True, help="the JSONL file of curated task rows")
    cu.add_argument(
        "--band",
        nargs=2,
        type=float,
        metavar=("LO", "HI"),
        help="keep tasks whose mean reward (pass rate) is in [LO, HI], e.g. 0.2 0.8",
    )
    cu.add_argument(
        "--min-std", type=float, metavar="S", help="keep tasks whose reward std is above S"
    )
    cu.add_argument(
        "--confidence",
        type=float,
        metavar="LEVEL",
        help="with --band: keep tasks whose pass rate's confidence sequence at LEVEL (e.g. "
        "0.95) lies inside the band; other than 0/1 rewards need the run's _intervals.json",
    )
    kafka_options.add_option(cu, "--topic-prefix", "with --bootstrap: topics")
    kafka_options.add_option(cu, "--group-id", "with --bootstrap: the processors' group")
    cu.add_argument(
        "--timeout",
        type=_wait_seconds,
        default=0.0,
        metavar="S",
        help="with --bootstrap: wait S s (0)",
    )
    kafka_options.add_arguments(cu)
    http_security.add_client_arguments(cu)
    cu.set_defaults(func=_cmd_curate)
    publish_cli.add_parser(sub)
    kafka_local.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    def run() -> int:
        args = build_parser().parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)

    return run_guarded("rewardstream", run)


if __name__ == "__main__":
    sys.exit(main())
