r"""``ng_collect_rollouts``: POST every materialized row to its agent's ``/run``.

    ng_collect_rollouts +input_jsonl_fpath=I +output_jsonl_fpath=D/S.jsonl [+agent_name=A] \
        [+num_repeats=N] [+num_samples_in_parallel=P] [+limit=L] [+num_repeats_add_seed=true] \
        [+resume_from_cache=true] [+responses_create_params.temperature=T] \
        [+kafka_bootstrap_servers=HOST:PORT [+kafka_wait_profile=true]]

NeMo Gym's rules: docs/nemo-gym-compat.md §Collection. Files, as NeMo Gym names them:
``D/S_materialized_inputs.jsonl`` (docs/nemo-gym-compat.md §Materialization), ``D/S.jsonl``
(results in completion order, flushed line by line), ``D/S_failures.jsonl`` (one row per failed
attempt) and ``D/S_aggregate_metrics.json``; a new collection (no ``+resume_from_cache``) first
moves what an earlier one left under these names aside, as ``NAME.~N~``. Agents are found by
name on the head server (``+head_server.host/port`` as NeMo Gym, or ``+head_server_url``;
default ``http://127.0.0.1:11000``), or every row goes to ``+agent_url``.

**Failures are never rewards.** A connection error, a timeout or a 5xx (or 429) from ``/run`` is
retried with exponential backoff until the row has had ``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``
attempts (default 3, counting the sidecar rows of earlier runs); every failed attempt becomes a
sidecar row with its class (``agent_request_failed``: no reply; ``agent_run_error``: an error
reply), never a result. Another 4xx is terminal at once. Unlike NeMo Gym, failures always go to
the sidecar (its ``route_failures_to_sidecar``) instead of aborting the run.

With ``+kafka_bootstrap_servers`` every materialized row, ``RunStarted``, each completed rollout
(as it completes) and ``RunFinished`` are published on the wire contract's topics, so a stream
processor profiles the run live. The run id is ``+kafka_run_id`` or ``<stem>-<8 hex>`` derived
from the materialized file's identity (:mod:`rewardstream.producers.publisher.run_id`, as
``rewardstream publish`` derives it): a resumed run keeps its id, a fresh run gets a new one. With
``+kafka_wait_profile=true`` the collector then waits (``+kafka_wait_profile_timeout_s``, 600)
for the processors' final profile and writes it next to the rollouts file, where
``ng_reward_profile`` would put it (``+kafka_group_id``: the processors' group, default
``<prefix>-profiler``).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import random
import re
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from io import FileIO
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

import orjson
import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout
from aiokafka.errors import KafkaError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from tqdm import tqdm

from rewardstream.contract.events import (
    AttemptFailed,
    BadEvent,
    ControlEvent,
    EarlyStop,
    EventKind,
    RowSkipped,
    RunFinished,
    RunStarted,
    Topics,
    checked,
    encode,
)
from rewardstream.contract.names import (
    DEFAULT_TOPIC_PREFIX,
    ProfilePaths,
    check_topic_prefix,
    default_group,
)
from rewardstream.errors import InputError, LineError, RewardstreamError
from rewardstream.gym_servers.base import server_specs
from rewardstream.gym_servers.client import JsonClient
from rewardstream.gym_servers.datasets import resolve_task_sources
from rewardstream.gym_servers.environments import AGENTS, server_for_agent
from rewardstream.infra.command import override_command, run_loop
from rewardstream.infra.config_errors import config_error
from rewardstream.infra.jsonl import parse_line
from rewardstream.infra.overrides import parse_overrides
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.options import normalize_bootstrap
from rewardstream.processors.core.stopping import Verdict
from rewardstream.producers.events import input_event, rollout_event
from rewardstream.producers.gym.early_stop import (
    EarlyStopConfig,
    Skips,
    check_resumed,
    dispatch_order,
    skipped_path,
)
from rewardstream.producers.gym.materialize import MaterializeOptions, materialize, write_rows
from rewardstream.producers.publisher.live import EventSink, KafkaSink
from rewardstream.producers.publisher.run_id import default_run_id
from rewardstream.sinks.files import check_replaceable, profile_lines, write_files
from rewardstream.sinks.topics.content import Conflict, files_content, finals_of_run, refuse
from rewardstream.sinks.topics.decisions import follow_decisions, start_offset
from rewardstream.sinks.topics.pages import page_line
from rewardstream.sinks.topics.wait import wait_profile

__all__ = [
    "CollectConfig",
    "CollectReport",
    "CollectionPaths",
    "HeadServer",
    "Route",
    "Servers",
    "agent_of",
    "collect",
    "head_config",
    "main",
    "metrics_entry",
    "metrics_file",
    "print_closing",
    "routes_of",
    "server_metrics",
    "validated",
    "verify_entry",
]

MAX_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_PARALLEL = 100
_JSON = {"Content-Type": "application/json"}
_STAMPS = ("agent_ref", "task_source", "skills_ref", "_ng_attempt_index", "_ng_rollout_id")
_NOT_AGGREGATED = (
    *("response", "responses_create_params", "ng_agent_observations"),
    *("ng_model_call_capture", "ng_trajectory"),
)

Key = tuple[Any, Any]
_M = TypeVar("_M", bound=BaseModel)
# an /aggregate_metrics answer's groups, in the order 0.7.0 writes them
_METRIC_GROUPS = ("agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics")


class HeadServer(BaseModel):
    """NeMo Gym's ``+head_server.host`` / ``+head_server.port`` (``+head_server_url`` wins)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=11000, gt=0, lt=65536)


class Servers(BaseModel):
    """Where the agents are: NeMo Gym's head server, or one ``+agent_url`` for every agent."""

    model_config = ConfigDict(extra="forbid")

    head_server_url: str | None = None
    head_server: HeadServer = Field(default_factory=lambda: HeadServer())
    agent_url: str | None = None


class CollectConfig(MaterializeOptions, Servers):
    """NeMo Gym's collection keys, plus rewardstream's own (transport, retries, Kafka)."""

    model_config = ConfigDict(extra="forbid")

    input_jsonl_fpath: Path
    output_jsonl_fpath: Path
    config_paths: list[str] | str | None = None  # 0.7.0 takes them (--config); servers' business
    num_samples_in_parallel: int | None = Field(default=None, gt=0)
    resume_from_cache: bool = False
    disable_aggregation: bool = False
    request_timeout_s: float = Field(default=3600.0, gt=0)
    retry_backoff_s: float = Field(default=0.5, ge=0)
    kafka_bootstrap_servers: Annotated[str, AfterValidator(normalize_bootstrap)] | None = None
    kafka_topic_prefix: Annotated[str, AfterValidator(check_topic_prefix)] = DEFAULT_TOPIC_PREFIX
    kafka_run_id: str | None = None
    kafka_group_id: str | None = None
    kafka_wait_profile: bool = False
    kafka_wait_profile_timeout_s: float = Field(default=600.0, gt=0)
    kafka_aggregate_metrics: bool = False
    kafka_answer_key: str | None = None
    early_stop: EarlyStopConfig | None = None
    quiet: bool = False


