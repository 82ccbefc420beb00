"""The processor's HTTP endpoint behind TLS and a bearer token, against real components: real
TLS handshakes on loopback with a CA made for the test (tests/tls.py), every route of the
router asked without, with a wrong and with the right token, the page's login in headless
Chromium, two processors as separate hosts fetching each other's parts over TLS, and the
client commands (watch, snapshot, curate) with the token and the CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import ssl
import time
import urllib.error
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import aiohttp
import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from selenium import webdriver
from selenium.webdriver.common.by import By

from rewardstream.commands.cli import main
from rewardstream.contract.engine import EngineTopics, decode_member
from rewardstream.contract.events import Topics
from rewardstream.errors import InputError
from rewardstream.infra.http_security import TOKEN_ENV, HttpSecurity, open_url
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.auth import COOKIE, OPEN
from rewardstream.processors.http.server import make_app, serve
from rewardstream.processors.stream import StreamProcessor, Unavailable
from rewardstream.sinks.metrics import Metrics
from tests.golden import GOLDEN, assert_batch_files, generated_collection, golden_cases
from tests.golden import golden_events as case_events
from tests.processes import Processor, make_topics
from tests.test_page import browser  # noqa: F401  (the fixture)
from tests.tls import Certs, make_certs

TOKEN = "tok-" + uuid.uuid4().hex  # unique: found anywhere, it leaked
RUN = "m"
needs_golden = pytest.mark.skipif(not GOLDEN.exists(), reason="no goldens")


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    made = make_certs(tmp_path / "tls")
    if made is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("openssl is not installed")
        pytest.skip("openssl is not installed")
    return made


class Served(NamedTuple):
    url: str
    app: web.Application
    client: ssl.SSLContext  # verifies with the test CA


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path, security: HttpSecurity) -> AsyncIterator[Served]:
    """A processor's endpoint with ``security``, on a pipeline holding run ``m``."""
    holder: dict[str, Pipeline] = {}
    metrics = Metrics(lambda: holder["p"].runs)
    pipeline = holder["p"] = Pipeline(tmp_path / "out", metrics=metrics)
    case = next(c for c in golden_cases() if c.name == "multi_agent")
    for kind, raw in case_events(case, RUN, finish=False):
        pipeline.handle(kind, raw)
    app = make_app(pipeline, metrics.registry, None, security=security)
    runner, port = await serve(app, "127.0.0.1", 0, security=security)
    try:
        url = f"{security.scheme}://127.0.0.1:{port}"
        yield Served(url, app, ssl.create_default_context(cafile=security.cafile))
    finally:
        await runner.cleanup()
        pipeline.close()


@pytest.fixture
async def served(tmp_path: Path, certs: Certs) -> AsyncIterator[Served]:
    """Over TLS with a token."""
    security = HttpSecurity(TOKEN, certs.server_cert, certs.server_key, certs.ca)
    async with _serving(tmp_path, security) as served:
        yield served


# --------------------------------------------------------------------------- TLS


@needs_golden
async def test_a_real_tls_handshake_verifies_with_the_ca_and_fails_without(
    served: Served,
) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=served.client)
    cert = writer.get_extra_info("peercert")
    assert ("commonName", "server") in (pair for rdn in cert["subject"] for pair in rdn)
    writer.close()
    await writer.wait_closed()
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know it
        await asyncio.open_connection("127.0.0.1", port, ssl=ssl.create_default_context())
    async with aiohttp.ClientSession() as plain:  # nothing is served in the clear
        with pytest.raises(aiohttp.ClientError):
            await plain.get(f"http://127.0.0.1:{port}/healthz")


# --------------------------------------------------------------------------- the token


