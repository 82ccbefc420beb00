"""Who may use a processor's HTTP endpoint, and over what: a bearer token and TLS.

The processor serves every task's ``sample`` row (``/parts``, snapshots, downloads), so beyond
loopback it wants a token: every request but ``/healthz`` (and the page's ``/login``) carries
``Authorization: Bearer <token>`` or the page's session cookie
(:mod:`rewardstream.processors.http.auth`). The same token serves the processor's peers (they fetch
each other's parts), ``watch``, ``snapshot``, ``curate --url`` and Prometheus.

The token is read from a file (``--http-token-file``, or ``$REWARDSTREAM_HTTP_TOKEN_FILE``) or
from ``$REWARDSTREAM_HTTP_TOKEN``, never from the command line, which every user of the host
sees in ``ps``; no repr, log line or error shows it. Every other setting is an option that
defaults to its ``REWARDSTREAM_HTTP_<NAME>`` variable. Standard library only: the client
commands import this when they start, and start in ~0.1 s.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rewardstream.errors import InputError

__all__ = [
    "ENV_PREFIX",
    "MIN_TOKEN_CHARS",
    "TOKEN_ENV",
    "HttpSecurity",
    "add_client_arguments",
    "add_server_arguments",
    "from_args",
    "open_url",
]

ENV_PREFIX = "REWARDSTREAM_HTTP_"
TOKEN_ENV = ENV_PREFIX + "TOKEN"
MIN_TOKEN_CHARS = 16  # e.g. `openssl rand -hex 32`: 64
_TOKEN_HINT = f"--http-token-file FILE or ${TOKEN_ENV}"


@dataclass(frozen=True)
class HttpSecurity:
    """The endpoint's token and TLS files (a server's ``certfile``/``keyfile``; a client's, and
    a processor's towards its peers, ``cafile`` and ``peer_name``)."""

    token: str | None = field(default=None, repr=False)
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None
    peer_name: str | None = None  # the name peers' certificates are checked against
    insecure_public: bool = False  # serve beyond loopback without a token

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def accepts(self, presented: str) -> bool:
        """``presented`` is the token, compared in constant time (no timing oracle)."""
        return self.token is not None and hmac.compare_digest(
            presented.encode(errors="surrogateescape"), self.token.encode()
        )

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def check_bind(self, host: str, port: int) -> None:
        """Refuse to serve beyond loopback without a token and TLS, unless told
        ``--insecure-public``: a token over plain HTTP is anyone's on the path, and goes to
        any peer a (forgeable) member record names."""
        if self.insecure_public or _loopback(host):
            return
        if self.token is None:
            raise InputError(
                f"--http {host}:{port} is reachable beyond this host and no token is set "
                f"({_TOKEN_HINT}); --insecure-public to serve every run's prompts to anyone"
            )
        if not self.tls:
            raise InputError(
                f"--http {host}:{port} is reachable beyond this host over plain HTTP: the token "
                "would cross the network in clear text; --http-certfile and --http-cafile "
                "(TLS), or --insecure-public"
            )

    def check_peers(self) -> None:
        """A processor serving TLS with a token sends it to peers whose certificate its own
        ``--http-cafile`` signed, never to one the system's CAs accept: a forged member record
        may name any host with a public certificate."""
        if self.token is not None and self.tls and self.cafile is None:
            raise InputError(
                "--http-certfile with a token needs --http-cafile: peers' certificates are "
                "checked against that CA alone, never the system's (a member record, which "
                "whoever writes the members topic can forge, may name any public host)"
            )

    def refuses_peer(self, url: str) -> str | None:
        """Why this processor must not ask ``url`` (a peer named by a member record) for
        parts with its token, or None: a processor serving TLS asks over https only; one
        with a token over plain HTTP (loopback, or ``--insecure-public``) asks loopback peers
        only, unless told ``--insecure-public``."""
        https = url.startswith("https://")
        if self.tls and not https:
            return "a processor serving TLS asks its peers over https only"
        host = urllib.parse.urlsplit(url).hostname or ""
        if (
            self.token is not None
            and not https
            and not self.insecure_public
            and not _loopback(host)
        ):
            return f"its token goes over plain http to loopback peers only, not to {host!r}"
        return None

    def check_advertised(self, url: str) -> None:
        """Peers are told ``url``: its scheme must be the one this server speaks."""
        if not url.startswith(f"{self.scheme}://"):
            with_tls = "with" if self.tls else "without"
            raise InputError(
                f"--advertise-url {url}: this processor serves {self.scheme}:// ({with_tls} "
                "--http-certfile)"
            )

    def server_context(self) -> ssl.SSLContext | None:
        """The TLS context of a server with ``certfile`` (None: plain HTTP)."""
        if self.certfile is None:
            return None
        _exists(self.certfile, "--http-certfile")
        if self.keyfile is not None:
            _exists(self.keyfile, "--http-keyfile")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except ssl.SSLError as exc:
            raise InputError(
                f"--http-certfile {self.certfile}, --http-keyfile {self.keyfile}: cannot load "
                f"the certificate and its key: {exc.reason or exc}"
            ) from None
        return context

    def client_context(self) -> ssl.SSLContext:
        """A verifying context (hostname checked): ``cafile``'s CAs, else the system's."""
        if self.cafile is not None:
            _exists(self.cafile, "--http-cafile")
        try:
            return ssl.create_default_context(cafile=self.cafile)
        except ssl.SSLError as exc:
            raise InputError(f"--http-cafile {self.cafile}: {exc.reason or exc}") from None