class CollectionPaths(NamedTuple):
    """The files of one collection, named after ``output_jsonl_fpath`` as NeMo Gym names them."""

    rollouts: Path
    inputs: Path
    failures: Path
    aggregate: Path
    skipped: Path  # the rows an early stop left out (docs/early-stop.md)

    @classmethod
    def of(cls, output: Path) -> CollectionPaths:
        stem = output.stem if output.suffix else output.name
        return cls(
            output,
            output.with_name(f"{stem}_materialized_inputs.jsonl"),
            output.with_name(f"{stem}_failures.jsonl"),
            output.with_name(f"{stem}_aggregate_metrics.json"),
            skipped_path(output),
        )

    def every_file(self) -> list[Path]:
        """These and the profile files of the rollouts (``ng_reward_profile``'s, or the
        streamed profile's): what a fresh collection moves aside."""
        profile = ProfilePaths.next_to(self.rollouts)
        return [*self, *profile, profile.task_difficulty, profile.intervals]


class CollectReport(NamedTuple):
    """What a collection did: the run id its events carry, and counts."""

    run_id: str
    paths: CollectionPaths
    rows: int
    cached: int
    completed: int
    failed: int
    seconds: float
    aggregate_written: bool
    profile: ProfilePaths | None = None  # the streamed final profile (+kafka_wait_profile)
    skipped: Mapping[str, int] | None = None  # rows an early stop left out, per reason


class _Failure(NamedTuple):
    cls: str
    terminal: bool
    type: str
    message: str
    http_status: int | None
    body: str | None

    @classmethod
    def reply(cls, terminal: bool, kind: str, message: str, status: int, raw: bytes) -> _Failure:
        """An unusable reply from ``/run`` (its body kept, cut at 4,000 characters)."""
        body = raw.decode(errors="replace")[:4000]
        return cls("agent_run_error", terminal, kind, message, status, body)

    def stamp(self, row: dict[str, Any]) -> dict[str, Any]:
        return row | {
            "_ng_failure_class": self.cls,
            "_ng_failure_terminal": self.terminal,
            "_ng_failure_type": self.type,
            "_ng_failure_message": self.message,
            "_ng_failure_http_status": self.http_status,
            "_ng_failure_response_body": self.body,
        }


def max_attempts() -> int:
    """``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``: unset, empty, not an integer or < 1 means 3."""
    raw = os.environ.get(MAX_ATTEMPTS_ENV, "").strip()
    if not raw:
        return 3
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        print(
            f"WARNING: {MAX_ATTEMPTS_ENV}={raw!r} is not an integer >= 1; using 3",
            file=sys.stderr,
        )
        return 3
    return value


def _key(row: dict[str, Any]) -> Key:
    return row.get("_ng_task_index"), row.get("_ng_rollout_index")


def agent_of(row: dict[str, Any]) -> str:
    ref = row.get("agent_ref")
    return str(ref.get("name")) if isinstance(ref, dict) else ""


class _Tail(NamedTuple):
    """How a file's end must be repaired before appending (docs/nemo-gym-compat.md §Resume),
    decided by reading only: a final line cut short by a kill is dropped (``keep`` < ``size``), a
    whole one without its newline gets one."""

    size: int
    keep: int
    newline: bool

    @classmethod
    def of(cls, path: Path) -> _Tail:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return cls(0, 0, False)
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return cls(size, size, False)
            back = min(size, 1 << 20)
            while True:
                fh.seek(size - back)
                chunk = fh.read(back)
                nl = chunk.rfind(b"\n")
                if nl >= 0 or back == size:
                    break
                back = min(size, back * 4)
            start = size - back + nl + 1
            fh.seek(start)
            try:
                orjson.loads(fh.read())
            except orjson.JSONDecodeError:
                return cls(size, start, False)
            return cls(size, size, True)

    def repair(self, path: Path) -> None:
        """Apply it: the only change a resume makes to what is already written."""
        if self.keep == self.size and not self.newline:
            return
        with path.open("rb+") as fh:
            if self.keep < self.size:
                fh.truncate(self.keep)
                print(f"Dropped a truncated final line of {path}", file=sys.stderr)
            else:
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")


