"""The Studio's ASGI app (Starlette): the access gate, then the pages over ``steerflow.views``."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL, Headers
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steerflow import views
from steerflow.control import Queued, enqueue_control
from steerflow.errors import (
    AmbiguousIdError,
    RefusedError,
    SteerflowError,
    UnknownIdError,
    UsageError,
)
from steerflow.home import is_run_id
from steerflow.plan import is_agent_id
from steerflow.studio._actions import (
    MODES,
    Starter,
    already_page,
    resume_confirm_page,
    stop_confirm_page,
)
from steerflow.studio._live import LiveRuns
from steerflow.studio._pages import (
    CSS,
    PAGE_SIZE,
    STATUSES,
    RunsQuery,
    error_page,
    run_href,
    runs_page,
)
from steerflow.studio._run_pages import RECOVERABLE, node_page, run_page
from steerflow.studio._script import SCRIPT
from steerflow.studio._security import (
    COOKIE,
    SECURITY_HEADERS,
    csrf_token,
    same_secret,
)

__all__ = ["build_app"]

#: The largest form body read: a message is at most 64 KiB, plus the other fields.
MAX_FORM_BYTES = 128 * 1024
_SESSION_ID = re.compile(r"[0-9a-f]{32}")
_VERBS = ("pause", "resume", "message", "stop")
#: Where a control form may send the operator back to (never another site).
_BACK = re.compile(r"/runs(/[0-9A-Za-z-]{1,64})?")
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
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS]
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


class _Pages:
    """The Studio's request handlers for one home (each route's function is a method)."""

    def __init__(self, home: Path, token: str) -> None:
        self.home = home
        self.csrf = csrf_token(token)
        self.answers = LiveRuns(home)
        self.starter = Starter(home)

    def runs(self, request: Request) -> Response:
        query = _runs_query(request)
        listed = views.list_runs(
            self.home,
            limit=PAGE_SIZE + 1,
            offset=query.page * PAGE_SIZE,
            status=query.status,
            text=query.text,
        )
        more, listed = len(listed) > PAGE_SIZE, listed[:PAGE_SIZE]
        progress = views.run_progress(self.home, [r.session_id for r in listed])
        notice = None
        if _SESSION_ID.fullmatch(request.query_params.get("queued", "")):
            verb = request.query_params.get("verb", "")
            notice = (
                f"queued {verb if verb in _VERBS else 'control'} "
                f"{request.query_params['queued']}: not yet applied (the flow applies it)"
            )
        page = runs_page(listed, progress, query=query, csrf=self.csrf, more=more, notice=notice)
        return HTMLResponse(page)

    async def control(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await _read_form(request)
        if body is None:
            return HTMLResponse(error_page("refused", "the form is too large"), 413)
        if not same_secret(_field(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        verb = _field(body, "verb")
        if not _SESSION_ID.fullmatch(session_id) or verb not in _VERBS:
            return HTMLResponse(error_page("usage error", "unknown session or control"), 400)
        try:
            queued = await run_in_threadpool(_send, self.home, session_id, verb, body)
        except UsageError as exc:
            return HTMLResponse(error_page("usage error", str(exc)), 400)
        except RefusedError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 409)
        except SteerflowError as exc:
            return HTMLResponse(error_page("error", str(exc)), 500)
        query = urlencode({"queued": queued.control_id, "verb": queued.verb})
        back = _field(body, "back") or "/runs"
        return RedirectResponse(f"{back if _BACK.fullmatch(back) else '/runs'}?{query}", 303)

    def run(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not _is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        try:
            view = views.show_run(self.home, target)
            graph = views.run_graph(self.home, target)
            control = views.control_status(self.home, view.session_id) if view.session_id else None
            recovery = None
            if view.status in RECOVERABLE:
                recovery = (
                    views.checkpoint_report(self.home, target),
                    views.resume_preflight(self.home, target),
                )
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        notice = None
        started = request.query_params.get("resumed", "")
        if started.isdigit():
            notice = (
                f"steerflow resume started (pid {started}): the new run is listed under "
                "resumes once it has a session"
            )
        queued = request.query_params.get("queued", "")
        if _SESSION_ID.fullmatch(queued):
            # The page reloads itself once the flow stamps the row: say where to look.
            notice = f"queued control {queued}: the flow applies it (result in the control log)"
        return HTMLResponse(run_page(view, graph, control, recovery, csrf=self.csrf, notice=notice))

    def node(self, request: Request) -> Response:
        target, key = request.path_params["target"], request.path_params["node"]
        if not _is_target(target) or not is_agent_id(key):
            return HTMLResponse(error_page("not found", "no such node"), 404)
        try:
            detail = views.node_detail(self.home, target, key)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        return HTMLResponse(node_page(detail))

    def artifact(self, request: Request) -> Response:
        target, key = request.path_params["target"], request.path_params["node"]
        path = request.path_params["path"]
        if not _is_target(target) or not is_agent_id(key):
            return HTMLResponse(error_page("not found", "no such node"), 404)
        try:
            opened = views.open_artifact(self.home, target, key, path)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        except RefusedError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 409)
        name = path.rsplit("/", 1)[-1]
        return StreamingResponse(
            _chunks(opened.fd),
            media_type="application/octet-stream",
            headers={
                # Never rendered in the studio's origin: an artifact is data, not a page.
                "content-disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
                "content-length": str(opened.size),
                "x-steerflow-recorded-digest": str(opened.record.get("digest") or ""),
            },
        )

    def runs_live(self, request: Request) -> Response:
        query = _runs_query(request)
        seen = request.headers.get("if-none-match")
        if seen is not None and seen == self.answers.runs_tag(query):
            return Response(status_code=304, headers={"etag": seen})
        tag, body = self.answers.runs_answer(query, PAGE_SIZE)
        return Response(body, media_type="application/json", headers={"etag": tag} if tag else {})

    def live(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not _is_target(target):
            return JSONResponse({"error": "no such run"}, 404)
        seen = request.headers.get("if-none-match")
        if seen is not None and seen == self.answers.tag(target):
            return Response(status_code=304, headers={"etag": seen})
        try:
            tag, body = self.answers.answer(target)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return JSONResponse({"error": str(exc)}, 404)
        return Response(body, media_type="application/json", headers={"etag": tag} if tag else {})

    async def start_resume(self, request: Request) -> Response:
        target = request.path_params["target"]
        body = await _read_form(request)
        if body is None or not same_secret(_field(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        mode = _field(body, "mode") or "resume"
        if not _is_target(target) or mode not in MODES:
            return HTMLResponse(error_page("not found", "no such run or action"), 404)
        try:
            preflight = await run_in_threadpool(_preflight, self.home, target, mode)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        running = self.starter.running(preflight.run_id)
        if running is not None:  # a second click: say what already runs
            return HTMLResponse(already_page(preflight.run_id, running), 409)
        if preflight.refusal is not None:
            return HTMLResponse(error_page("refused", preflight.refusal.message), 409)
        started, new = await run_in_threadpool(self.starter.start, preflight.run_id, mode)
        if not new:
            return HTMLResponse(already_page(preflight.run_id, started), 409)
        return RedirectResponse(f"{run_href(preflight.run_id)}?resumed={started.pid}", 303)

    def confirm_resume(self, request: Request) -> Response:
        target = request.path_params["target"]
        mode = request.query_params.get("mode", "resume")
        if not _is_target(target) or mode not in MODES:
            return HTMLResponse(error_page("not found", "no such run or action"), 404)
        try:
            preflight = _preflight(self.home, target, mode)
            nodes = views.show_run(self.home, target).nodes
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        ran = [n.id for n in nodes if n.status in ("failed", "interrupted", "running")]
        running = self.starter.running(preflight.run_id)
        shown = resume_confirm_page(
            preflight.run_id, mode, preflight, running, csrf=self.csrf, ran=ran
        )
        return HTMLResponse(shown)

    def confirm_stop(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not _is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        try:
            view = views.show_run(self.home, target)
            control = views.control_status(self.home, view.session_id) if view.session_id else None
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        now = request.query_params.get("now") == "1"
        reason = request.query_params.get("reason", "")[:500]
        return HTMLResponse(
            stop_confirm_page(view, control, now=now, reason=reason, csrf=self.csrf)
        )

    def stylesheet(self, request: Request) -> Response:
        return Response(CSS, media_type="text/css")

    def script(self, request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript")

    def index(self, request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    def favicon(self, request: Request) -> Response:
        # Browsers ask on every page; an empty answer keeps a 404 out of their consoles.
        return Response(status_code=204)


def build_app(
    home: Path, *, token: str, hosts: frozenset[str] | None, cookie: str = COOKIE
) -> ASGIApp:
    """The Studio for ``home``: every request needs ``token`` (see :class:`Gate`).

    ``cookie`` is the cookie's name: cookies are shared by every port of a host, so each
    studio names its own (``serve`` appends the port) and two studios do not log each
    other out.
    """
    pages = _Pages(home, token)
    app = Starlette(
        exception_handlers={SteerflowError: _refused},
        routes=[
            Route("/", pages.index, methods=["GET"]),
            Route("/runs", pages.runs, methods=["GET"]),
            Route("/runs/{target}", pages.run, methods=["GET"]),
            Route("/runs/{target}/nodes/{node}", pages.node, methods=["GET"]),
            Route("/runs/{target}/resume", pages.start_resume, methods=["POST"]),
            Route("/runs/{target}/resume", pages.confirm_resume, methods=["GET"]),
            Route("/runs/{target}/stop", pages.confirm_stop, methods=["GET"]),
            Route(
                "/runs/{target}/nodes/{node}/artifacts/{path:path}", pages.artifact, methods=["GET"]
            ),
            Route("/api/runs", pages.runs_live, methods=["GET"]),
            Route("/api/runs/{target}", pages.live, methods=["GET"]),
            Route("/sessions/{session_id}/control", pages.control, methods=["POST"]),
            Route("/static/studio.css", pages.stylesheet, methods=["GET"]),
            Route("/static/studio.js", pages.script, methods=["GET"]),
            Route("/favicon.ico", pages.favicon, methods=["GET"]),
        ],
    )
    return Gate(app, token=token, hosts=hosts, cookie=cookie)


def _refused(request: Request, exc: Exception) -> Response:
    """A steerflow error no route expected (an unreadable state DB): a page, not a 500 trace.

    The live JSON a page polls gets the same in JSON, so the script keeps the page as it is.
    """
    code = getattr(exc, "code", "error")
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc), "code": code}, 503)
    return HTMLResponse(error_page(str(code), str(exc)), 503)


async def _read_form(request: Request) -> dict[str, list[str]] | None:
    """An urlencoded form body, or None when it is larger than ``MAX_FORM_BYTES``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return parse_qs(b"".join(chunks).decode("utf-8", "replace"), keep_blank_values=True)


