"""Security defaults, each proven against real components: real HTTP servers on loopback, real
``rewardstream``/``ng_run``/``ng_collect_rollouts`` processes, a real broker (with SASL/PLAIN and
TLS listeners where security is tested). No mocks.

- Everything that listens binds 127.0.0.1 unless a host is configured (the sockets each process
  holds are read from /proc), and an explicit host is honoured.
- Nothing is written outside the configured folders: bad run ids and stems in events are dead
  letters, bad ids in snapshot URLs are 404s, and the snapshot client writes only the three
  profile files of one run into ``--out``, whatever names a server sends.
- Request bodies are bounded (413) on every server, and the server keeps serving.
- Kafka SASL/TLS settings reach every client: publish, stream and the collector's live sink go
  through a SASL_PLAINTEXT and an SSL listener; refused credentials are one clear line.
- API keys and passwords appear in no log, output, error or served config.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from aiohttp import ClientSession, web
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from rewardstream.commands.cli import main
from rewardstream.contract.events import Topics, task_key
from rewardstream.gym_servers.base import MAX_REQUEST_BYTES
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG
from rewardstream.kafka import local as kafka_local
from rewardstream.kafka.config import KafkaSecurity
from rewardstream.kafka.local import free_port
from rewardstream.processors.http.server import MAX_BODY_BYTES
from rewardstream.sinks.snapshot_wire import MEDIA_TYPE
from rewardstream.sinks.topics.profiles import ensure_topics
from tests.golden import GOLDEN, OUTPUT_SUFFIXES, GoldenCase, golden_cases, golden_events
from tests.gym import fast, write_problems
from tests.processes import read_topic
from tests.tls import Certs, make_certs

CASE: GoldenCase | None = (
    next(c for c in golden_cases() if c.name == "blackjack") if GOLDEN.exists() else None
)
needs_golden = pytest.mark.skipif(CASE is None, reason="no goldens")
API_KEY = "sk-rewardstream-SECRET-a1b2c3d4e5"
SASL_PASSWORD = "sasl-SECRET-pw-9e8d7c6b"
WRONG_PASSWORD = "wrong-SECRET-pw-0f1e2d"
SECRETS = (API_KEY, SASL_PASSWORD, WRONG_PASSWORD)
# an absolute path that must never be created; fixed, since it names parametrized tests and
# pytest-xdist needs every worker to collect the same ones
ABS = "/tmp/rs-sec-never-created-5f0c2b9e0d7a41c3"


# --------------------------------------------------------------------------- helpers


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, from /proc: its socket
    inodes matched against the LISTEN (0A) rows of its network namespace's tables. (A wildcard
    bind shows as 0.0.0.0 or ::.)"""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ip_hex, port_hex = fields[1].split(":")
                raw = bytes.fromhex(ip_hex)  # 32-bit words in host (little-endian) order
                packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(socket.inet_ntop(family, packed))
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped  # Java's IPv6 socket bound to 127.0.0.1
                found.add((str(address), int(port_hex, 16)))
    return found