def _read_rows(path: Path, end: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of every non-blank line (resume skips blank lines,
    docs/nemo-gym-compat.md §Resume) in the first ``end`` bytes (a final line cut short is not
    read)."""
    pos = 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            pos += len(raw)
            if end is not None and pos > end:
                return
            if raw.strip():
                row = parse_line(raw, path, lineno)
                if not isinstance(row, dict):
                    raise LineError(str(path), lineno, "not a JSON object")
                yield lineno, row


class _Plan(NamedTuple):
    rows: list[dict[str, Any]]  # every materialized row
    todo: list[dict[str, Any]]  # the rows to run now, attempt indices stamped
    cached: list[tuple[int, dict[str, Any]]]  # results already in the rollouts file
    prior_failures: dict[Key, int]
    tails: dict[Path, _Tail]  # resume: the repairs to make before appending
    skip_rules: tuple[Any, ...] = ()  # resume: the early-stop rules its skipped rows name
    # resume: the rows an earlier part left without a result that this one will not run (the
    # last failure of each row failed for good; each line of the skipped rows kept)
    gone: tuple[dict[str, Any], ...] = ()
    kept_skips: tuple[dict[str, Any], ...] = ()


def _fresh(cfg: CollectConfig) -> _Plan:
    """The rows of a new collection, in memory: nothing is written yet."""
    rows = materialize(cfg.input_jsonl_fpath, cfg)
    return _Plan(rows, dispatch_order(rows) if cfg.early_stop else list(rows), [], {}, {})


def _start_fresh(paths: CollectionPaths, rows: list[dict[str, Any]]) -> None:
    """Start with no earlier output, as NeMo Gym does, but lose none: every file an earlier
    collection left under these names is moved aside as a numbered backup, ``NAME.~N~`` (GNU
    ``cp --backup=numbered``'s names; one N for the whole set, one more than any it has), then
    the materialized inputs are written. A failed write puts the files back as they were."""
    files = paths.every_file()
    number = 1 + max(map(_backup_number, files))
    moved: list[tuple[Path, Path]] = []
    try:
        for path in files:
            if os.path.lexists(path):
                backup = path.with_name(f"{path.name}.~{number}~")
                os.rename(path, backup)
                moved.append((path, backup))
        write_rows(paths.inputs, rows)
    except BaseException:
        for path, backup in reversed(moved):
            os.rename(backup, path)
        raise
    if moved:
        names = ", ".join(backup.name for _, backup in moved)
        print(
            f"Starting a new collection (resume_from_cache=False); the earlier files are kept "
            f"as {names} in {paths.rollouts.parent}",
            file=sys.stderr,
        )


def _set_aside(skipped: Path) -> None:
    """A resume without the early stop collects the rows an earlier part skipped: their list
    no longer holds, and is kept as a numbered backup."""
    backup = skipped.with_name(f"{skipped.name}.~{1 + _backup_number(skipped)}~")
    os.rename(skipped, backup)
    print(
        f"Resuming without early_stop: the rows it skipped are collected now; their list is "
        f"kept as {backup.name}",
        file=sys.stderr,
    )


def _backup_number(path: Path) -> int:
    """The highest N of the ``PATH.~N~`` backups there are (0: none)."""
    found = glob.glob(f"{glob.escape(str(path))}.~[0-9]*~")
    numbers = (name[len(str(path)) + 2 : -1] for name in found)
    return max((int(n) for n in numbers if n.isdigit()), default=0)


def _resumed(paths: CollectionPaths, attempts: int, early_stop: bool) -> _Plan:
    """What is left to run, read from the files without changing them (see :class:`_Tail`).
    With ``early_stop`` the rows an earlier part skipped stay skipped, and the rest run
    repeat-major; without it they run (and the sidecar is moved aside, :func:`_set_aside`)."""
    sidecars = (paths.rollouts, paths.failures, paths.skipped)
    tails = {p: _Tail.of(p) for p in sidecars if p.exists()}
    rows = [row for _, row in _read_rows(paths.inputs)]
    cached = list(_read_rows(paths.rollouts, tails[paths.rollouts].keep))
    done = {_key(r) for _, r in cached}
    failures: dict[Key, int] = defaultdict(int)
    terminal: set[Key] = set()
    last: dict[Key, dict[str, Any]] = {}
    if paths.failures in tails:
        for _, failure in _read_rows(paths.failures, tails[paths.failures].keep):
            failures[_key(failure)] += 1
            last[_key(failure)] = failure
            if failure.get("_ng_failure_terminal"):
                terminal.add(_key(failure))
    skipped: dict[Key, dict[str, Any]] = {}
    rules: list[Any] = []
    if early_stop and paths.skipped in tails:
        for _, line in _read_rows(paths.skipped, tails[paths.skipped].keep):
            skipped[_key(line)] = line
            if line.get("early_stop") not in rules:
                rules.append(line.get("early_stop"))
    todo = []
    for row in dispatch_order(rows) if early_stop else rows:
        key = _key(row)
        if key in done or key in skipped or key in terminal or failures[key] >= attempts:
            continue
        todo.append(row | {"_ng_attempt_index": failures[key]} if failures[key] else row)
    also = f", {len(skipped)} skipped by the early stop" if skipped else ""
    print(
        f"Resuming: {len(done)} rollouts cached{also}, {len(todo)} of {len(rows)} rows to run",
        file=sys.stderr,
    )
    running = {_key(row) for row in todo}
    gone = tuple(f for key, f in last.items() if key not in done and key not in running)
    return _Plan(
        rows, todo, cached, dict(failures), tails, tuple(rules), gone, tuple(skipped.values())
    )


def _check_outputs(cfg: CollectConfig, paths: CollectionPaths, resume: bool) -> None:
    """Refuse, before anything is read back or written, outputs that cannot be written or
    must not be replaced: a directory, device, FIFO or socket at an output path (replacing
    it would destroy it), an output that is the input file, a folder that cannot be written."""
    try:
        source: os.stat_result | None = os.stat(cfg.input_jsonl_fpath)
    except OSError:
        source = None  # materialize() says why
    for path in paths.every_file():
        st = check_replaceable(path, f" (+output_jsonl_fpath={cfg.output_jsonl_fpath})")
        if st is None:
            continue
        if source is not None and (st.st_dev, st.st_ino) == (source.st_dev, source.st_ino):
            raise InputError(
                f"Cannot write '{path}': it is the input file "
                f"(+input_jsonl_fpath={cfg.input_jsonl_fpath}); choose another "
                "+output_jsonl_fpath"
            )
        if resume and path in (paths.rollouts, paths.failures) and not os.access(path, os.W_OK):
            raise InputError(f"Cannot write '{path}': Permission denied")
    _check_folder(paths.rollouts.parent)


def _check_folder(folder: Path) -> None:
    """The outputs' folder can take new files: a probe file is created and removed there (or,
    for a folder still to be made, its nearest existing ancestor is writable)."""
    if not folder.exists():
        ancestor = folder
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise InputError(f"Cannot create '{folder}': '{ancestor}' is not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise InputError(f"Cannot create '{folder}': '{ancestor}' is not writable")
        return
    if not folder.is_dir():
        raise InputError(f"Cannot write in '{folder}': Not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".rewardstream-probe.", dir=folder)
    except OSError as exc:
        raise InputError(f"Cannot write in '{folder}': {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


def _write_line(fh: FileIO, path: Path, data: bytes) -> None:
    """Write all of ``data`` (unbuffered: on the disk, or failed, when this returns); a failure
    (ENOSPC, EFBIG, EIO) is one line naming the file."""
    try:
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += fh.write(view[done:]) or 0
    except OSError as exc:
        raise InputError(
            f"Cannot write '{path}': {exc.strerror or exc}; the collection stopped "
            "(+resume_from_cache=true continues it)"
        ) from None


def _holds_data(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


async def _check_reachable(urls: dict[str, str], rollouts: Path) -> None:
    """Each agent accepts a connection (the only check that fits every agent: their one
    contract is ``POST /run``). Made only before a new collection moves earlier results aside:
    otherwise an agent that is down costs nothing, and its rows fail as request failures."""
    for agent, url in sorted(urls.items()):
        parts = urlsplit(url)
        try:
            async with asyncio.timeout(10):
                _, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            writer.close()
            await writer.wait_closed()
        except (OSError, TimeoutError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            raise InputError(
                f"Could not connect to agent {agent!r} at {url} ({reason}); the earlier "
                f"results in {rollouts.parent} were left as they are. Start the servers "
                "(ng_run), or fix +head_server_url/+agent_url"
            ) from None


class Route(NamedTuple):
    """Where an agent's rows go: ``url`` (``/run`` and ``/aggregate_metrics`` under it) and,
    through an environment server, its instance name and implementation, which every result
    is stamped with (``_ng_environment_server``, ``_ng_result_type``) as 0.7.0 stamps them."""

    url: str
    server: str | None = None
    kind: str | None = None


def _head(cfg: Servers) -> str:
    address = f"http://{cfg.head_server.host}:{cfg.head_server.port}"
    return (cfg.head_server_url or address).rstrip("/")


async def head_config(cfg: Servers) -> dict[str, Any]:
    """The running config, from the head server's ``/global_config_dict_yaml``."""
    head = _head(cfg)
    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=30)) as session,
            session.get(f"{head}/global_config_dict_yaml") as r,
        ):
            text = orjson.loads(await r.read()) if r.status == 200 else None
        config = yaml.safe_load(text) if isinstance(text, str) else None
    except (ClientError, TimeoutError, orjson.JSONDecodeError, yaml.YAMLError):
        config = None
    if not isinstance(config, dict):
        raise InputError(
            f"Could not connect to the head server at {head}. Start the servers (ng_run), or "
            "pass +head_server_url=... or +agent_url=..."
        )
    return config