def _routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path) of every route of the router, its placeholders filled: a route added
    later is covered without a word here."""
    found = []
    for route in app.router.routes():
        resource = route.resource
        assert resource is not None
        if isinstance(resource, web.StaticResource):
            path = str(resource.url_for(filename="index.html"))
        else:
            names = re.findall(r"\{(\w+)\}", resource.canonical)
            path = str(resource.url_for(**dict.fromkeys(names, RUN)))
        found.append((route.method, path))
    return found


async def _status(session: aiohttp.ClientSession, method: str, url: str, **kwargs: object) -> int:
    async with session.request(method, url, allow_redirects=False, **kwargs) as r:  # type: ignore[arg-type]
        return r.status  # headers only: /events never ends


@needs_golden
async def test_every_data_endpoint_wants_the_token(served: Served) -> None:
    routes = _routes(served.app)
    guarded = [(m, p) for m, p in routes if p not in OPEN]
    assert {"/runs", "/metrics", f"/parts/{RUN}", f"/runs/{RUN}/download", "/events"} <= {
        p for _, p in guarded
    }
    wrong = [
        {},
        {"headers": {"Authorization": f"Bearer {TOKEN}x"}},
        {"headers": {"Authorization": f"Bearer {TOKEN[:-1]}"}},
        {"headers": {"Authorization": f"Basic {TOKEN}"}},
        {"headers": {"Authorization": TOKEN}},
        {"cookies": {COOKIE: TOKEN}},  # the cookie is not the token
        {"cookies": {COOKIE: "0" * 64}},
    ]
    connector = aiohttp.TCPConnector(ssl=served.client)
    async with aiohttp.ClientSession(connector=connector) as session:
        for method, path in guarded:
            for how in wrong:
                got = await _status(session, method, served.url + path, **how)
                assert got == 401, (method, path, how)
        assert await _status(session, "GET", served.url + "/healthz") == 200
        right = {"headers": {"Authorization": f"Bearer {TOKEN}"}}
        for method, path in guarded:
            if method != "HEAD":  # HEAD /events would stream forever
                got = await _status(session, method, served.url + path, **right)
                assert got not in (401, 403), (method, path)
                assert got < 400 or path == "/static/index.html", (method, path, got)


@needs_golden
async def test_a_browser_trades_the_token_once_for_an_httponly_cookie(served: Served) -> None:
    html = {"Accept": "text/html"}
    jar = aiohttp.CookieJar(unsafe=True)  # an IP address's cookies
    connector = aiohttp.TCPConnector(ssl=served.client)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as s:
        async with s.get(f"{served.url}/runs/{RUN}", headers=html) as r:
            form = await r.text()
            assert r.status == 401 and 'name="token"' in form and "alpha" not in form
        login = f"{served.url}/login"
        async with s.get(login) as r:
            assert r.status == 200 and 'name="token"' in await r.text()
        async with s.post(login, data={"token": "x" * 40, "next": "/"}) as r:
            assert r.status == 401 and not r.cookies
        for sneaky in ("//evil.example/x", "https://evil.example/", "\\\\evil.example"):
            data = {"token": TOKEN, "next": sneaky}
            async with s.post(login, data=data, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"].startswith("/")
                assert not r.headers["Location"].startswith("//"), sneaky
        data = {"token": TOKEN, "next": f"/runs/{RUN}"}
        async with s.post(login, data=data, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == f"/runs/{RUN}"
            cookie = r.cookies[COOKIE]
            assert cookie["httponly"] and cookie["secure"] and cookie["samesite"] == "Strict"
            assert TOKEN not in r.headers["Set-Cookie"]
        async with s.get(f"{served.url}/runs/{RUN}") as r:  # the cookie alone now
            assert r.status == 200 and (await r.json())["run_id"] == RUN


@needs_golden
async def test_the_page_logs_in_in_a_real_browser(
    tmp_path: Path,
    browser: webdriver.Chrome,  # noqa: F811
) -> None:
    """Headless Chromium opens a run's page: the login form, a wrong token is refused, the
    right one opens the page, whose events (the cookie, no header) show the run."""

    def shown() -> list[str]:
        script = "return [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)"
        runs: list[str] = browser.execute_script(script)
        return runs

    def log_in(url: str) -> list[str]:
        browser.get(f"{url}/runs/{RUN}")
        for token in ("y" * 40, TOKEN):
            assert browser.find_elements(By.NAME, "token"), browser.page_source[:500]
            assert "alpha" not in browser.page_source
            browser.find_element(By.NAME, "token").send_keys(token)
            browser.find_element(By.TAG_NAME, "form").submit()
        assert browser.current_url == f"{url}/runs/{RUN}"
        cookie = browser.get_cookie(COOKIE)
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert COOKIE not in browser.execute_script("return document.cookie")  # HttpOnly
        deadline = time.monotonic() + 30
        while RUN not in shown():
            assert time.monotonic() < deadline, browser.page_source[:2000]
            time.sleep(0.2)
        runs = shown()
        browser.get("about:blank")  # its events stream ends: the server can stop
        return runs

    async with _serving(tmp_path, HttpSecurity(TOKEN)) as served:
        assert await asyncio.to_thread(log_in, served.url) == [RUN]


# --------------------------------------------------------------------------- binding


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "example.org", "10.1.2.3"])
async def test_beyond_loopback_without_a_token_is_refused(host: str) -> None:
    app = web.Application()
    with pytest.raises(InputError, match="--insecure-public"):
        await serve(app, host, 0, security=HttpSecurity())
    with pytest.raises(InputError, match="--insecure-public"):
        await serve(app, host, 0)


async def test_beyond_loopback_with_a_token_and_tls_or_when_told(certs: Certs) -> None:
    for security in (
        HttpSecurity(TOKEN, certs.server_cert, certs.server_key, certs.ca),
        HttpSecurity(insecure_public=True),
        HttpSecurity(TOKEN, insecure_public=True),
    ):
        runner, port = await serve(web.Application(), "0.0.0.0", 0, security=security)
        await runner.cleanup()
        assert port > 0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "example.org", "10.1.2.3"])
async def test_beyond_loopback_a_token_over_plain_http_is_refused(host: str) -> None:
    """A token in clear text is anyone's on the path: beyond loopback it wants TLS."""
    with pytest.raises(InputError, match=r"plain HTTP.*--http-certfile.*--insecure-public"):
        await serve(web.Application(), host, 0, security=HttpSecurity(TOKEN))


