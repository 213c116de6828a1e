"""The Run page: facts, graph, timeline, nodes, controls, history; live JSON; Stop, Set cap."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from steerflow import views
from steerflow.errors import AmbiguousIdError, SteerflowError, UnknownIdError, UsageError
from steerflow.studio._actions import budget_confirm_page, stop_confirm_page
from steerflow.studio._events import KINDS, events_page
from steerflow.studio._pages import error_page, server_timing
from steerflow.studio._routing import SESSION_ID, Page, StudioState, is_target, requested_caps
from steerflow.studio._run_pages import RECOVERABLE, readable_result, run_page

__all__ = ["routes"]


Settled = tuple[
    str | None,
    tuple[views.CheckpointReport, views.ResumePreflight] | None,
    dict[str, views.ResumePreflight],
]
#: (run id, change tag) -> what :meth:`RunPage._settled` read (the last 32 runs).
_SETTLED: OrderedDict[tuple[str, str], Settled] = OrderedDict()
_LOCK = threading.Lock()


class RunPage(Page):
    """``/runs/{target}``, ``/api/runs/{target}`` and the stop confirmation."""

    def run(self, request: Request) -> Response:
        began = time.perf_counter()
        response = self._run(request)
        # What the server spent on the page (benchmarks/studio.py reads it).
        response.headers["server-timing"] = server_timing(began)
        return response

    def _settled(self, target: str, view: views.RunView) -> Settled:
        """The result, checkpoint report and each recovery mode's dry run of a settled run.

        Five checkpoint loads and four dry runs: kept per run under the live answers'
        change tag (state DB ``data_version`` and the checkpoint files' stat), so a page
        reloaded while nothing changed reads none of them again. A running run has none.
        """
        if view.status == "running":
            return None, None, {}
        tag = self.answers.tag(view.run_id)
        key = (view.run_id, tag or "")
        with _LOCK:  # pages are served from a thread pool
            cached = _SETTLED.get(key) if tag is not None else None
            if cached is not None:
                _SETTLED.move_to_end(key)
                return cached
        recovery = None
        verdicts: dict[str, views.ResumePreflight] = {}
        if view.status in RECOVERABLE:
            recovery = (
                views.checkpoint_report(self.home, target),
                views.resume_preflight(self.home, target),
            )
            verdicts = _verdicts(self.home, target, recovery[1])
        found: Settled = (_result_text(self.home, view), recovery, verdicts)
        if tag is not None:
            with _LOCK:
                _SETTLED[key] = found
                while len(_SETTLED) > 32:
                    _SETTLED.popitem(last=False)
        return found

    def _run(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        try:
            view = views.show_run(self.home, target)
            graph = views.run_graph(self.home, target)
            control = views.control_status(self.home, view.session_id) if view.session_id else None
            result, recovery, verdicts = self._settled(target, view)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        notice = None
        asked = request.query_params.get("zoom", "")
        zoom = asked if asked in ZOOMS else None
        wanted = request.query_params.get("find", "").strip()[:200]
        if wanted:
            # Found: to the page with the node marked, scrolled to it (the fragment).
            hits = _find(graph, wanted)
            if len(hits) == 1:
                query = urlencode({"found": hits[0], **({"zoom": zoom} if zoom else {})})
                frag = "#dag-" + quote(hits[0], safe="")
                return RedirectResponse(f"{request.url.path}?{query}{frag}", 303)
            notice = (
                f"no node matches {wanted}"
                if not hits
                else f"{len(hits)} nodes match {wanted}: "
                + ", ".join(hits[:10])
                + (", …" if len(hits) > 10 else "")
            )
        found = request.query_params.get("found") or None
        found = found if found in {n.id for n in graph.nodes} else None
        started = request.query_params.get("resumed", "")
        if started.isdigit():
            notice = (
                f"steerflow resume started (pid {started}): the new run is listed under "
                "resumes once it has a session"
            )
        queued = request.query_params.get("queued", "")
        if SESSION_ID.fullmatch(queued):
            notice = _queued_notice(queued, control)
        page = run_page(
            view,
            graph,
            control,
            recovery,
            csrf=self.csrf,
            notice=notice,
            result=result,
            verdicts=verdicts,
            zoom=zoom,
            find=found,
        )
        return HTMLResponse(page)

    def live(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not is_target(target):
            return JSONResponse({"error": "no such run"}, 404)
        seen = request.headers.get("if-none-match")
        if seen is not None and seen == self.answers.tag(target):
            return Response(status_code=304, headers={"etag": seen})
        try:
            tag, body = self.answers.answer(target)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return JSONResponse({"error": str(exc)}, 404)
        return Response(body, media_type="application/json", headers={"etag": tag} if tag else {})

    def events(self, request: Request) -> Response:
        """``/runs/{target}/events?node=N&kind=K``: the run's event log, filtered."""
        target = request.path_params["target"]
        if not is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        try:
            view = views.show_run(self.home, target)
            control = views.control_status(self.home, view.session_id) if view.session_id else None
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        node = request.query_params.get("node") or None
        kind = request.query_params.get("kind") or None
        known = {n.id for n in view.nodes}
        return HTMLResponse(
            events_page(
                view,
                control,
                node=node if node in known else None,
                kind=kind if kind in KINDS else None,
            )
        )

    def confirm_stop(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not is_target(target):
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

    def confirm_budget(self, request: Request) -> Response:
        target = request.path_params["target"]
        if not is_target(target):
            return HTMLResponse(error_page("not found", "no such run"), 404)
        query = request.query_params
        try:
            caps = requested_caps(query.get("max_cost"), query.get("max_tokens"))
            view = views.show_run(self.home, target)
            control = views.control_status(self.home, view.session_id) if view.session_id else None
        except UsageError as exc:
            return HTMLResponse(error_page("usage error", str(exc)), 400)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        return HTMLResponse(budget_confirm_page(view, control, caps, csrf=self.csrf))


#: The graph's zoom levels (``_run_pages.graph_tools``).
ZOOMS = frozenset({"fit", "50", "100", "200"})


def _find(graph: views.RunGraph, wanted: str) -> list[str]:
    """Node ids ``wanted`` names: the exact id, else every id containing it (any case)."""
    ids = [n.id for n in graph.nodes]
    if wanted in ids:
        return [wanted]
    low = wanted.lower()
    return [i for i in ids if low in i.lower()]


def _verdicts(
    home: Path, target: str, default: views.ResumePreflight
) -> dict[str, views.ResumePreflight]:
    """Each recovery mode's own dry run: the page offers only what the resume accepts."""
    out = {"resume": default}
    for mode in ("retry_failed", "fork", "rerun_unsettled"):
        out[mode] = views.resume_preflight(
            home,
            target,
            retry_failed=mode == "retry_failed",
            fork=mode == "fork",
            rerun_unsettled=mode == "rerun_unsettled",
        )
    return out


def _queued_notice(control_id: str, control: views.ControlStatus | None) -> str:
    """The "queued control" notice while the control waits; once applied, its result.

    The page reloads itself when the flow stamps the row (and keeps its URL): the notice
    must then stop saying "queued".
    """
    entry = next((c for c in (control.controls if control else ()) if c.id == control_id), None)
    if entry is not None and entry.applied_at is not None and entry.result:
        return f"queued control {control_id}: {readable_result(entry.result)}"
    # The page reloads itself once the flow stamps the row: say where to look.
    return f"queued control {control_id}: the flow applies it (result in the control log)"


def _result_text(home: Path, view: views.RunView) -> str | None:
    """The run's result (``steerflow result``), None when there is none to read."""
    if not view.reachable or not view.checkpoint_exists:
        return None
    try:
        found = views.run_result(home, view.run_id)
    except SteerflowError:
        return None  # no result yet or a refused checkpoint: the recovery section says why
    return found.text or None


def routes(state: StudioState) -> list[Route]:
    """The Run page's routes."""
    page = RunPage(state)
    return [
        Route("/runs/{target}", page.run, methods=["GET"]),
        Route("/api/runs/{target}", page.live, methods=["GET"]),
        Route("/runs/{target}/stop", page.confirm_stop, methods=["GET"]),
        Route("/runs/{target}/events", page.events, methods=["GET"]),
        Route("/runs/{target}/budget", page.confirm_budget, methods=["GET"]),
    ]