def non_loopback_ip() -> str | None:
    """This machine's address on its default route, if it has one besides loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 9))  # UDP: no packet is sent
        except OSError:
            return None
        ip = str(sock.getsockname()[0])
    return None if ip.startswith("127.") else ip


def assert_unreachable_from_outside(port: int) -> None:
    ip = non_loopback_ip()
    if ip is not None:
        with pytest.raises(ConnectionRefusedError), socket.create_connection((ip, port), 2):
            pass


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without any Kafka security settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDSTREAM_KAFKA_")}
    return env | dict(extra or {})


def sasl_env(password: str = SASL_PASSWORD) -> dict[str, str]:
    return {
        "REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "REWARDSTREAM_KAFKA_SASL_MECHANISM": "PLAIN",
        "REWARDSTREAM_KAFKA_SASL_PLAIN_USERNAME": "alice",
        "REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD": password,
    }


def assert_no_secret(*texts: str | bytes) -> None:
    for text in texts:
        raw = text.encode() if isinstance(text, str) else text
        leaked = [s for s in SECRETS if s.encode() in raw]
        assert not leaked, f"secret {leaked} leaked in {raw[:2000]!r}"


class Child:
    """A real command as a child process, its stdout and stderr in files; stopped by its pid."""

    def __init__(self, args: list[str], folder: Path, name: str, env: dict[str, str]) -> None:
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env
            )

    def texts(self) -> tuple[str, str]:
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop(signal.SIGKILL)
            raise AssertionError(f"{self.proc.args!r} hung: {self.texts()[1][-2000:]}") from None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Stream(Child):
    """``rewardstream stream`` with its HTTP endpoint on ``http`` (as given on the command line)."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        out: Path,
        http: str,
        folder: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        host, _, port = http.rpartition(":")
        self.url = f"http://{host or '127.0.0.1'}:{port}"
        args = ["-m", "rewardstream.commands.cli", "stream", "--bootstrap", bootstrap]
        args += ["--output-dir", str(out), "--topic-prefix", prefix, "--http", http]
        super().__init__([*args, "--checkpoint-every", "0.2"], folder, prefix, child_env(env))

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as resp:
            body: bytes = resp.read()
            return body

    def wait_serving(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"processor exited: {self.texts()[1][-2000:]}"
            with contextlib.suppress(OSError):
                self.get("/healthz")
                return
            assert time.monotonic() < deadline, "processor never served /healthz"
            time.sleep(0.05)

    def runs(self) -> dict[str, Any]:
        with contextlib.suppress(OSError):
            return {r["run_id"]: r for r in orjson.loads(self.get("/runs"))}
        return {}

    def wait_done(self, run_id: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.runs().get(run_id, {}).get("done"):
            assert self.proc.poll() is None, f"processor exited: {self.texts()[1][-2000:]}"
            assert time.monotonic() < deadline, f"run {run_id} not done: {self.runs()}"
            time.sleep(0.1)


def assert_golden(folder: Path, case: GoldenCase) -> None:
    for suffix in OUTPUT_SUFFIXES:
        name = f"{case.stem}{suffix}"
        assert (folder / name).read_bytes() == (case.expected / name).read_bytes(), name


def post_raw(url: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """POST with the path sent exactly as given (no client-side normalisation or quoting)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- the processor

# Run ids that must never name a folder: traversal, separators, encodings, NUL, too long (in
# characters, and in bytes: 101 two-byte characters pass a 200-character limit but not
# NAME_MAX-safe 200 bytes).
BAD_RUN_IDS = [
    "../x",
    "..",
    ".",
    "a/b",
    ABS,
    "%2e%2e",
    "..%2fx",
    "a\\b",
    "a\x00b",
    "",
    ".hidden",
    "x" * 201,
    "é" * 101,
]
BAD_STEMS = ["../x", "a/b", ABS, "a\x00b", "é" * 101]


class Loaded(NamedTuple):
    stream: Stream
    root: Path
    out: Path
    topics: Topics
    bad_events: list[bytes]


def _with(raw: bytes, **changes: Any) -> bytes:
    return orjson.dumps(orjson.loads(raw) | changes)


@pytest.fixture(scope="module")
def loaded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """A real ``rewardstream stream --http PORT`` fed, through the broker, every bad run id and
    stem in input, rollout and control events, then a good golden run ``ok``."""
    assert CASE is not None
    root = tmp_path_factory.mktemp("processor")
    out = root / "data" / "out"
    prefix = f"rs-sec-{uuid.uuid4().hex[:8]}"
    topics = Topics.for_prefix(prefix)
    stream = Stream(kafka_bootstrap, prefix, out, str(free_port()), root)  # bare PORT
    try:
        stream.wait_serving()
        events = golden_events(CASE, "ok", finish=True)
        first = {kind: raw for kind, raw in reversed(events)}  # one of each kind
        started = next(raw for kind, raw in events if b'"run_started"' in raw)
        bad: list[tuple[str, bytes, bytes]] = []
        for run_id in BAD_RUN_IDS:
            for kind in ("input", "rollout"):
                bad.append((kind, _with(first[kind], run_id=run_id), task_key(0)))
            bad.append(("control", _with(started, run_id=run_id), run_id.encode()))
        for stem in BAD_STEMS:
            bad.append(("control", _with(started, run_id="stems", output_stem=stem), b"stems"))

        async def send() -> None:
            await ensure_topics(kafka_bootstrap, KafkaSecurity(), topics, "publisher")
            topic = {"input": topics.inputs, "rollout": topics.rollouts, "control": topics.control}
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                for kind, raw, key in bad:
                    await producer.send(topic[kind], raw, key=key)
                for kind, raw in events:
                    key = b"ok" if kind == "control" else task_key(_task(raw))
                    await producer.send(topic[kind], raw, key=key)
            finally:
                await producer.stop()

        asyncio.run(send())
        stream.wait_done("ok")
        yield Loaded(stream, root, out, topics, [raw for _, raw, _ in bad])
    finally:
        stream.stop()


def _task(raw: bytes) -> int:
    event = orjson.loads(raw)
    return int(event["task"] if "task" in event else event["row"]["_ng_task_index"])


def _dead_letters(bootstrap: str, topic: str, count: int) -> list[Any]:
    return asyncio.run(read_topic(bootstrap, topic, at_least=count))


@pytest.mark.kafka
@needs_golden
def test_processor_http_binds_loopback_by_default(loaded: Loaded) -> None:
    port = int(loaded.stream.url.rsplit(":", 1)[1])
    assert listening(loaded.stream.proc.pid) == {("127.0.0.1", port)}
    assert_unreachable_from_outside(port)


@pytest.mark.kafka
def test_processor_http_honours_an_explicit_host(kafka_bootstrap: str, tmp_path: Path) -> None:
    port = free_port()
    prefix = f"rs-sec-{uuid.uuid4().hex[:8]}"
    stream = Stream(kafka_bootstrap, prefix, tmp_path / "o", f"127.0.0.2:{port}", tmp_path)
    try:
        stream.wait_serving()
        assert listening(stream.proc.pid) == {("127.0.0.2", port)}
    finally:
        stream.stop()


@pytest.mark.kafka
@needs_golden
def test_bad_run_ids_and_stems_are_dead_letters_and_nothing_leaves_the_output_dir(
    loaded: Loaded, kafka_bootstrap: str
) -> None:
    assert CASE is not None
    records = _dead_letters(kafka_bootstrap, loaded.topics.dead_letters, len(loaded.bad_events))
    assert sorted(r.value for r in records) == sorted(loaded.bad_events)
    for record in records:
        headers = dict(record.headers)
        why = headers.get("detail", b"") + headers.get("reason", b"")
        assert b"run_id" in why or b"output_stem" in why, why
    assert loaded.stream.proc.poll() is None  # still processing
    assert_golden(loaded.out / "ok", CASE)
    logs = {f"{loaded.topics.inputs.removesuffix('.inputs')}.{s}" for s in ("out", "err")}
    assert set(os.listdir(loaded.root)) == {"data", *logs}
    assert os.listdir(loaded.root / "data") == ["out"]
    assert set(os.listdir(loaded.out)) == {".rewardstream-owner.json", "ok"}
    assert not Path(ABS).exists()


@pytest.mark.kafka
@needs_golden
@pytest.mark.parametrize(
    "path",
    [
        "/runs/../x/snapshot",
        "/runs/..%2fx/snapshot",
        "/runs/%2e%2e/snapshot",
        "/runs/%2E%2E%2F%2E%2E%2Fetc/snapshot",
        "/runs/a%2Fb/snapshot",
        f"/runs/{ABS.replace('/', '%2F')}/snapshot",
        "/runs/ok%00/snapshot",
        "/runs/%00/snapshot",
        "/runs/ok/../ok/snapshot",
        "/runs/" + "x" * 10_000 + "/snapshot",
    ],
)
def test_snapshot_urls_cannot_reach_outside(loaded: Loaded, path: str) -> None:
    before = tree(loaded.root)
    status, body = post_raw(loaded.stream.url, path)
    assert status in (400, 404), (status, body[:200])
    assert tree(loaded.root) == before
    assert loaded.stream.proc.poll() is None


@pytest.mark.kafka
@needs_golden
def test_snapshot_cli_with_bad_run_ids(
    loaded: Loaded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["snapshot", "--url", loaded.stream.url, "--out", str(tmp_path / "snap"), "--run-id"]
    for run_id in ("../x", "..", "a/b", ABS, "%2e%2e", "a\x00b"):
        code = main([*args, run_id])
        err = capsys.readouterr().err
        assert code == 2 and "HTTP 404 unknown run_id" in err and err.count("\n") == 1, err
    assert tree(tmp_path) == set()
    assert main([*args, "ok"]) == 0
    assert CASE is not None
    assert tree(tmp_path) == {"snap"} | {f"snap/{CASE.stem}{s}" for s in OUTPUT_SUFFIXES}


@pytest.mark.kafka
@needs_golden
async def test_oversized_post_is_413_and_the_processor_keeps_serving(loaded: Loaded) -> None:
    url = f"{loaded.stream.url}/runs/ok/snapshot"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit still applies
        for _ in range(3):
            yield b"x" * (MAX_BODY_BYTES // 2)

    async with ClientSession() as session:
        for body in (io.BytesIO(b"x" * (MAX_BODY_BYTES + 1)), chunks()):
            async with session.post(url, data=body) as resp:
                assert resp.status == 413
        async with session.get(f"{loaded.stream.url}/healthz") as resp:
            assert resp.status == 200
        async with session.post(url) as resp:
            assert resp.status == 200 and resp.content_type == MEDIA_TYPE


# --------------------------------------------------------------------------- snapshot client


def _snapshot_body(names: list[Any]) -> bytes:
    """A well-formed snapshot stream (sinks/snapshot_wire.py) whose files are called ``names``:
    the head line, one frame of ``{}`` per file, the end frame."""
    head = {"run_id": "r", "rollouts": 1, "inputs": 1, "offsets": {}, "files": names}
    frames = [struct.pack(">BI", i, 2) + b"{}" for i in range(len(names))]
    return orjson.dumps(head) + b"\n" + b"".join(frames) + struct.pack(">BI", 255, 0)


GOOD = ["r_reward_profiling.jsonl", "r_agent_metrics.json", "r_repeat_level_metrics.json"]


@pytest.mark.parametrize(
    "names",
    [
        [
            "../evil_reward_profiling.jsonl",
            "../evil_agent_metrics.json",
            "../evil_repeat_level_metrics.json",
        ],
        [f"{ABS}_reward_profiling.jsonl", *GOOD[1:]],
        ["a/b_reward_profiling.jsonl", "a/b_agent_metrics.json", "a/b_repeat_level_metrics.json"],
        ["..", *GOOD[1:]],
        ["", *GOOD[1:]],
        [
            "r\x00_reward_profiling.jsonl",
            "r\x00_agent_metrics.json",
            "r\x00_repeat_level_metrics.json",
        ],
        [*GOOD, ".bashrc"],
        [*GOOD[:2], "evil.sh"],
        [*GOOD[:2], "s_repeat_level_metrics.json"],  # two stems
        [
            "..\\evil_reward_profiling.jsonl",
            "..\\evil_agent_metrics.json",
            "..\\evil_repeat_level_metrics.json",
        ],
        [1, 2, 3],
        GOOD[:2],
    ],
)
async def test_snapshot_client_writes_only_the_three_profile_files(
    names: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malicious or compromised server cannot make ``rewardstream snapshot`` write anywhere
    but ``--out``, nor any file but the three profile files of one run."""

    async def impostor(_: web.Request) -> web.Response:
        return web.Response(body=_snapshot_body(names), content_type=MEDIA_TYPE)

    async def honest(_: web.Request) -> web.Response:
        return web.Response(body=_snapshot_body(GOOD), content_type=MEDIA_TYPE)

    app = web.Application()
    app.router.add_post("/runs/bad/snapshot", impostor)
    app.router.add_post("/runs/good/snapshot", honest)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    work = tmp_path / "work"
    out = work / "out"
    try:
        args = ["snapshot", "--url", f"http://127.0.0.1:{port}", "--out", str(out), "--run-id"]
        code = await asyncio.to_thread(main, [*args, "bad"])
        err = capsys.readouterr().err
        assert code == 2 and "nothing written" in err and err.count("\n") == 1, err
        assert tree(tmp_path) == {"work"} or tree(tmp_path) == set()
        assert not Path(f"{ABS}_reward_profiling.jsonl").exists()
        assert await asyncio.to_thread(main, [*args, "good"]) == 0  # the control
        assert tree(out) == set(GOOD)
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- gym servers


async def _fake_upstream() -> tuple[web.AppRunner, str]:
    """An OpenAI-compatible endpoint gone wrong: /responses refuses the key and echoes it back
    in the error (as some do), /chat/completions drops the connection."""

    async def refuse(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        error = {"error": {"message": f"Incorrect API key provided: {auth}", "code": 401}}
        return web.json_response(error, status=401)

    async def drop(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(5)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/responses", refuse)
    app.router.add_post("/v1/chat/completions", drop)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_gym_servers_bind_loopback_bound_bodies_and_never_show_the_api_key(
    tmp_path: Path,
) -> None:
    upstream, base = await _fake_upstream()
    head_port = free_port()
    resources = "+arithmetic_resources_server.resources_servers.arithmetic"
    agent = "+arithmetic_simple_agent.responses_api_agents.simple_agent"
    args = ["-m", "rewardstream.gym_servers.ng_run", f"+config_paths=[{BUNDLED_CONFIG}]", *fast()]
    args += [
        f"+head_server.port={head_port}",
        "+head_server.host=null",  # null or empty: still loopback (was: every interface)
        "+policy_model.responses_api_models.simulated_model.host=",
        f"{resources}.host=127.0.0.2",  # an explicit host is honoured
        f"{agent}.max_request_bytes=4096",
        f"+policy_base_url={base}/v1",
        f"+policy_api_key={API_KEY}",
    ]
    ng = Child(args, tmp_path, "ng_run", child_env())
    try:
        deadline = time.monotonic() + 60
        while "All 4 servers ready" not in ng.texts()[0]:
            assert ng.proc.poll() is None, ng.texts()
            assert time.monotonic() < deadline, ng.texts()
            await asyncio.sleep(0.05)
        head = f"http://127.0.0.1:{head_port}"
        async with ClientSession() as session:
            async with session.get(f"{head}/server_instances") as resp:
                instances = {i["process_name"]: i for i in await resp.json()}
                served = await resp.text()
            async with session.get(f"{head}/global_config_dict_yaml") as resp:
                served += await resp.text()
            model = instances["policy_model"]["url"]
            agent_url = instances["arithmetic_simple_agent"]["url"]

            # every socket on loopback; the explicit host where it was asked for
            assert listening(ng.proc.pid) == {("127.0.0.1", head_port)}
            for name, inst in instances.items():
                want = "127.0.0.2" if name == "arithmetic_resources_server" else "127.0.0.1"
                assert listening(inst["pid"]) == {(want, inst["port"])}, name
            assert_unreachable_from_outside(head_port)

            # the key is sent upstream but never comes back: not in relayed errors, not in 502s
            async with session.post(f"{model}/v1/responses", json={"input": "hi"}) as resp:
                assert resp.status == 401
                refused = await resp.read()
                assert b"Incorrect API key provided: Bearer ***" in refused
            async with session.post(f"{model}/v1/chat/completions", json={"messages": []}) as r:
                assert r.status == 502
                dropped = await r.read()

            # bodies are bounded: the default limit, and a server's own max_request_bytes
            too_big = io.BytesIO(b"x" * (MAX_REQUEST_BYTES + 1))
            async with session.post(f"{model}/v1/responses", data=too_big) as resp:
                assert resp.status == 413
            async with session.post(f"{agent_url}/run", data=b" " * 4097) as resp:
                assert resp.status == 413
            for url in (model, agent_url):
                async with session.get(f"{url}/health") as resp:
                    assert resp.status == 200

        # a collection through the failing proxy: its failures and messages hold no key
        inputs = write_problems(tmp_path / "problems.jsonl", 2)
        output = tmp_path / "rollouts.jsonl"
        collect = await asyncio.create_subprocess_exec(
            *(
                sys.executable,
                "-m",
                "rewardstream.producers.gym.collect",
                f"+input_jsonl_fpath={inputs}",
            ),
            *(f"+output_jsonl_fpath={output}", f"+head_server_url={head}", "+num_repeats=1"),
            *("+retry_backoff_s=0", "+quiet=true"),
            env=child_env({"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS": "1"}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(collect.communicate(), 60)
        assert collect.returncode == 2, stderr
        failures = (tmp_path / "rollouts_failures.jsonl").read_bytes()
        assert b"401" in failures
        assert_no_secret(refused, dropped, served, stdout, stderr, failures)
    finally:
        ng.stop()
        await upstream.cleanup()
    assert_no_secret(*ng.texts(), *(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()))


# --------------------------------------------------------------------------- Kafka SASL / TLS


class SecureBroker(NamedTuple):
    broker: kafka_local.LocalBroker
    sasl: str  # SASL_PLAINTEXT (PLAIN) listener; user alice
    tls: str  # SSL listener, certificate for 127.0.0.1 signed by certs.ca
    certs: Certs


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A real broker with a SASL_PLAINTEXT/PLAIN listener and an SSL listener besides PLAINTEXT
    (the session broker is left as it is)."""
    reason = ""
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    if certs is None:
        reason = "no openssl command"
    libs = None
    try:
        if not reason:
            libs = kafka_local.fetch_jars() if shutil.which("java") else None
            reason = "" if libs else "no java"
    except kafka_local.KafkaLocalError as exc:
        reason = str(exc)
    if reason or certs is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"secured broker unavailable: {reason}", pytrace=False)
        pytest.skip(f"secured broker unavailable: {reason}")
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    broker = kafka_local.LocalBroker(
        libs=libs,
        jvm_args=("-Xms128m", "-Xmx512m"),
        extra_listeners={"SASL": "SASL_PLAINTEXT", "TLS": "SSL"},
        extra_properties={
            "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl.plain.sasl.jaas.config": f'{jaas} user_alice="{SASL_PASSWORD}";',
            "listener.name.tls.ssl.keystore.type": "PEM",
            "listener.name.tls.ssl.keystore.location": str(certs.server_pem),
        },
    )
    with broker:
        yield SecureBroker(broker, broker.address("SASL"), broker.address("TLS"), certs)


@pytest.mark.kafka
def test_local_broker_listens_only_on_loopback(secure_broker: SecureBroker) -> None:
    broker = secure_broker.broker
    assert broker.pid is not None
    ports = {broker.port, broker.controller_port, *broker.listener_ports.values()}
    assert listening(broker.pid) == {("127.0.0.1", port) for port in ports}


def tls_env(certs: Certs) -> dict[str, str]:
    return {
        "REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
        "REWARDSTREAM_KAFKA_SSL_CAFILE": str(certs.ca),
    }


@pytest.mark.kafka
@needs_golden
def test_publish_over_tls_and_stream_over_sasl_with_env_settings(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """``rewardstream publish`` through the SSL listener and ``rewardstream stream`` through the
    SASL one, both configured only by REWARDSTREAM_KAFKA_* variables: the profile equals the
    golden, and the password is in no output, log or endpoint."""
    assert CASE is not None
    prefix = f"rs-sasl-{uuid.uuid4().hex[:8]}"
    topics = Topics.for_prefix(prefix)

    async def create() -> None:  # the admin client through SASL too
        security = KafkaSecurity.from_env(sasl_env())
        admin = AIOKafkaAdminClient(
            bootstrap_servers=secure_broker.sasl, **security.client_kwargs()
        )
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(t, 1 if t == topics.control else 2, 1) for t in topics]
            )
        finally:
            await admin.close()

    asyncio.run(create())
    out = tmp_path / "out"
    stream = Stream(secure_broker.sasl, prefix, out, str(free_port()), tmp_path, sasl_env())
    inputs = CASE.source / f"{CASE.stem}_materialized_inputs.jsonl"
    rollouts = CASE.source / f"{CASE.stem}.jsonl"
    publish = Child(
        [
            *("-m", "rewardstream.commands.cli", "publish", "--inputs", str(inputs)),
            *("--rollouts", str(rollouts), "--bootstrap", secure_broker.tls),
            *("--topic-prefix", prefix, "--run-id", "secured", "--quiet"),
        ],
        tmp_path,
        "publish",
        child_env(tls_env(secure_broker.certs)),
    )
    try:
        assert publish.wait(60) == 0, publish.texts()
        stream.wait_serving()
        stream.wait_done("secured")
        assert_golden(out / "secured", CASE)
        served = [stream.get(p) for p in ("/healthz", "/runs", "/metrics")]
    finally:
        stream.stop()
    assert_no_secret(*served, *stream.texts(), *publish.texts())
    assert "Authenticated as alice via PLAIN" in stream.texts()[1]


@pytest.mark.kafka
def test_refused_logins_and_tls_failures_are_one_clear_line(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """A wrong password (publish and stream), or TLS without the CA: exit 2 at once, one error
    line naming the setting to check, no traceback, no password."""
    rollouts = tmp_path / "r.jsonl"
    inputs = tmp_path / "r_materialized_inputs.jsonl"
    rollouts.write_text("")
    inputs.write_text("")
    publish = ["-m", "rewardstream.commands.cli", "publish", "--inputs", str(inputs)]
    publish += ["--rollouts", str(rollouts), "--quiet", "--bootstrap"]
    stream = ["-m", "rewardstream.commands.cli", "stream", "--output-dir", str(tmp_path / "o")]
    stream += ["--http", str(free_port()), "--bootstrap"]
    wrong = child_env(sasl_env(WRONG_PASSWORD))
    no_ca = child_env({"REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL"})
    cases = {
        "publish-sasl": (
            Child([*publish, secure_broker.sasl], tmp_path, "publish-sasl", wrong),
            "REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD",
        ),
        "stream-sasl": (
            Child([*stream, secure_broker.sasl], tmp_path, "stream-sasl", wrong),
            "REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD",
        ),
        "publish-tls": (
            Child([*publish, secure_broker.tls], tmp_path, "publish-tls", no_ca),
            "REWARDSTREAM_KAFKA_SSL_CAFILE",
        ),
    }
    began = time.monotonic()
    for name, (child, setting) in cases.items():
        assert child.wait(30) == 2, (name, child.texts())
        stdout, stderr = child.texts()
        errors = [line for line in stderr.splitlines() if line.startswith("rewardstream: error:")]
        assert len(errors) == 1 and setting in errors[0], (name, stderr)
        assert "Traceback" not in stderr, (name, stderr)
        assert_no_secret(stdout, stderr)
        if name.endswith("sasl"):
            assert "refused the SASL login of user 'alice'" in errors[0]
    assert time.monotonic() - began < 30  # not a hang


@pytest.mark.kafka
def test_collector_live_publishing_and_demo_processor_through_sasl(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """``rewardstream demo --bootstrap``: the collector's live Kafka sink and the in-process
    stream processor both log in with the env credentials; no password in any output."""
    out = tmp_path / "demo"
    demo = Child(
        [
            *("-m", "rewardstream.commands.cli", "demo", "--output-dir", str(out)),
            *(
                "--bootstrap",
                secure_broker.sasl,
                "--topic-prefix",
                f"rs-demo-{uuid.uuid4().hex[:8]}",
            ),
            *("--limit", "3", "--repeats", "2", "--parallel", "8"),
        ],
        tmp_path,
        "demo",
        child_env(sasl_env()),
    )
    assert demo.wait(120) == 0, demo.texts()
    profile = out / "rollouts_reward_profiling.jsonl"
    assert len(profile.read_bytes().splitlines()) == 3
    assert_no_secret(*demo.texts(), *(p.read_bytes() for p in out.rglob("*") if p.is_file()))