def test_a_tls_processor_with_a_token_trusts_its_own_ca_only(
    tmp_path: Path, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--http-cafile`` the system's CAs would accept any public host a forged member
    record names, and the processor would send it its token: refused at start."""
    security = HttpSecurity(TOKEN, certs.server_cert, certs.server_key)
    with pytest.raises(InputError, match="needs --http-cafile"):
        StreamProcessor("127.0.0.1:1", None, state_dir=tmp_path, http_security=security)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = ["stream", "--bootstrap", "127.0.0.1:1", "--http-token-file", str(token_file)]
    argv += ["--http-certfile", str(certs.server_cert), "--http-keyfile", str(certs.server_key)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --http-cafile" in err[0] and TOKEN not in err[0], err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    HttpSecurity().check_bind(host, 1)


def test_the_stream_command_refuses_a_public_bind_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    argv = ["stream", "--bootstrap", "127.0.0.1:1", "--http", "0.0.0.0:1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no token is set" in err[0] and "--insecure-public" in err[0], err


# --------------------------------------------------------------------------- the token's sources


COMMANDS = {
    "stream": ["stream", "--bootstrap", "127.0.0.1:1"],
    "watch": ["watch", "--url", "1", "--once"],
    "compare": ["compare", "--url", "1", "--baseline-run", "a", "--candidate-run", "b", "--once"],
    "snapshot": ["snapshot", "--url", "1", "--run-id", "r", "--out", "o"],
    "curate": ["curate", "--url", "1", "--run-id", "r", "--out", "o"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("form", ["--http-token {}", "--http-token={}", "--http-token-fil={}"])
def test_the_token_is_never_taken_from_the_command_line(
    command: str, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: int | str | None
    try:
        code = main([*COMMANDS[command], *form.format(TOKEN).split()])
    except SystemExit as exc:  # argparse's
        code = exc.code
    assert code == 2
    said = capsys.readouterr()
    assert TOKEN not in said.out + said.err
    if form.startswith("--http-token "):
        assert "never read from the command line" in said.err


def test_token_files_and_variables_are_checked_and_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    short, good = tmp_path / "short", tmp_path / "good"
    short.write_text("s3cr3t-but-short\n"[:12])
    good.write_text(TOKEN + "\n")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    base = COMMANDS["watch"]
    for argv, said in (
        ([*base, "--http-token-file", str(short)], f"{short}: the token must be at least 16"),
        ([*base, "--http-token-file", str(tmp_path / "s3cr3t")], "cannot read the file"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and "s3cr3t" not in err, err
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main([*base, "--http-token-file", str(good)]) == 2
    err = capsys.readouterr().err
    assert "given twice" in err and TOKEN not in err
    monkeypatch.setenv(TOKEN_ENV, "short token")
    assert main(base) == 2
    err = capsys.readouterr().err
    assert f"${TOKEN_ENV}: the token must be" in err and "short token" not in err
    assert TOKEN not in repr(HttpSecurity(TOKEN))


@pytest.mark.parametrize(
    ("peer_name", "works"), [("rewardstream", True), (None, False), ("other", False)]
)
async def test_peers_certificates_are_checked_against_the_peer_name(
    tmp_path: Path, peer_name: str | None, works: bool
) -> None:
    """One certificate for every processor names a Service, not the pods' addresses: a peer
    fetches parts when told that name (``--http-peer-name``), and is refused otherwise."""
    certs = make_certs(tmp_path / "named", server_names="DNS:rewardstream")
    if certs is None:
        pytest.skip("openssl is not installed")

    def processor(name: str | None, state: str) -> StreamProcessor:
        security = HttpSecurity(TOKEN, certs.server_cert, certs.server_key, certs.ca, name)
        topics = Topics.for_prefix("named")
        return StreamProcessor(
            "127.0.0.1:1", None, topics, state_dir=tmp_path / state, http_security=security
        )

    server, asker = processor(None, "server"), processor(peer_name, "asker")
    app = make_app(server.pipeline, None, server, security=server.http_security)
    runner, port = await serve(app, "127.0.0.1", 0, security=server.http_security)
    session = asker.peers.open()
    try:
        if works:
            _, parts = await asker.peers._fetch_parts(f"https://127.0.0.1:{port}", RUN)
            assert parts == {}
        else:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await asker.peers._fetch_parts(f"https://127.0.0.1:{port}", RUN)
    finally:
        await session.close()
        await runner.cleanup()
        server.pipeline.close()
        asker.pipeline.close()


async def test_bad_tls_files_are_one_line_naming_the_option(tmp_path: Path, certs: Certs) -> None:
    missing = tmp_path / "missing.pem"
    for security, said in (
        (HttpSecurity(TOKEN, missing), f"--http-certfile: no such file '{missing}'"),
        (HttpSecurity(TOKEN, certs.server_cert, missing), "--http-keyfile: no such file"),
        (HttpSecurity(TOKEN, certs.server_cert, certs.client_key), "cannot load the certif"),
        (HttpSecurity(TOKEN, certs.ca), "cannot load the certificate and its key"),  # no key
    ):
        with pytest.raises(InputError, match=re.escape(said)):
            await serve(web.Application(), "127.0.0.1", 0, security=security)
    with pytest.raises(InputError, match="--http-cafile: no such file"):
        HttpSecurity(cafile=missing).client_context()
    with pytest.raises(InputError, match=r"--http-cafile .*: "):
        HttpSecurity(cafile=certs.server_key).client_context()  # a key, no certificate


def test_the_advertised_url_speaks_the_servers_scheme(tmp_path: Path, certs: Certs) -> None:
    """Peers are told where to fetch parts: an http:// URL for a TLS server (or the reverse)
    would fail every fetch, so it is refused at start."""
    tls = HttpSecurity(TOKEN, certs.server_cert, certs.server_key)
    for security, url in ((tls, "http://h:1"), (HttpSecurity(TOKEN), "https://h:1")):
        with pytest.raises(InputError, match="--advertise-url"):
            StreamProcessor("127.0.0.1:1", None, advertise=url, http_security=security)
    argv = ["stream", "--bootstrap", "127.0.0.1:1", "--advertise-url", "https://h:1"]
    assert main(argv) == 2


def _recorder(seen: list[str], status: int = 404) -> web.Application:
    """A peer answering ``status`` to every GET, keeping each request's ``Authorization``."""

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=status, text="{}")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    return app


