"""The processor's HTTP endpoint behind a bearer token (:mod:`rewardstream.infra.http_security`).

Every route but ``/healthz`` (a probe's: positions, no rows) and ``/login`` answers 401 without
``Authorization: Bearer <token>`` or the page's session cookie; ``/metrics`` too (Prometheus
sends the token: ``authorization.credentials_file``), since its labels name runs and agents.
A new route is covered without a word here. A browser cannot send a header, so the page asks
for the token once: a 401 to a browser is a login form, which POSTs it to ``/login`` (the token
never goes in a URL, where histories and proxies keep it); the answer is an HttpOnly,
SameSite=Strict cookie (Secure over TLS) holding an HMAC of the token, good for this browser
session, and a redirect back. Tokens and cookies are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import html

from aiohttp import web
from aiohttp.typedefs import Handler

from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.http.page import wants_page

__all__ = ["COOKIE", "OPEN", "require_token"]

OPEN = frozenset({"/healthz", "/login"})  # answered without the token
COOKIE = "rewardstream_session"

_FORM = """<!doctype html>
<html><head><meta charset="utf-8"><title>rewardstream: token</title></head>
<body style="font-family: sans-serif; margin: 3em">
<form method="post" action="/login">
<p>This processor wants its token{said}.</p>
<input type="hidden" name="next" value="{next}">
<input type="password" name="token" autofocus autocomplete="current-password" size="48">
<button type="submit">Open</button>
</form></body></html>
"""


def _session(token: str) -> str:
    """The cookie's value: it opens this server's page, and gives the token away to no one."""
    return hmac.new(token.encode(), b"rewardstream page session", hashlib.sha256).hexdigest()


def _form(next_url: str, said: str = "", status: int = 401) -> web.Response:
    body = _FORM.format(next=html.escape(next_url, quote=True), said=said)
    return web.Response(
        status=status,
        text=body,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "WWW-Authenticate": 'Bearer realm="rewardstream"'},
    )


def require_token(app: web.Application, security: HttpSecurity) -> None:
    """Guard every route of ``app`` (before any other middleware) and add ``/login``."""
    assert security.token is not None
    session = _session(security.token)

    def allowed(request: web.Request) -> bool:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and security.accepts(presented.strip()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(errors="surrogateescape"), session.encode())

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if (resource is not None and resource.canonical in OPEN) or allowed(request):
            return await handler(request)
        if request.method == "GET" and wants_page(request):
            return _form(request.path_qs)
        raise web.HTTPUnauthorized(
            text="401: this processor wants its token (Authorization: Bearer)",
            headers={"WWW-Authenticate": 'Bearer realm="rewardstream"'},
        )

    async def login_form(request: web.Request) -> web.Response:
        return _form(request.query.get("next", "/"), status=200)

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        token, next_url = form.get("token"), form.get("next")
        # only a path of this server: never a redirect elsewhere ("//host" is another host)
        if not isinstance(next_url, str) or not next_url.isprintable() or "\\" in next_url:
            next_url = "/"
        next_url = "/" + next_url.lstrip("/")
        if not isinstance(token, str) or not security.accepts(token.strip()):
            return _form(next_url, said=" (that one is not it)")
        response = web.Response(
            status=303, headers={"Location": next_url, "Cache-Control": "no-store"}
        )
        response.set_cookie(
            COOKIE, session, httponly=True, samesite="Strict", secure=security.tls, path="/"
        )
        return response

    app.middlewares.insert(0, guard)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