def _exists(path: Path, option: str) -> None:
    if not path.is_file():
        raise InputError(f"{option}: no such file '{path}'")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _read_token(file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token from ``file`` or ``$REWARDSTREAM_HTTP_TOKEN`` (one of them), checked; errors
    name where it came from, never what it is."""
    value, where = environ.get(TOKEN_ENV) or None, f"${TOKEN_ENV}"
    if file is not None:
        if value is not None:
            raise InputError(f"the token is given twice: {file} and ${TOKEN_ENV}; keep one")
        try:
            value, where = Path(file).read_text(errors="surrogateescape"), file
        except OSError as exc:  # not named: it may be a token put where a file goes
            raise InputError(
                f"--http-token-file: cannot read the file it names ({exc.strerror or exc}); it "
                "names a file holding the token, never the token itself"
            ) from None
    if value is None:
        return None
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS or not all("!" <= c <= "~" for c in token):
        raise InputError(
            f"{where}: the token must be at least {MIN_TOKEN_CHARS} printable ASCII characters "
            "without spaces (e.g. `openssl rand -hex 32`)"
        )
    return token


class _Refused(argparse.Action):
    """``--http-token VALUE``: refused without echoing VALUE. Defined so that argparse never
    takes it for an abbreviation of ``--http-token-file`` (whose error would show it)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        parser.error(f"the token is never read from the command line: use {_TOKEN_HINT}")


def _option(group: Any, name: str, help_text: str) -> None:
    variable = ENV_PREFIX + name.upper().replace("-", "_")
    group.add_argument(
        f"--http-{name}",
        dest=f"http_{name.replace('-', '_')}",
        default=os.environ.get(variable) or None,
        metavar="FILE" if name.endswith("file") else "NAME",
        help=f"{help_text} (${variable})",
    )


def add_client_arguments(parser: argparse.ArgumentParser) -> Any:
    """The options of a command that asks a processor over HTTP (returns their group)."""
    group = parser.add_argument_group(
        "HTTP security",
        f"the processor's token: --http-token-file or ${TOKEN_ENV} (docs/security.md)",
    )
    _option(group, "token-file", "a file holding the processor's bearer token")
    group.add_argument(
        "--http-token",
        nargs="?",
        action=_Refused,
        metavar="REFUSED",
        help="refused: a command line is seen in ps (the token file or variable instead)",
    )
    _option(group, "cafile", "the CA bundle that signed the processor's certificate")
    return group


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rewardstream stream``: its server's, and those for its peers."""
    group = add_client_arguments(parser)
    _option(group, "certfile", "serve HTTPS with this certificate (PEM, chain first)")
    _option(group, "keyfile", "the certificate's private key (PEM; default: in the certfile)")
    _option(
        group,
        "peer-name",
        "check peers' certificates against NAME, not their advertised host (one certificate "
        "for every processor, e.g. on Kubernetes)",
    )
    group.add_argument(
        "--insecure-public",
        action="store_true",
        help="serve beyond loopback without a token or TLS (anyone reaching the port, or "
        "watching the network, reads every run)",
    )


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> HttpSecurity:
    """The settings of a command parsed with :func:`add_client_arguments` or
    :func:`add_server_arguments`; checks that the files agree."""
    env = os.environ if environ is None else environ
    paths = {
        name: Path(value) if (value := getattr(args, f"http_{name}", None)) else None
        for name in ("certfile", "keyfile", "cafile")
    }
    if paths["keyfile"] is not None and paths["certfile"] is None:
        raise InputError("--http-keyfile needs --http-certfile")
    return HttpSecurity(
        token=_read_token(args.http_token_file, env),
        peer_name=getattr(args, "http_peer_name", None),
        insecure_public=getattr(args, "insecure_public", False),
        **paths,
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an error (:class:`urllib.error.HTTPError`), never followed: urllib would send
    the token on to wherever it points. A processor never redirects its clients."""

    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


def open_url(
    security: HttpSecurity, url: str, method: str = "GET", timeout: float = 10
) -> IO[bytes]:
    """``urlopen`` with the token and, for https, a context verifying with ``cafile``; no
    redirect is followed; a refused token (401) is an :class:`InputError` saying how to give
    one."""
    https = url.startswith("https://")
    if security.cafile is not None and not https:
        raise InputError(f"--http-cafile is set, but {url} is not https://")
    request = urllib.request.Request(url, method=method, headers=security.headers())
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if https:
        handlers.append(urllib.request.HTTPSHandler(context=security.client_context()))
    try:
        response: IO[bytes] = urllib.request.build_opener(*handlers).open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            raise
        said = "refused the token" if security.token else "wants a token"
        raise InputError(f"{url}: HTTP 401, the processor {said} ({_TOKEN_HINT})") from None
    return response
