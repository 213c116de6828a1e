"""The Studio's ASGI app (Starlette): the access gate, then one module of routes per page.

``_route_runs`` (the Runs page), ``_route_run`` (a Run page), ``_route_node`` (a Node
page and its artifacts) and ``_route_actions`` (recovery with confirmation) each build
their routes over one shared :class:`~steerflow.studio._routing.StudioState`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.datastructures import URL, Headers
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steerflow.errors import SteerflowError
from steerflow.studio import (
    _route_actions,
    _route_approvals,
    _route_node,
    _route_run,
    _route_runs,
)
from steerflow.studio._assets import CACHE_FOREVER, STYLESHEET, STYLESHEET_VERSION
from steerflow.studio._pages import error_page
from steerflow.studio._routing import StudioState
from steerflow.studio._script import SCRIPT
from steerflow.studio._security import COOKIE, SECURITY_HEADERS, same_secret

__all__ = ["build_app"]

_DENIED = (
    "steerflow studio: open the URL printed when the studio started (it carries the access token)\n"
)


class Gate:
    """ASGI middleware: ``Host`` check, token-to-cookie exchange, cookie check, headers."""

    def __init__(
        self, app: ASGIApp, *, token: str, hosts: frozenset[str] | None, cookie: str = COOKIE
    ) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie
        #: Accepted ``Host`` headers; None accepts any (``--allow-remote``).
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # none is served: refuse before anyone is asked
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                # A route may set its own cache-control (the versioned stylesheet, cached
                # for a year); every other security header is always the Gate's.
                own = {k.lower() for k, _ in headers}
                headers += [
                    (k.encode(), v.encode())
                    for k, v in SECURITY_HEADERS
                    if not (k == "cache-control" and b"cache-control" in own)
                ]
                message = {**message, "headers": headers}
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        if self.hosts is not None and headers.get("host", "").lower() not in self.hosts:
            return PlainTextResponse("steerflow studio: unexpected Host header\n", 400)
        url = URL(scope=scope)
        query = parse_qs(url.query, keep_blank_values=True)
        if "token" in query:
            if scope["method"] != "GET" or not same_secret(query["token"][0], self.token):
                return PlainTextResponse(_DENIED, 401)
            rest = urlencode([(k, v) for k, vs in query.items() if k != "token" for v in vs])
            # "//host/..." would be another site to the browser: stay on this one.
            path = "/" if url.path.startswith("//") else url.path
            response = RedirectResponse(path + (f"?{rest}" if rest else ""), 303)
            response.set_cookie(
                self.cookie, self.token, httponly=True, samesite="strict", path="/", secure=False
            )
            return response
        cookie = _cookie(headers.get("cookie", ""), self.cookie)
        if not same_secret(cookie, self.token):
            return PlainTextResponse(_DENIED, 401)
        return None


def _cookie(header: str, wanted: str) -> str | None:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == wanted:
            return value
    return None


def _static() -> list[Route]:
    """The stylesheet, the one script, ``/`` and the favicon."""

    def stylesheet(request: Request) -> Response:
        # Only the URL the pages link (this version's hash) may be kept; any other asks
        # again each time (the Gate's no-store), so an old hash never pins a stale sheet.
        current = request.query_params.get("v") == STYLESHEET_VERSION
        headers = {"cache-control": CACHE_FOREVER} if current else None
        return Response(STYLESHEET, media_type="text/css", headers=headers)

    def script(request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript")

    def index(request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    def favicon(request: Request) -> Response:
        # Browsers ask on every page; an empty answer keeps a 404 out of their consoles.
        return Response(status_code=204)

    return [
        Route("/", index, methods=["GET"]),
        Route("/static/studio.css", stylesheet, methods=["GET"]),
        Route("/static/studio.js", script, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
    ]


def build_app(
    home: Path, *, token: str, hosts: frozenset[str] | None, cookie: str = COOKIE
) -> ASGIApp:
    """The Studio for ``home``: every request needs ``token`` (see :class:`Gate`).

    ``cookie`` is the cookie's name: cookies are shared by every port of a host, so each
    studio names its own (``serve`` appends the port) and two studios do not log each
    other out.
    """
    state = StudioState(home, token)
    routes = [
        *_static(),
        *_route_runs.routes(state),
        *_route_run.routes(state),
        *_route_node.routes(state),
        *_route_actions.routes(state),
        *_route_approvals.routes(state),
    ]
    app = Starlette(exception_handlers={SteerflowError: _refused}, routes=routes)
    return Gate(app, token=token, hosts=hosts, cookie=cookie)


def _refused(request: Request, exc: Exception) -> Response:
    """A steerflow error no route expected (an unreadable state DB): a page, not a 500 trace.

    The live JSON a page polls gets the same in JSON, so the script keeps the page as it is.
    """
    code = getattr(exc, "code", "error")
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc), "code": code}, 503)
    return HTMLResponse(error_page(str(code), str(exc)), 503)
