"""The Runs page: the list, its live JSON, and the control forms it posts."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from steerflow import views
from steerflow.control import Queued, enqueue_control
from steerflow.errors import (
    AmbiguousIdError,
    RefusedError,
    SteerflowError,
    UnknownIdError,
    UsageError,
)
from steerflow.studio._actions import already_queued_page, pending_control
from steerflow.studio._pages import (
    PAGE_SIZE,
    STATUSES,
    RunsQuery,
    error_page,
    runs_page,
    server_timing,
)
from steerflow.studio._routing import (
    SESSION_ID,
    VERBS,
    Page,
    StudioState,
    field_of,
    read_form,
    requested_caps,
)
from steerflow.studio._runs_list import SINCE, SORTS, runs_of
from steerflow.studio._security import same_secret
from steerflow.views import ControlEntry

__all__ = ["routes"]

#: Where a control form may send the operator back to (never another site).
_BACK = re.compile(r"/runs(/[0-9A-Za-z-]{1,64})?")


class RunsPage(Page):
    """``/runs``, ``/api/runs`` and the control forms' POST."""

    def runs(self, request: Request) -> Response:
        began = time.perf_counter()
        query = _runs_query(request)
        listed, more = runs_of(self.home, query, PAGE_SIZE)
        progress = views.run_progress(self.home, [r.session_id for r in listed])
        notice = None
        if SESSION_ID.fullmatch(request.query_params.get("queued", "")):
            verb = request.query_params.get("verb", "")
            notice = (
                f"queued {verb if verb in VERBS else 'control'} "
                f"{request.query_params['queued']}: not yet applied (the flow applies it)"
            )
        page = runs_page(listed, progress, query=query, csrf=self.csrf, more=more, notice=notice)
        return HTMLResponse(page, headers={"server-timing": server_timing(began)})

    def runs_live(self, request: Request) -> Response:
        query = _runs_query(request)
        seen = request.headers.get("if-none-match")
        if seen is not None and seen == self.answers.runs_tag(query):
            return Response(status_code=304, headers={"etag": seen})
        tag, body = self.answers.runs_answer(query, PAGE_SIZE)
        return Response(body, media_type="application/json", headers={"etag": tag} if tag else {})

    async def control(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_form(request)
        if body is None:
            return HTMLResponse(error_page("refused", "the form is too large"), 413)
        if not same_secret(field_of(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        verb = field_of(body, "verb")
        if not SESSION_ID.fullmatch(session_id) or verb not in VERBS:
            return HTMLResponse(error_page("usage error", "unknown session or control"), 400)
        back = field_of(body, "back") or "/runs"
        back = back if _BACK.fullmatch(back) else "/runs"
        if verb in ("stop", "budget"):
            # A second click on a confirmed Stop or Set cap: say what is queued, send nothing.
            waiting = await run_in_threadpool(_pending, self.home, session_id, verb)
            if waiting is not None:
                return HTMLResponse(already_queued_page(back, waiting), 409)
        try:
            queued = await run_in_threadpool(_send, self.home, session_id, verb, body)
        except UsageError as exc:
            return HTMLResponse(error_page("usage error", str(exc)), 400)
        except RefusedError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 409)
        except SteerflowError as exc:
            return HTMLResponse(error_page("error", str(exc)), 500)
        query = urlencode({"queued": queued.control_id, "verb": queued.verb})
        return RedirectResponse(f"{back}?{query}", 303)


def routes(state: StudioState) -> list[Route]:
    """The Runs page's routes."""
    page = RunsPage(state)
    return [
        Route("/runs", page.runs, methods=["GET"]),
        Route("/api/runs", page.runs_live, methods=["GET"]),
        Route("/sessions/{session_id}/control", page.control, methods=["POST"]),
    ]


def _send(home: Path, session_id: str, verb: str, form: dict[str, list[str]]) -> Queued:
    """Queue the control with the ``ctl`` writer (the page shows the session it went to)."""
    if verb == "pause":
        return enqueue_control(home, session_id, "pause", via="studio")
    if verb == "resume":
        return enqueue_control(home, session_id, "resume", via="studio")
    if verb == "message":
        return enqueue_control(
            home, session_id, "message", field_of(form, "text") or "", via="studio"
        )
    if verb == "budget":
        caps = requested_caps(field_of(form, "max_cost"), field_of(form, "max_tokens"))
        return enqueue_control(home, session_id, "budget", budget=caps, via="studio")
    now = field_of(form, "now") == "1"
    return enqueue_control(
        home, session_id, "stop", field_of(form, "reason") or None, now=now, via="studio"
    )


def _pending(home: Path, session_id: str, verb: str) -> ControlEntry | None:
    """The session's queued, not yet applied control of ``verb`` (None: none, or no session)."""
    try:
        return pending_control(views.control_status(home, session_id), verb)
    except (UnknownIdError, AmbiguousIdError):
        return None  # the writer refuses it with its own words


def _runs_query(request: Request) -> RunsQuery:
    """The Runs page's filters from its URL; an unknown status or a bad page is ignored."""
    wanted = request.query_params.get("status")
    page = request.query_params.get("page", "")
    since = request.query_params.get("since", "")
    sort = request.query_params.get("sort", "")
    return RunsQuery(
        status=wanted if wanted in STATUSES else None,
        text=request.query_params.get("q", "")[:200],
        page=min(int(page), 10**6) if page.isdigit() else 0,
        since=since if since in SINCE else "",
        sort=sort if sort in SORTS and sort != "newest" else "",
    )