def _field(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def _send(home: Path, session_id: str, verb: str, form: dict[str, list[str]]) -> Queued:
    """Queue the control with the ``ctl`` writer (the page shows the session it went to)."""
    if verb == "pause":
        return enqueue_control(home, session_id, "pause")
    if verb == "resume":
        return enqueue_control(home, session_id, "resume")
    if verb == "message":
        return enqueue_control(home, session_id, "message", _field(form, "text") or "")
    now = _field(form, "now") == "1"
    return enqueue_control(home, session_id, "stop", _field(form, "reason") or None, now=now)


def _runs_query(request: Request) -> RunsQuery:
    """The Runs page's filters from its URL; an unknown status or a bad page is ignored."""
    wanted = request.query_params.get("status")
    page = request.query_params.get("page", "")
    return RunsQuery(
        status=wanted if wanted in STATUSES else None,
        text=request.query_params.get("q", "")[:200],
        page=min(int(page), 10**6) if page.isdigit() else 0,
    )


def _is_target(target: str) -> bool:
    """A run id or a session id: the only targets the pages link to."""
    return is_run_id(target) or bool(_SESSION_ID.fullmatch(target))


def _preflight(home: Path, target: str, mode: str) -> views.ResumePreflight:
    """``resume --dry-run`` with the flags of recovery ``mode`` (see ``_actions.MODES``)."""
    return views.resume_preflight(
        home,
        target,
        retry_failed=mode == "retry_failed",
        fork=mode == "fork",
        rerun_unsettled=mode == "rerun_unsettled",
    )


def _chunks(fd: int, size: int = 1 << 20) -> Iterator[bytes]:
    """The file's bytes (Starlette iterates this in a worker thread); closes ``fd``."""
    try:
        while chunk := os.read(fd, size):
            yield chunk
    finally:
        os.close(fd)