@contextlib.asynccontextmanager
async def _asking(
    tmp_path: Path, security: HttpSecurity, peer: web.Application
) -> AsyncIterator[tuple[StreamProcessor, int]]:
    """A processor with ``security``, set to fetch parts, and ``peer`` served on loopback
    (its port)."""
    runner, port = await serve(peer, "127.0.0.1", 0)
    asker = StreamProcessor("127.0.0.1:1", None, state_dir=tmp_path, http_security=security)
    session = asker.peers.open()
    try:
        yield asker, port
    finally:
        await session.close()
        await runner.cleanup()
        asker.pipeline.close()


async def test_a_tls_processor_never_sends_its_token_in_the_clear(
    tmp_path: Path, certs: Certs
) -> None:
    """A member record naming an http:// URL (anyone who can write the members topic can
    forge one) gets no request from a processor serving TLS, so never its token."""
    seen: list[str] = []
    security = HttpSecurity(TOKEN, certs.server_cert, certs.server_key, certs.ca)
    async with _asking(tmp_path, security, _recorder(seen)) as (asker, port):
        with pytest.raises(Unavailable, match="https only"):
            await asker.peers._fetch_parts(f"http://127.0.0.1:{port}", RUN)
    assert seen == []


@pytest.mark.parametrize("peer", ["http://10.1.2.3:9400", "http://example.org:9400"])
async def test_a_token_over_plain_http_goes_to_loopback_peers_only(
    tmp_path: Path, peer: str
) -> None:
    """A processor with a token and no TLS (it serves loopback) asks a loopback peer with it,
    and refuses, without a connection, a peer beyond loopback a member record names."""
    seen: list[str] = []
    async with _asking(tmp_path, HttpSecurity(TOKEN), _recorder(seen)) as (asker, port):
        with pytest.raises(Unavailable, match="HTTP 404"):
            await asker.peers._fetch_parts(f"http://localhost:{port}", RUN)
        with pytest.raises(Unavailable, match="loopback peers only"):
            await asker.peers._fetch_parts(peer, RUN)
    assert seen == [f"Bearer {TOKEN}"]
    assert HttpSecurity(TOKEN, insecure_public=True).refuses_peer(peer) is None  # told so