async def routes_of(
    cfg: Servers, agents: set[str], config: dict[str, Any] | None = None
) -> dict[str, Route]:
    """Each agent's route: ``+agent_url`` for all (no environment server), or, as NeMo Gym
    0.7.0 resolves it, the environment server fronting the agent in the head server's config
    (``config``, else fetched; agents by instance name)."""
    if cfg.agent_url:
        if not cfg.agent_url.startswith("http://"):
            raise InputError(f"+agent_url={cfg.agent_url}: only http:// agents are supported")
        return dict.fromkeys(agents, Route(cfg.agent_url.rstrip("/")))
    head = _head(cfg)
    if config is None:
        config = await head_config(cfg)
    served = {s.name for s in server_specs(config) if s.server_type == AGENTS}
    missing = sorted(agents - served)
    if missing:
        raise InputError(
            f"agent(s) {missing} not served by the head server at {head} (it has: {sorted(served)})"
        )
    routes = {}
    for agent in sorted(agents):
        server = server_for_agent(config, agent)
        host = server.config.get("host") or "127.0.0.1"
        routes[agent] = Route(
            f"http://{host}:{server.config.get('port')}", server.name, server.impl
        )
    return routes


class _Collector:
    """Runs the rows with bounded concurrency and writes every outcome as it completes."""

    def __init__(
        self,
        cfg: CollectConfig,
        paths: CollectionPaths,
        sink: EventSink | None,
        run_id: str,
        attempts: int,
        plan: _Plan,
        routes: dict[str, Route],
        skips: Skips | None,
    ) -> None:
        self.cfg, self.paths, self.sink, self.run_id = cfg, paths, sink, run_id
        self.attempts, self.plan, self.routes, self.skips = attempts, plan, routes, skips
        self.line = plan.cached[-1][0] if plan.cached else 0  # the rollouts file's last line
        self.completed = self.failed = 0
        self.reward_sum: dict[str, float] = defaultdict(float)
        self.reward_n: dict[str, int] = defaultdict(int)
        self.kept: list[dict[str, Any]] = []  # for aggregation: results without their bulk
        self.unsent: set[Key] = set()  # rows whose input event Kafka could not take
        self.unsent_results: set[Key] = set()  # results whose event Kafka could not take
        self.withheld = 0  # rollout events not sent for them (see :meth:`publish`)
        # unbuffered: each line is on the disk (or its failure raised) once written
        self._results = paths.rollouts.open("ab", buffering=0)
        self._sidecars: list[FileIO] = []  # failures, then skipped rows
        self._skipped: FileIO | None = None
        try:
            self._failures = paths.failures.open("ab", buffering=0)
            self._sidecars.append(self._failures)
            if skips is not None:
                self._skipped = paths.skipped.open("ab", buffering=0)
                self._sidecars.append(self._skipped)
        except BaseException:
            self.close()
            raise
        self._postfix_at = 0.0

    def close(self) -> None:
        for fh in (self._results, *self._sidecars):
            fh.close()

    async def run(self) -> None:
        """Announce the run, replay the cached results, run the rest."""
        plan, sink, cfg = self.plan, self.sink, self.cfg
        if sink is not None:
            early = self.skips.early if self.skips is not None else None
            started = _run_started(cfg, self.run_id, self.paths, len(plan.rows), early)
            self.unsent = await _send_inputs(sink, plan.rows, self.run_id, self.paths.inputs)
            await _control(sink, started)
            for failed in plan.gone:  # a resume: said again, as its run_started starts over
                await _control(sink, _failed_event(failed, self.run_id, True))
            for line in plan.kept_skips:
                await _control(sink, _skipped_event(line, self.run_id))
        for lineno, result in plan.cached:
            await self.publish(result, lineno)
            if self.skips is not None:
                self.skips.fold(result, result)
        if self.skips is not None:  # a resume: refolded in dispatch order, not the file's
            waiting = {_key(row) for row in plan.todo}
            for row in plan.rows:
                if _key(row) not in waiting:  # its result is in, or none will come
                    self.skips.settled(row)
        run_urls = {agent: f"{route.url}/run" for agent, route in self.routes.items()}
        bar = tqdm(
            total=len(plan.todo),
            desc=f"Collecting {self.paths.rollouts.name}",
            unit=" rollouts",
            disable=cfg.quiet or not sys.stderr.isatty(),
            mininterval=0.25,
        )
        todo = iter(plan.todo)
        client = JsonClient()

        async def worker() -> None:
            for row in todo:
                if not await self.skipped(row):
                    prior = plan.prior_failures.get(_key(row), 0)
                    await self.run_row(client, run_urls[agent_of(row)], row, prior)
                    if self.skips is not None:  # failed for good: no result holds the fold
                        self.skips.settled(row)
                bar.update(1)
                self.postfix(bar)

        parallel = cfg.num_samples_in_parallel or DEFAULT_PARALLEL
        try:
            with bar:
                await _all(worker() for _ in range(min(parallel, len(plan.todo))))
                self.postfix(bar, force=True)
        finally:
            await client.close()
        if sink is not None:
            skipped = dict(self.skips.counts) if self.skips and self.skips.counts else None
            await _control(sink, RunFinished(run_id=self.run_id, skipped=skipped))

    async def skipped(self, row: dict[str, Any]) -> bool:
        """Whether a decision covers the row: then its sidecar line is written, and published
        (the processors' sequences go on past it), not run."""
        if self.skips is None or self._skipped is None:
            return False
        line = self.skips.skip(row)
        if line is None:
            return False
        _write_line(
            self._skipped, self.paths.skipped, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        )
        if self.sink is not None:
            await _control(self.sink, _skipped_event(line, self.run_id))
        return True

    def keep(self, result: dict[str, Any]) -> None:
        """Hold what ``/aggregate_metrics`` is sent (docs/nemo-gym-compat.md §Aggregate
        metrics)."""
        if not self.cfg.disable_aggregation:
            self.kept.append(verify_entry(result))

    async def post(
        self, client: JsonClient, url: str, row: dict[str, Any]
    ) -> dict[str, Any] | _Failure:
        """One attempt at ``/run``."""
        try:
            async with asyncio.timeout(self.cfg.request_timeout_s):
                status, raw = await client.request(url, orjson.dumps(row))
        except TimeoutError:
            message = f"no reply within {self.cfg.request_timeout_s:g}s"
            return _Failure("agent_request_failed", False, "TimeoutError", message, None, None)
        except (OSError, EOFError, ValueError, IndexError) as exc:  # refused, reset, garbled
            message = str(exc) or repr(exc)
            return _Failure("agent_request_failed", False, type(exc).__name__, message, None, None)
        if status >= 300:
            retry = status >= 500 or status == 429
            return _Failure.reply(not retry, "HTTPError", f"HTTP {status}", status, raw)
        try:
            result = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _Failure.reply(True, "JSONDecodeError", str(exc), status, raw)
        if not isinstance(result, dict):
            return _Failure.reply(True, "TypeError", "not a JSON object", status, raw)
        return result

    async def run_row(self, client: JsonClient, url: str, row: dict[str, Any], prior: int) -> None:
        """Run one row until it succeeds, fails terminally, or has had every attempt."""
        attempt = prior
        while True:
            outcome = await self.post(client, url, row)
            if not isinstance(outcome, _Failure):
                await self.result(outcome, row)
                return
            attempt += 1
            last = outcome.terminal or attempt >= self.attempts
            await self.failure(outcome.stamp(row) | self.served(row), last)
            if last:
                return
            delay = self.cfg.retry_backoff_s * 2 ** (attempt - prior - 1)
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            row = row | {"_ng_attempt_index": attempt}

    def served(self, row: dict[str, Any]) -> dict[str, str]:
        """The environment server stamps of a row's outcome (none without a server)."""
        route = self.routes.get(agent_of(row))
        if route is None or route.server is None or route.kind is None:
            return {}
        return {"_ng_environment_server": route.server, "_ng_result_type": route.kind}

    async def failure(self, failed: dict[str, Any], last: bool) -> None:
        """Write a failed attempt's sidecar row; then publish it (the live failure rate;
        ``last``: no attempt of the row follows in this collection, so it will have no result
        and the processors' sequences go on past it)."""
        line = orjson.dumps(failed, option=orjson.OPT_APPEND_NEWLINE)
        _write_line(self._failures, self.paths.failures, line)
        self.failed += 1
        if self.sink is not None:
            await _control(self.sink, _failed_event(failed, self.run_id, last))

    async def result(self, result: dict[str, Any], row: dict[str, Any]) -> None:
        """Stamp (docs/nemo-gym-compat.md §Dispatch and stamping), route, write and flush one
        result; then publish it."""
        result["_ng_task_index"] = row["_ng_task_index"]
        result["_ng_rollout_index"] = row["_ng_rollout_index"]
        for key in _STAMPS:
            if key in row:
                result[key] = row[key]
        result |= self.served(row)
        if result.get("_ng_no_persist"):  # written nowhere, but published: no result comes
            if self.sink is not None:
                gone = result | {"_ng_failure_class": "no_persist"}
                await _control(self.sink, _failed_event(gone, self.run_id, True))
            return
        if result.get("_ng_failure_class") is not None:
            await self.failure(result, True)  # a reply: not retried
            return
        line = orjson.dumps(result, option=orjson.OPT_APPEND_NEWLINE)
        _write_line(self._results, self.paths.rollouts, line)
        self.line += 1
        self.completed += 1
        if self.skips is not None:
            self.skips.fold(row, result)
        await self.publish(result, self.line)
        reward = result.get("reward")
        if isinstance(reward, int | float):
            agent = agent_of(row)
            self.reward_sum[agent] += reward
            self.reward_n[agent] += 1

    async def publish(self, result: dict[str, Any], line: int) -> None:
        """Send the result's event, unless its input row's event could not be sent: without
        its input row, the processors could not profile the run at all (a result without its
        row), while without both they write a partial profile of the rest, flagged as such."""
        self.keep(result)
        if self.sink is not None:
            if _key(result) in self.unsent:
                self.withheld += 1
                return
            answer_key = self.cfg.kafka_answer_key
            event = rollout_event(result, self.run_id, self.paths.rollouts, line, answer_key)
            where = f"{self.paths.rollouts}:{line}"
            if not await self.sink.send(event.kind, event.key, event.value, where):
                self.unsent_results.add(_key(result))  # the processors will never have it:
                unsent = result | {"_ng_failure_class": "unpublished"}  # their sequences go on
                await _control(self.sink, _failed_event(unsent, self.run_id, True))

    def postfix(self, bar: tqdm[Any], force: bool = False) -> None:
        """The running mean reward per agent, at most twice a second."""
        now = time.monotonic()
        if force or now - self._postfix_at >= 0.5:
            self._postfix_at = now
            means = ", ".join(
                f"{a}={self.reward_sum[a] / n:.3f}" for a, n in sorted(self.reward_n.items())
            )
            bar.set_postfix_str(f"mean reward: {means}" if means else "", refresh=False)


