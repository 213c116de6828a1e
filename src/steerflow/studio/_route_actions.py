"""The recovery actions: each mode's confirmation page, then the POST that starts it."""

from __future__ import annotations

from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from steerflow import views
from steerflow.errors import AmbiguousIdError, UnknownIdError, UsageError
from steerflow.plan import SYNTHESIS_KEY, is_agent_id
from steerflow.studio._actions import (
    MODES,
    already_page,
    rerun_confirm_page,
    rerun_flags,
    resume_confirm_page,
)
from steerflow.studio._pages import error_page, run_href
from steerflow.studio._routing import (
    Page,
    StudioState,
    field_of,
    is_target,
    read_form,
    requested_caps,
)
from steerflow.studio._security import same_secret

__all__ = ["routes"]


class ActionsPage(Page):
    """``/runs/{target}/resume``: GET confirms, POST starts."""

    async def start_resume(self, request: Request) -> Response:
        target = request.path_params["target"]
        body = await read_form(request)
        if body is None or not same_secret(field_of(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        mode = field_of(body, "mode") or "resume"
        if not is_target(target) or mode not in _RUN_MODES:
            return HTMLResponse(error_page("not found", "no such run or action"), 404)
        try:
            extra = _cap_flags(field_of(body, "max_cost"), field_of(body, "max_tokens"))
            preflight = await run_in_threadpool(_preflight, self.home, target, mode)
        except UsageError as exc:
            return HTMLResponse(error_page("usage error", str(exc)), 400)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        running = self.starter.running(preflight.run_id)
        if running is not None:  # a second click: say what already runs
            return HTMLResponse(already_page(preflight.run_id, running), 409)
        if preflight.refusal is not None:
            return HTMLResponse(error_page("refused", preflight.refusal.message), 409)
        started, new = await run_in_threadpool(self.starter.start, preflight.run_id, mode, extra)
        if not new:
            return HTMLResponse(already_page(preflight.run_id, started), 409)
        return RedirectResponse(f"{run_href(preflight.run_id)}?resumed={started.pid}", 303)

    def confirm_resume(self, request: Request) -> Response:
        target = request.path_params["target"]
        mode = request.query_params.get("mode", "resume")
        if not is_target(target) or mode not in _RUN_MODES:
            return HTMLResponse(error_page("not found", "no such run or action"), 404)
        query = request.query_params
        try:
            extra = _cap_flags(query.get("max_cost"), query.get("max_tokens"))
            preflight = _preflight(self.home, target, mode)
            nodes = views.show_run(self.home, target).nodes
        except UsageError as exc:
            return HTMLResponse(error_page("usage error", str(exc)), 400)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        ran = [n.id for n in nodes if n.status in ("failed", "interrupted", "running")]
        running = self.starter.running(preflight.run_id)
        shown = resume_confirm_page(
            preflight.run_id, mode, preflight, running, csrf=self.csrf, ran=ran, caps=extra
        )
        return HTMLResponse(shown)

    async def start_rerun(self, request: Request) -> Response:
        """POST ``/runs/{target}/rerun``: start ``resume --from NODE [--instruction]``."""
        target = request.path_params["target"]
        body = await read_form(request)
        if body is None or not same_secret(field_of(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        node = field_of(body, "node") or ""
        instruction = _lf(field_of(body, "instruction"))  # a browser sends CRLF
        if not is_target(target) or not _is_node(node):
            return HTMLResponse(error_page("not found", "no such run or node"), 404)
        edit = instruction if instruction else None
        try:
            preflight = await run_in_threadpool(_rerun_preflight, self.home, target, node, edit)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        running = self.starter.running(preflight.run_id)
        if running is not None:
            return HTMLResponse(already_page(preflight.run_id, running), 409)
        if preflight.refusal is not None:
            return HTMLResponse(error_page("refused", preflight.refusal.message), 409)
        started, new = await run_in_threadpool(
            self.starter.start, preflight.run_id, "rerun_from", rerun_flags(node, edit)
        )
        if not new:
            return HTMLResponse(already_page(preflight.run_id, started), 409)
        return RedirectResponse(f"{run_href(preflight.run_id)}?resumed={started.pid}", 303)

    def confirm_rerun(self, request: Request) -> Response:
        """GET ``/runs/{target}/rerun?node=N[&instruction=T]``: the fork's dry run first.

        The node page's form sends its (possibly edited) instruction and, in
        ``original``, the node's own: the same text is no edit.
        """
        target = request.path_params["target"]
        node = request.query_params.get("node", "")
        if not is_target(target) or not _is_node(node):
            return HTMLResponse(error_page("not found", "no such run or node"), 404)
        # A browser sends a textarea's line breaks as CRLF: the text typed has LF.
        given = _lf(request.query_params.get("instruction"))
        original = _lf(request.query_params.get("original"))
        edit = given if given and given != original else None
        try:
            preflight = _rerun_preflight(self.home, target, node, edit)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        running = self.starter.running(preflight.run_id)
        shown = rerun_confirm_page(preflight.run_id, node, edit, preflight, running, csrf=self.csrf)
        return HTMLResponse(shown)


def routes(state: StudioState) -> list[Route]:
    """The recovery actions' routes."""
    page = ActionsPage(state)
    return [
        Route("/runs/{target}/resume", page.start_resume, methods=["POST"]),
        Route("/runs/{target}/resume", page.confirm_resume, methods=["GET"]),
        Route("/runs/{target}/rerun", page.start_rerun, methods=["POST"]),
        Route("/runs/{target}/rerun", page.confirm_rerun, methods=["GET"]),
    ]


#: The run page's recovery modes; "Rerun from here" has its own route (it names a node).
_RUN_MODES = frozenset(MODES) - {"rerun_from"}


def _lf(text: str | None) -> str | None:
    return text.replace("\r\n", "\n") if text is not None else None


def _is_node(node: str | None) -> bool:
    return bool(node) and (node == SYNTHESIS_KEY or is_agent_id(str(node)))


def _rerun_preflight(
    home: Path, target: str, node: str, instruction: str | None
) -> views.ResumePreflight:
    """``resume --from NODE [--instruction TEXT] --dry-run``."""
    return views.resume_preflight(home, target, from_node=node, instruction=instruction)


def _cap_flags(max_cost: str | None, max_tokens: str | None) -> list[str]:
    """``--max-cost USD --max-tokens N`` of a raise-cap-and-resume form (none: no flags).

    Checked as ``ctl budget`` checks its caps (``UsageError``: 400).
    """
    if not (max_cost or "").strip() and not (max_tokens or "").strip():
        return []
    caps = requested_caps(max_cost, max_tokens)
    flags: list[str] = []
    if caps.get("max_cost") is not None:
        flags += ["--max-cost", repr(float(caps["max_cost"] or 0))]
    if caps.get("max_tokens") is not None:
        flags += ["--max-tokens", str(int(caps["max_tokens"] or 0))]
    return flags


def _preflight(home: Path, target: str, mode: str) -> views.ResumePreflight:
    """``resume --dry-run`` with the flags of recovery ``mode`` (see ``_actions.MODES``)."""
    return views.resume_preflight(
        home,
        target,
        retry_failed=mode == "retry_failed",
        fork=mode == "fork",
        rerun_unsettled=mode == "rerun_unsettled",
    )