async def test_no_client_follows_a_redirect_with_the_token(tmp_path: Path) -> None:
    """A peer or processor answering 307 elsewhere gets the token no further: the commands'
    client (urllib would forward ``Authorization``) and the processors' peer fetch both stop
    at the redirect."""
    seen: list[str] = []
    target_runner, target_port = await serve(_recorder(seen, 200), "127.0.0.1", 0)

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{target_port}{request.path_qs}")

    app = web.Application()
    app.router.add_get("/{tail:.*}", redirect)
    security = HttpSecurity(TOKEN)
    try:
        async with _asking(tmp_path, security, app) as (asker, port):
            with pytest.raises(Unavailable, match="HTTP 307"):
                await asker.peers._fetch_parts(f"http://127.0.0.1:{port}", RUN)
            with pytest.raises(urllib.error.HTTPError, match="307"):
                await asyncio.to_thread(open_url, security, f"http://127.0.0.1:{port}/runs")
    finally:
        await target_runner.cleanup()
    assert seen == []


# --------------------------------------------------------------------------- hosts and clients


def _members(bootstrap: str, prefix: str) -> list[bytes]:
    """Every record of the group's members topic, raw."""

    async def read() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            from rewardstream.sinks.topics.profiles import read_to_end

            topic = EngineTopics.of(Topics.for_prefix(prefix)).members
            return [r.value async for r in read_to_end(consumer, topic) if r.value is not None]
        finally:
            await consumer.stop()

    return asyncio.run(read())