def _run_started(
    cfg: CollectConfig,
    run_id: str,
    paths: CollectionPaths,
    expected: int,
    early_stop: EarlyStop | None = None,
) -> RunStarted:
    """The run's ``RunStarted``; a run id, stem or answer key the contract refuses is one line."""
    stem = paths.rollouts.stem
    try:
        return checked(
            RunStarted(
                run_id=run_id,
                expected_rollouts=expected,
                output_stem=stem,
                aggregate_metrics=cfg.kafka_aggregate_metrics,
                answer_key=cfg.kafka_answer_key,
                early_stop=early_stop,
            )
        )
    except BadEvent as exc:
        value = run_id if exc.field == "run_id" else stem
        raise InputError(f"invalid {exc.field} {value!r}: {exc.message}") from None


async def _all(coros: Iterator[Coroutine[Any, Any, None]]) -> None:
    """Await them all; the first error cancels the others (and is raised as itself)."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _failed_event(failed: dict[str, Any], run_id: str, last: bool) -> AttemptFailed:
    """The wire event of a sidecar row (an agent's own ``_ng_failure_class`` that is not a word
    is sent as ``other``); ``terminal`` when it is the row's ``last`` attempt in this collection
    (its sidecar row says ``_ng_failure_terminal`` only when no attempt may ever follow: a
    resume with more attempts retries the others)."""
    cls = failed.get("_ng_failure_class")
    word = isinstance(cls, str) and re.fullmatch(r"\w{1,64}", cls) is not None
    agent = agent_of(failed)
    return AttemptFailed(
        run_id=run_id,
        task=failed["_ng_task_index"],
        rollout=failed["_ng_rollout_index"],
        attempt=failed.get("_ng_attempt_index") or 0,
        agent=agent or None,
        failure_class=cls if word and isinstance(cls, str) else "other",
        terminal=last or bool(failed.get("_ng_failure_terminal")),
    )


def _skipped_event(line: dict[str, Any], run_id: str) -> RowSkipped:
    """The wire event of a ``_skipped.jsonl`` line."""
    return RowSkipped(
        run_id=run_id,
        task=line["_ng_task_index"],
        rollout=line["_ng_rollout_index"],
        agent=line["agent"] or None,
        reason=line["reason"],
    )


async def _control(sink: EventSink, event: ControlEvent) -> None:
    await sink.send("control", event.run_id.encode(), encode(event))


async def _send_inputs(
    sink: EventSink, rows: list[dict[str, Any]], run_id: str, path: Path
) -> set[Key]:
    """Send every row's input event; returns the keys of those the sink could not send."""
    kind: EventKind = "input"
    unsent: set[Key] = set()
    for lineno, row in enumerate(rows, 1):
        event = input_event(row, run_id, path, lineno)
        if not await sink.send(kind, event.key, event.value, f"{path}:{lineno}"):
            unsent.add(_key(row))
    return unsent


