"""``/approvals``: every request that waits, with its Approve and Deny forms (issue 41).

Approve, Approve with edited arguments, Deny with a reason: each a POST form carrying the
page's CSRF token, as every Studio form does.

A decision is queued exactly as ``steerflow ctl approve|deny`` queues it (sender
``studio:...``); the page shows the arguments as JSON text, escaped, never as markup.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from steerflow import views
from steerflow.control._decide import parse_args_json, send_decision
from steerflow.errors import RefusedError, UsageError
from steerflow.studio._pages import error_page, esc, page, run_href, when
from steerflow.studio._routing import Page, StudioState, field_of, read_form
from steerflow.studio._security import same_secret

__all__ = ["approvals_table", "routes"]


def _forms(request: views.ApprovalRequest, csrf: str) -> str:
    hidden = (
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="run" value="{esc(request.run_id or request.session_id)}">'
        f'<input type="hidden" name="request_id" value="{esc(request.request_id)}">'
    )
    args = json.dumps(request.args, sort_keys=True)
    return (
        f'<form class="inline" method="post" action="/approvals/decide">{hidden}'
        '<input type="hidden" name="verb" value="approve"><button>Approve</button></form>'
        f'<form class="inline" method="post" action="/approvals/decide">{hidden}'
        '<input type="hidden" name="verb" value="approve">'
        f'<input name="args" size="40" value="{esc(args)}" aria-label="edited arguments">'
        "<button>Approve with these arguments</button></form>"
        f'<form class="inline" method="post" action="/approvals/decide">{hidden}'
        '<input type="hidden" name="verb" value="deny">'
        '<input name="reason" size="30" placeholder="reason" aria-label="reason">'
        "<button>Deny</button></form>"
    )


def approvals_table(found: list[views.ApprovalRequest], csrf: str) -> str:
    """The table of waiting requests (empty: a line saying none waits)."""
    if not found:
        return '<p class="empty">no approval request waits</p>'
    rows = []
    for r in found:
        what = f"tool {r.tool}" if r.tool else "the node's call"
        target = r.run_id or r.session_id
        rows.append(
            f'<tr id="{esc(r.request_id)}"><td><code>{esc(r.request_id)}</code></td>'
            f'<td><a href="{esc(run_href(target))}">{esc(target)}</a> ({esc(r.status)})</td>'
            f"<td>{esc(r.node)}</td><td>{esc(what)}</td>"
            f"<td><code>{esc(json.dumps(r.args, sort_keys=True))}</code>"
            f'<div class="said">{esc(r.text[:500])}</div></td>'
            f"<td>{esc(when(r.requested_at))}</td><td>{_forms(r, csrf)}</td></tr>"
        )
    head = (
        "<tr><th>request</th><th>run</th><th>node</th><th>what</th><th>arguments</th>"
        "<th>waiting since</th><th>decide</th></tr>"
    )
    return f'<table class="approvals">{head}{"".join(rows)}</table>'


class ApprovalsPage(Page):
    """``/approvals``: GET lists, POST ``/approvals/decide`` queues one decision."""

    async def show(self, request: Request) -> Response:
        found = await run_in_threadpool(views.list_approvals, self.home)
        sent = request.query_params.get("sent")
        note = f'<p class="note">queued decision {esc(sent)}</p>' if sent else ""
        body = f"<h2>approvals</h2>{note}{approvals_table(found, self.csrf)}"
        return HTMLResponse(page("steerflow studio: approvals", body, section="approvals"))

    async def decide(self, request: Request) -> Response:
        body = await read_form(request)
        if body is None or not same_secret(field_of(body, "csrf"), self.csrf):
            return HTMLResponse(error_page("refused", "missing or wrong CSRF token"), 403)
        verb = field_of(body, "verb")
        run, request_id = field_of(body, "run") or "", field_of(body, "request_id") or ""
        if verb not in ("approve", "deny"):
            return HTMLResponse(error_page("refused", "no such decision"), 400)
        try:
            raw = (field_of(body, "args") or "").strip()
            args = parse_args_json(raw, where="edited arguments") if raw else None
            reason = (field_of(body, "reason") or "").strip() or None
            decision: Any = verb  # checked above: approve or deny
            queued = await run_in_threadpool(
                lambda: send_decision(
                    self.home, run, decision, request_id, args=args, reason=reason, via="studio"
                )
            )
        except UsageError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 400)
        except RefusedError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 409)
        return RedirectResponse(f"/approvals?sent={quote(queued.control_id)}", 303)


def routes(state: StudioState) -> list[Route]:
    """The approvals page's routes."""
    approvals = ApprovalsPage(state)
    return [
        Route("/approvals", approvals.show, methods=["GET"]),
        Route("/approvals/decide", approvals.decide, methods=["POST"]),
    ]
