"""The Studio's ASGI app (Starlette): the access gate, then the pages over ``steerflow.views``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
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
from steerflow.studio._live import LiveRuns
from steerflow.studio._pages import CSS, STATUSES, error_page, run_href, runs_page
from steerflow.studio._run_pages import RECOVERABLE, node_page, run_page
from steerflow.studio._script import SCRIPT
from steerflow.studio._security import (
    COOKIE,
    SECURITY_HEADERS,
    csrf_token,
    same_secret,
)

__all__ = ["build_app"]

#: Runs the page lists; older ones are left out (``steerflow runs --all`` has them).
RUNS_SHOWN = 200
#: The largest form body read: a message is at most 64 KiB, plus the other fields.
MAX_FORM_BYTES = 128 * 1024
_SESSION_ID = re.compile(r"[0-9a-f]{32}")
_VERBS = ("pause", "resume", "message", "stop", "budget")
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

    def runs(self, request: Request) -> Response:
        wanted = request.query_params.get("status")
        status = wanted if wanted in STATUSES else None
        listed = views.list_runs(self.home, limit=RUNS_SHOWN, status=status)
        progress = views.run_progress(self.home, [r.session_id for r in listed])
        notice = None
        if _SESSION_ID.fullmatch(request.query_params.get("queued", "")):
            verb = request.query_params.get("verb", "")
            notice = (
                f"queued {verb if verb in _VERBS else 'control'} "
                f"{request.query_params['queued']}: not yet applied (the flow applies it)"
            )
        page = runs_page(listed, progress, status=status, csrf=self.csrf, notice=notice)
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
        wanted = request.query_params.get("status")
        status = wanted if wanted in STATUSES else None
        seen = request.headers.get("if-none-match")
        if seen is not None and seen == self.answers.runs_tag(status):
            return Response(status_code=304, headers={"etag": seen})
        tag, body = self.answers.runs_answer(status, RUNS_SHOWN)
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
        if not _is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        try:
            preflight = await run_in_threadpool(views.resume_preflight, self.home, target)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        if preflight.refusal is not None:
            return HTMLResponse(error_page("refused", preflight.refusal.message), 409)
        pid = await run_in_threadpool(_start_resume, self.home, preflight.run_id)
        return RedirectResponse(f"{run_href(preflight.run_id)}?resumed={pid}", 303)

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
        routes=[
            Route("/", pages.index, methods=["GET"]),
            Route("/runs", pages.runs, methods=["GET"]),
            Route("/runs/{target}", pages.run, methods=["GET"]),
            Route("/runs/{target}/nodes/{node}", pages.node, methods=["GET"]),
            Route("/runs/{target}/resume", pages.start_resume, methods=["POST"]),
            Route(
                "/runs/{target}/nodes/{node}/artifacts/{path:path}", pages.artifact, methods=["GET"]
            ),
            Route("/api/runs", pages.runs_live, methods=["GET"]),
            Route("/api/runs/{target}", pages.live, methods=["GET"]),
            Route("/sessions/{session_id}/control", pages.control, methods=["POST"]),
            Route("/static/studio.css", pages.stylesheet, methods=["GET"]),
            Route("/static/studio.js", pages.script, methods=["GET"]),
            Route("/favicon.ico", pages.favicon, methods=["GET"]),
        ]
    )
    return Gate(app, token=token, hosts=hosts, cookie=cookie)


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
    if verb == "budget":
        caps = {"max_cost": _usd(_field(form, "max_cost")), "max_tokens": None}
        return enqueue_control(home, session_id, "budget", budget=caps)
    return enqueue_control(home, session_id, "stop", _field(form, "reason") or None)


def _usd(text: str | None) -> float | None:
    """The form's new spend cap; a malformed one is a usage error (400), as for ``ctl``."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--max-cost: {text[:50]!r} is not a number of USD") from None


def _is_target(target: str) -> bool:
    """A run id or a session id: the only targets the pages link to."""
    return is_run_id(target) or bool(_SESSION_ID.fullmatch(target))


def _start_resume(home: Path, run_id: str) -> int:
    """Start ``steerflow resume RUN`` detached from the studio; returns its pid.

    Its output goes to ``<home>/studio/resume-<run>.log``; a thread reaps it when it ends.
    """
    logs = home / "studio"
    logs.mkdir(mode=0o700, exist_ok=True)
    log = logs / f"resume-{run_id}.log"
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "steerflow", "--home", str(home), "resume", run_id],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # a Ctrl-C in the studio's terminal does not reach it
            close_fds=True,
        )
    threading.Thread(target=proc.wait, name=f"reap-resume-{proc.pid}", daemon=True).start()
    return proc.pid


def _chunks(fd: int, size: int = 1 << 20) -> Iterator[bytes]:
    """The file's bytes (Starlette iterates this in a worker thread); closes ``fd``."""
    try:
        while chunk := os.read(fd, size):
            yield chunk
    finally:
        os.close(fd)