async def collect(
    cfg: CollectConfig, sink: EventSink | None = None, resume_command: str | None = None
) -> CollectReport:
    """Materialize (or resume), run every row, write the files; see the module docstring.

    Nothing is written before the collection can start: the output paths and their folder,
    the head server (when rows are to run) and Kafka are checked first, so a failed start
    leaves every earlier output as it was, byte for byte. (On a failed connection, as NeMo Gym
    does, the materialized inputs are still written, but only where no collection is yet.)

    ``sink`` receives the run's events (a Kafka sink is made from ``kafka_bootstrap_servers``
    when none is given). It is always closed here, finished only if the collection was. The
    live side channel never stops the collection: what it could not send is reported, and a
    broker that cannot be reached at the start only turns the live view off (one line).

    Cancelled (Ctrl-C, SIGTERM) once the outputs changed, it says how many rollouts are
    written and how to resume (``resume_command``: the command line that does).
    """
    began = time.perf_counter()
    finished = False
    live_off: str | None = None  # why the Kafka sink could not start
    try:
        paths = CollectionPaths.of(cfg.output_jsonl_fpath)
        attempts = max_attempts()
        resume = cfg.resume_from_cache and paths.inputs.exists() and paths.rollouts.exists()
        if cfg.resume_from_cache and not resume:
            print(
                "Skipping resume_from_cache because the materialized inputs or the rollouts "
                "file does not exist yet",
                file=sys.stderr,
            )
        _check_outputs(cfg, paths, resume)
        plan = _resumed(paths, attempts, cfg.early_stop is not None) if resume else _fresh(cfg)
        security = KafkaSecurity.from_env() if cfg.kafka_bootstrap_servers else None
        if sink is not None or security is not None:  # refused before any file is written
            _run_started(cfg, cfg.kafka_run_id or "run", paths, len(plan.rows))
        try:
            config = None
            if any(not agent_of(r) for r in plan.rows):  # rows that name only a task_source
                if cfg.agent_url:
                    raise InputError(
                        "rows that name only a task_source need the head server's config to "
                        "find their agent: pass +head_server... instead of +agent_url"
                    )
                config = await head_config(cfg)
                resolve_task_sources(plan.rows, config)
            early = cfg.early_stop.wire(plan.rows) if cfg.early_stop is not None else None
            if early is not None:
                check_resumed(early, plan.skip_rules, paths.skipped)
            agents = {agent_of(r) for r in plan.rows}
            routes = await routes_of(cfg, agents, config) if plan.todo else {}
            urls = {agent: route.url for agent, route in routes.items()}
            if sink is None and cfg.kafka_bootstrap_servers and security is not None:
                topics = Topics.for_prefix(cfg.kafka_topic_prefix)
                try:
                    sink = await KafkaSink(cfg.kafka_bootstrap_servers, topics, security).start()
                except InputError as exc:  # a side channel: the files are the record
                    live_off = str(exc)
                    _say_live_off(cfg, paths, live_off)
            if sink is not None and await _final_already(cfg, paths, plan, resume, security):
                await sink.close(finished=False)  # its final is of these files: nothing to send
                sink = None
            if not resume and any(_holds_data(p) for p in paths):
                await _check_reachable(urls, paths.rollouts)  # they would be moved aside for it
        except RewardstreamError:
            if not resume and not paths.inputs.exists() and not paths.rollouts.exists():
                # as NeMo Gym, which writes it before it needs any server; nothing is lost
                with contextlib.suppress(RewardstreamError, OSError):
                    paths.inputs.parent.mkdir(parents=True, exist_ok=True)
                    write_rows(paths.inputs, plan.rows)
            raise
        try:  # from here on the outputs change
            paths.rollouts.parent.mkdir(parents=True, exist_ok=True)
            if resume:
                for path, tail in plan.tails.items():
                    tail.repair(path)
                if cfg.early_stop is None and paths.skipped.exists():
                    _set_aside(paths.skipped)
            else:
                _start_fresh(paths, plan.rows)
            # after _start_fresh wrote the inputs file, which a resume never rewrites: run_id
            run_id = cfg.kafka_run_id or default_run_id(paths.inputs, paths.rollouts.stem)
            # the processors decide when the run streams to them, else the collector alone
            follows = isinstance(sink, KafkaSink) and security is not None
            skips = None if early is None else Skips(early, not follows, plan.rows)
            collector = _Collector(cfg, paths, sink, run_id, attempts, plan, routes, skips)
        except OSError as exc:  # files only: no network in this block
            where = exc.filename or paths.rollouts
            raise InputError(f"Cannot write '{where}': {exc.strerror or exc}") from None
        if sink is not None and cfg.kafka_bootstrap_servers and security is not None:
            # what to give rewardstream watch, snapshot or profiles get, and the page
            topics = Topics.for_prefix(cfg.kafka_topic_prefix)
            page = await page_line(cfg.kafka_bootstrap_servers, security, topics, run_id)
            print(
                f"rewardstream: streaming run {run_id} to Kafka "
                f"{cfg.kafka_bootstrap_servers} (topics {cfg.kafka_topic_prefix}.*); {page}",
                file=sys.stderr,
                flush=True,
            )
        follower = None
        if skips is not None and skips.stopper is None and security is not None:
            follower = await _follow(cfg, security, run_id, resume, skips)
        try:
            await collector.run()
        except asyncio.CancelledError:
            written = len(plan.cached) + collector.completed
            how = f"; to resume: {resume_command}" if resume_command else ""
            print(
                f"Interrupted: {written} rollouts written to {paths.rollouts}{how}",
                file=sys.stderr,
                flush=True,
            )
            raise
        finally:
            collector.close()
            if follower is not None:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
        finished = True
    finally:
        if sink is not None:
            await sink.close(finished)
    live_error = sink.error if sink is not None else live_off
    aggregated = await _aggregate(cfg, paths, collector.kept, routes) if collector.kept else False
    persisted = len(plan.cached) + collector.completed
    if plan.todo and not persisted:
        raise CollectionFailed(
            f"None of the {len(plan.todo)} dispatched rollouts produced a result; the "
            f"failures are in {paths.failures}"
        )
    if collector.withheld and live_error is None:
        print(
            f"WARNING: run {run_id}: {len(collector.unsent)} input rows were too large for "
            f"Kafka, so the streamed profile leaves out their {collector.withheld} rollouts "
            f"(it is partial); {paths.rollouts} has them all",
            file=sys.stderr,
        )
    profile = None
    if cfg.kafka_wait_profile and cfg.kafka_bootstrap_servers:
        if live_error is not None:
            raise InputError(
                f"no streamed profile: publishing to Kafka failed ({live_error}); the "
                f"collected files are complete: {paths.rollouts}"
            )
        unsent = (collector.unsent, collector.unsent_results)
        content = await asyncio.to_thread(
            files_content, paths.inputs, paths.rollouts, run_id, cfg.kafka_answer_key, unsent
        )
        profile = await wait_profile(
            cfg.kafka_bootstrap_servers,
            Topics.for_prefix(cfg.kafka_topic_prefix),
            cfg.kafka_group_id,
            run_id,
            paths.rollouts.parent,
            cfg.kafka_wait_profile_timeout_s,
            of=(content, str(paths.rollouts), _NEW_RUN),
        )
    return CollectReport(
        run_id,
        paths,
        len(plan.rows),
        len(plan.cached),
        collector.completed,
        collector.failed,
        time.perf_counter() - began,
        aggregated,
        profile,
        {str(k): n for k, n in skips.counts.items()} if skips is not None else None,
    )