@pytest.fixture
def secured_args(tmp_path: Path, certs: Certs) -> Iterator[list[str]]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    yield [
        *("--http-token-file", str(token_file), "--http-cafile", str(certs.ca)),
        *("--http-certfile", str(certs.server_cert), "--http-keyfile", str(certs.server_key)),
    ]


@pytest.mark.kafka
@pytest.mark.skipif(os.geteuid() != 0, reason="private mounts need root (unshare -m)")
def test_two_hosts_over_tls_with_a_token_and_their_clients(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    certs: Certs,
    secured_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two processors, each on a private disk, fetch each other's parts over TLS with the
    token (the final needs every part, and so does a snapshot from either), write one final
    equal to batch; the token is in no log and no member record, and every member record
    advertises https. watch, snapshot and curate work with the token and the CA, and say
    what is wrong without either."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=300, repeats=4, seed=31)
    prefix = unique_name("auth")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 4))
    log = tmp_path / "processors.log"
    client = HttpSecurity(TOKEN, cafile=certs.ca)
    members = [
        Processor(
            kafka_bootstrap,
            prefix,
            tmp_path / "unused",
            log,
            extra=secured_args,
            private_disk=tmp_path / name,
            client=client,
        )
        for name in ("a", "b")
    ]
    processors.extend(members)
    for p in members:
        assert p.url.startswith("https://")
        p.wait(lambda _: [len(m.units()) for m in members] == [4, 4])
    pub = tmp_path / "pub"
    pub.mkdir()
    for path in (inputs, rollouts):
        shutil.copy(path, pub / path.name)
    argv = ["publish", "--inputs", str(pub / inputs.name), "--rollouts", str(pub / rollouts.name)]
    argv += ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--run-id", "run"]
    assert main([*argv, "--quiet", "--wait-profile", "--wait-timeout", "90"]) == 0
    assert_batch_files(pub, inputs.parent)
    for p in members:
        p.wait(lambda runs: runs.get("run", {}).get("done") is True)

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    ca = ["--http-cafile", str(certs.ca)]
    for p in members:
        snap = tmp_path / f"snap-{p.port}"
        assert main(["snapshot", "--url", p.url, "--run-id", "run", "--out", str(snap), *ca]) == 0
        assert_batch_files(snap, inputs.parent)
        capsys.readouterr()
        assert main(["watch", "--url", p.url, "--once", *ca]) == 0
        assert "run" in capsys.readouterr().out
        out = tmp_path / f"curated-{p.port}.jsonl"
        argv = ["curate", "--url", p.url, "--run-id", "run", "--out", str(out), *ca]
        assert main([*argv, "--min-std", "0"]) == 0 and out.exists()
    url = members[0].url
    watch = ["watch", "--url", url, "--once"]
    assert main(watch) == 2  # the system's CAs do not know the test CA
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    monkeypatch.delenv(TOKEN_ENV)
    assert main([*watch, *ca]) == 2
    assert "HTTP 401, the processor wants a token" in capsys.readouterr().err
    monkeypatch.setenv(TOKEN_ENV, "x" * 40)
    assert main([*watch, *ca]) == 2
    assert "HTTP 401, the processor refused the token" in capsys.readouterr().err

    records = _members(kafka_bootstrap, prefix)
    assert records and all(TOKEN.encode() not in r for r in records)
    urls = {decode_member(r, prefix).url for r in records}
    assert urls == {p.url for p in members}, urls
    for p in members:
        p.kill(signal.SIGTERM)
        assert p.proc.returncode == 0
    said = log.read_text()
    assert "serving snapshots, parts and metrics on https://" in said
    assert TOKEN not in said