async def _follow(
    cfg: CollectConfig, security: KafkaSecurity, run_id: str, resume: bool, skips: Skips
) -> asyncio.Task[None]:
    """Start following the processors' decisions about the run (all of them on a resume, else
    those after the topic's end now, before the run is announced). Decisions only save work:
    a failure to read them says so and the collection goes on in full."""
    assert cfg.kafka_bootstrap_servers is not None
    bootstrap, topics = cfg.kafka_bootstrap_servers, Topics.for_prefix(cfg.kafka_topic_prefix)
    group = cfg.kafka_group_id or default_group(cfg.kafka_topic_prefix)
    start = 0 if resume else await start_offset(bootstrap, security, topics)

    def take(verdict: Verdict) -> None:
        first = not skips.decided
        skips.take(verdict)
        if first:  # say that decisions come (once it is in force)
            what = f"task {verdict.task}" if verdict.task is not None else "all its rows"
            print(
                f"rewardstream: early stop: first decision of group {group} for run {run_id}: "
                f"{verdict.reason}, {what} of agent {verdict.agent!r}",
                file=sys.stderr,
                flush=True,
            )

    async def follow() -> None:
        try:
            await follow_decisions(bootstrap, security, topics, group, run_id, start, take)
        except (KafkaError, RewardstreamError) as exc:
            print(f"WARNING: early stop off, decisions unreadable: {exc}", file=sys.stderr)

    return asyncio.create_task(follow())


def _say_live_off(cfg: CollectConfig, paths: CollectionPaths, why: str) -> None:
    """The one line of a collection that goes on without its live view: why, and the command
    that publishes its files afterwards."""
    assert cfg.kafka_bootstrap_servers is not None
    command = ["rewardstream", "publish", "--inputs", str(paths.inputs)]
    command += ["--rollouts", str(paths.rollouts), "--bootstrap", cfg.kafka_bootstrap_servers]
    if cfg.kafka_topic_prefix != CollectConfig.model_fields["kafka_topic_prefix"].default:
        command += ["--topic-prefix", cfg.kafka_topic_prefix]
    print(
        f"WARNING: the live view is off: {why}; the collection goes on and its files are "
        f"written; publish them afterwards: {shlex.join(command)}",
        file=sys.stderr,
        flush=True,
    )


_NEW_RUN = "collect with a new +kafka_run_id"


async def _final_already(
    cfg: CollectConfig,
    paths: CollectionPaths,
    plan: _Plan,
    resume: bool,
    security: KafkaSecurity | None,
) -> bool:
    """Whether the run has its final profile already, of these very files, with nothing left
    to run (nothing to send). A final of other content, or one that the rows left to run (a
    new collection, under a run id given again) could not enter, is refused up front:
    :class:`~rewardstream.sinks.topics.content.Conflict`."""
    if not (resume or cfg.kafka_run_id) or not cfg.kafka_bootstrap_servers:
        return False  # a fresh collection's default run id is new (a new inputs file)
    run_id = cfg.kafka_run_id or default_run_id(paths.inputs, paths.rollouts.stem)
    topics = Topics.for_prefix(cfg.kafka_topic_prefix)
    security = security or KafkaSecurity.from_env()
    finals = await finals_of_run(cfg.kafka_bootstrap_servers, security, topics, run_id)
    if not finals:
        return False
    if not resume or plan.todo:
        what = f"the {len(plan.todo)} rows left to run" if resume else "a new collection"
        raise Conflict(
            f"run {run_id!r} has a final profile already: {what} cannot enter it; {_NEW_RUN}"
        )
    content = await asyncio.to_thread(
        files_content, paths.inputs, paths.rollouts, run_id, cfg.kafka_answer_key
    )
    for final in finals:
        refuse(final, content, str(paths.rollouts), _NEW_RUN)
    return True


class CollectionFailed(RewardstreamError):
    """Nothing at all was collected (every row failed)."""


def verify_entry(result: dict[str, Any]) -> dict[str, Any]:
    """What ``/aggregate_metrics`` is sent of a result (docs/nemo-gym-compat.md §Aggregate
    metrics): the result without its bulk, and of its response only ``usage`` and
    ``incomplete_details``."""
    entry = {k: v for k, v in result.items() if k not in _NOT_AGGREGATED}
    response = result.get("response")
    if isinstance(response, dict):
        extra = {
            k: response[k] for k in ("usage", "incomplete_details") if response.get(k) is not None
        }
        if extra:
            entry["response"] = extra
    return entry


def metrics_entry(agent: str, server: str | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """One agent's entry of ``S_aggregate_metrics.json``, in 0.7.0's shape: ``agent_ref``,
    ``_ng_environment_server``, the four metric groups, ``perf_summary`` only when there is
    one."""
    entry: dict[str, Any] = {"agent_ref": {"name": agent}}
    if server is not None:
        entry["_ng_environment_server"] = server
    entry |= {k: metrics.get(k) for k in _METRIC_GROUPS}
    if metrics.get("perf_summary") is not None:
        entry["perf_summary"] = metrics["perf_summary"]
    return entry


def metrics_file(entries: list[dict[str, Any]]) -> bytes:
    """``S_aggregate_metrics.json`` as 0.7.0 writes it (two-space indent, no final newline)."""
    return orjson.dumps(entries, option=orjson.OPT_INDENT_2)


async def server_metrics(
    kept: list[dict[str, Any]], routes: dict[str, Route]
) -> list[dict[str, Any]] | None:
    """Each agent's metrics from its server's ``/aggregate_metrics`` (through its environment
    server), over ``kept`` in task and rollout order; None (with a warning) when one fails."""
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in sorted(kept, key=lambda e: (e["_ng_task_index"], e["_ng_rollout_index"])):
        by_agent[agent_of(entry)].append(entry)
    out = []
    async with ClientSession(timeout=ClientTimeout(total=600)) as session:
        for agent, entries in by_agent.items():
            route = routes.get(agent)
            try:
                if route is None:
                    raise InputError(f"agent {agent!r} has no known URL")
                body = orjson.dumps({"verify_responses": entries})
                url = f"{route.url}/aggregate_metrics"
                async with session.post(url, data=body, headers=_JSON) as r:
                    if r.status != 200:
                        raise InputError(f"HTTP {r.status}")
                    metrics = orjson.loads(await r.read())
            except (ClientError, TimeoutError, orjson.JSONDecodeError, InputError) as exc:
                print(f"WARNING: no aggregate metrics from {agent!r}: {exc}", file=sys.stderr)
                return None
            out.append(metrics_entry(agent, route.server, metrics))
    return out


async def _aggregate(
    cfg: CollectConfig, paths: CollectionPaths, kept: list[dict[str, Any]], routes: dict[str, Route]
) -> bool:
    """Ask each agent for its aggregate metrics and write them; a refusal only costs the
    file."""
    if cfg.disable_aggregation:
        return False
    entries = await server_metrics(kept, routes)
    if entries is None:
        return False
    write_files([(paths.aggregate, [metrics_file(entries)])])
    return True


def validated(model: type[_M], config: dict[str, Any]) -> _M:
    """``config`` as ``model``; its first error as one line naming the key."""
    try:
        return model.model_validate(config)
    except ValidationError as exc:
        raise InputError(config_error(exc.errors(), model.model_fields)) from None


def run(
    config: dict[str, Any], sink: EventSink | None = None, resume_command: str | None = None
) -> CollectReport:
    """Validate ``config`` and collect (blocking; SIGTERM stops it as Ctrl-C does); prints
    NeMo Gym's closing lines."""
    cfg = validated(CollectConfig, config)
    report = run_loop(collect(cfg, sink, resume_command))
    print_closing(report)
    return report


def print_closing(report: CollectReport) -> None:
    """NeMo Gym's closing lines of a collection (and the streamed profile's, when waited for)."""
    print("Finished rollout collection! View results at:")
    print(f"Fully materialized inputs: {report.paths.inputs}")
    print(f"Rollouts: {report.paths.rollouts}")
    print(f"Aggregate metrics: {report.paths.aggregate if report.aggregate_written else None}")
    if report.failed:
        print(f"Failed attempts: {report.failed} (not rewards), in {report.paths.failures}")
    if report.skipped:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items()))
        total = sum(report.skipped.values())
        print(f"Ended early: {total} rows skipped ({why}), listed in {report.paths.skipped}")
    if report.profile is not None:
        print(*profile_lines(report.profile, extras=False), sep="\n")


# --help: every key of CollectConfig, required ones first (a key missing here is still listed)
_OVERRIDE_HELP = {
    "input_jsonl_fpath": ("PATH", "the dataset, one task per line"),
    "output_jsonl_fpath": ("D/S.jsonl", "the rollouts; the other files go next to it"),
    "agent_name": ("NAME", "agent for rows without agent_ref (needed unless all have one)"),
    "config_paths": ("[A,B]", "accepted as 0.7.0 does (--config); only the servers read them"),
    "agent_map": (".FROM=TO", "rows of agent FROM go to TO (._default: all the others)"),
    "limit": ("N", "only the first N lines of the dataset (0: all)"),
    "num_repeats": ("N", "rollouts per task; +num_repeats.AGENT=N per agent"),
    "num_repeats_add_seed": ("BOOL", "give each repeat its own seed"),
    "interleave_repeats": ("BOOL", "order rows by repeat: every task's first, then second..."),
    "responses_create_params": (".KEY=V", "set KEY in every row's responses_create_params"),
    "prompt_config": ("PATH", "a {user, system} YAML template building each row's input"),
    "num_samples_in_parallel": ("N", f"rollouts in flight ({DEFAULT_PARALLEL})"),
    "resume_from_cache": ("BOOL", "continue a run (else earlier files become NAME.~N~)"),
    "disable_aggregation": ("BOOL", "skip the agents' /aggregate_metrics"),
    "head_server": (".host=H .port=P", "NeMo Gym's head server address (127.0.0.1:11000)"),
    "head_server_url": ("URL", "the head server as a URL (wins over head_server)"),
    "agent_url": ("URL", "send every row to this agent instead"),
    "request_timeout_s": ("S", "give up on one /run after S seconds"),
    "retry_backoff_s": ("S", "first wait before a retry, doubled each time"),
    "kafka_bootstrap_servers": ("HOST[:PORT]", "also publish live to Kafka (port 9092 if none)"),
    "kafka_topic_prefix": ("P", "topics <P>.inputs, <P>.rollouts, <P>.control"),
    "kafka_run_id": ("ID", "the run's id (default: <S>-<8 hex> of the inputs file)"),
    "kafka_group_id": ("G", "the processors' group (default: <prefix>-profiler)"),
    "kafka_wait_profile": ("BOOL", "then wait for the final profile and write it next to D/S"),
    "kafka_wait_profile_timeout_s": ("S", "give up waiting after S seconds"),
    "kafka_aggregate_metrics": (
        "BOOL",
        "the streamed profile also gets pass@k and task difficulty files (profiles get)",
    ),
    "kafka_answer_key": ("FIELD", "the result field majority@k votes on, in those files"),
    "early_stop": (
        ".half_width=H .band=[LO,HI]",
        "stop each agent once its interval is +-H, skip tasks settled for the band",
    ),
    "quiet": ("BOOL", "no progress bar"),
}


def _usage() -> str:
    """--help, from the config model itself, so no key the collector reads goes unlisted."""
    lines = [
        "usage: ng_collect_rollouts +input_jsonl_fpath=I +output_jsonl_fpath=D/S.jsonl "
        "[+key=value ...]",
        "",
        "POST every materialized row to its agent's /run; writes D/S_materialized_inputs.jsonl,",
        "D/S.jsonl, D/S_failures.jsonl (failed attempts) and D/S_aggregate_metrics.json.",
        "",
        "overrides (+key=value, ++key=value or key=value; dotted keys nest):",
    ]
    fields = CollectConfig.model_fields.items()
    for name, field in sorted(fields, key=lambda item: not item[1].is_required()):
        meta, text = _OVERRIDE_HELP.get(name, ("VALUE", ""))
        key = f"+{name}{meta if meta.startswith('.') else '=' + meta}"
        if field.is_required():
            text = f"(required) {text}"
        elif (
            field.default_factory is None
            and field.default not in (None, {})
            and field.default is not False
        ):
            text = f"{text} ({field.default})"
        lines.append(f"  {key:<37}{text}")
    lines += [
        "",
        f"environment: {MAX_ATTEMPTS_ENV}=N  attempts per row, retries included (3)",
        "",
        "options:",
        f"  {'-h, --help':<37}show this help and exit",
        f"  {'--version':<37}show the version and exit",
    ]
    return "\n".join(lines)


_RESUME = re.compile(r"\+{0,2}resume_from_cache=.*", re.DOTALL)  # the override a resume sets


def main(argv: Sequence[str] | None = None) -> int:
    def go(args: list[str]) -> int:
        config = parse_overrides(args)
        missing = [k for k in ("input_jsonl_fpath", "output_jsonl_fpath") if k not in config]
        if missing:
            raise InputError(f"missing required configuration: +{missing[0]}=<value>")
        resume = [a for a in args if not _RESUME.fullmatch(a)] + ["+resume_from_cache=true"]
        run(config, resume_command=shlex.join(["ng_collect_rollouts", *resume]))
        return 0

    return override_command("ng_collect_rollouts", _usage, argv, go)


if __name__ == "__main__":
    sys.exit(main())
