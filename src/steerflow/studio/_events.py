"""A run's event log: what happened, in time order, with millisecond times (issue 42 item 4).

Built only from what is already recorded (no new source of truth): the session row
(start, end, stop reason, budget reached, death), the published node rows (each node's
start and end), the control rows (queued, applied, with the node that took a message),
the resume links, and the checkpoint's last save (the journal's time). Each event has a
``kind`` (``run``, ``node``, ``control``, ``resume``, ``checkpoint``) and, where one is
concerned, its ``node``: the log page filters on both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

from steerflow.studio._pages import esc, page, run_href
from steerflow.studio._words import payload_words, readable_result, sender_of
from steerflow.views import ControlStatus, RunView
from steerflow.views._runs import saved_at

__all__ = ["KINDS", "Event", "events", "events_page", "events_table", "when_ms"]

#: Event kinds, in the order the filter offers them.
KINDS = ("run", "node", "control", "resume", "checkpoint")


@dataclass(frozen=True)
class Event:
    """One recorded moment of a run."""

    at: float
    kind: str
    what: str
    detail: str
    node: str | None = None


def when_ms(epoch: float | None) -> str:
    """UTC time with milliseconds (two events of one second stay apart)."""
    if epoch is None:
        return "-"
    ms = min(int((epoch % 1) * 1000), 999)  # truncated, as the seconds are
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + f".{ms:03d}Z"


def _run_events(view: RunView) -> list[Event]:
    """Start, and how the run ended: completed, failed, stopped (why), budget, death."""
    out: list[Event] = []
    meta = view.metadata
    if view.created_at is not None:
        out.append(Event(view.created_at, "run", "run started", view.name or view.run_id))
    end = view.ended_at
    if end is None or view.status == "running":
        return out
    status = view.status or "unknown"
    stop = meta.get("stopped_by")
    if isinstance(stop, dict):
        said = stop.get("reason")
        how = "at once" if stop.get("now") else "when idle"
        detail = f"by an operator {how} (control {str(stop.get('control_id') or '?')[:8]})"
        out.append(Event(end, "run", "stop requested", detail + (f": {said}" if said else "")))
    spent = meta.get("budget_exhausted")
    if isinstance(spent, dict):
        out.append(Event(end, "run", "budget reached", str(spent.get("line") or "")))
    if meta.get("finished_at") is None and status == "interrupted":
        out.append(Event(end, "run", "run interrupted", "last recorded event; the process died"))
    else:
        out.append(Event(end, "run", f"run {status}", ""))
    return out


def events(view: RunView, control: ControlStatus | None) -> list[Event]:
    """Every recorded event of the run, oldest first (ties keep this order)."""
    found = _run_events(view)
    took: dict[str, list[str]] = {}
    for node in view.nodes:
        detail = node.detail or {}
        for control_id in detail.get("steers") or []:
            took.setdefault(str(control_id), []).append(node.id)
        start, end = detail.get("started_at"), detail.get("ended_at")
        if isinstance(start, (int, float)):
            found.append(Event(float(start), "node", "node started", node.id, node.id))
        if isinstance(end, (int, float)):
            found.append(Event(float(end), "node", f"node {node.status}", node.id, node.id))
        elif node.status == "interrupted" and view.ended_at is not None:
            found.append(Event(view.ended_at, "node", "node interrupted", node.id, node.id))
    for c in control.controls if control is not None else ():
        what = f"{c.verb} {c.id[:8]}"
        queued = f"{what}: {payload_words(c.verb, c.payload)}; by {sender_of(c.sender)}"
        found.append(Event(c.created_at, "control", f"{c.verb} queued", queued))
        if c.applied_at is not None:
            by = took.get(c.id, [])
            extra = f"; taken by {', '.join(by)}" if by else ""
            result = readable_result(c.result or "")
            found.append(
                Event(
                    c.applied_at,
                    "control",
                    f"{c.verb} applied",
                    f"{what}: {result}{extra}",
                    by[0] if len(by) == 1 else None,
                )
            )
    if view.resumed_from_run and view.created_at is not None:
        found.append(
            Event(view.created_at, "resume", "resumed from", f"run {view.resumed_from_run}")
        )
    for item in view.resumed_by:
        at = item.get("created_at")
        if isinstance(at, (int, float)):
            how = "forked" if item.get("fork") else "resumed"
            target = item.get("run_id") or item.get("session_id")
            found.append(Event(float(at), "resume", how, f"by run {target}"))
    if view.checkpoint_exists:
        # The journal's time, not the base file's: completions are appended there.
        saved = saved_at(view.checkpoint_path.parent)
        if saved is not None:
            found.append(
                Event(saved, "checkpoint", "checkpoint saved", f"v{view.checkpoint_version}")
            )
    return sorted(found, key=lambda e: e.at)


def events_table(rows: Sequence[Event], *, table_id: str = "history") -> str:
    """Events as a table (millisecond times; ``data-at`` the epoch, ``data-kind``)."""
    if not rows:
        return "<p>nothing recorded yet</p>"
    body = "".join(
        f'<tr data-at="{e.at:.3f}" data-kind="{esc(e.kind)}"'
        + (f' data-node="{esc(e.node)}"' if e.node else "")
        + f'><td class="nowrap">{esc(when_ms(e.at))}</td><td>{esc(e.kind)}</td>'
        f"<td>{esc(e.what)}</td><td>{esc(e.detail)}</td></tr>"
        for e in rows
    )
    return (
        f'<div class="wide"><table id="{esc(table_id)}"><thead><tr><th>when</th><th>kind</th>'
        f"<th>event</th><th>detail</th></tr></thead><tbody>{body}</tbody></table></div>"
    )


def events_page(
    view: RunView, control: ControlStatus | None, *, node: str | None, kind: str | None
) -> str:
    """``/runs/RUN/events``: the whole log, filtered by node and kind (a GET form)."""
    every = events(view, control)
    shown = [
        e for e in every if (kind is None or e.kind == kind) and (node is None or e.node == node)
    ]
    nodes = [n.id for n in view.nodes]
    node_opts = '<option value="">every node</option>' + "".join(
        f'<option value="{esc(n)}"{" selected" if n == node else ""}>{esc(n)}</option>'
        for n in nodes
    )
    kind_opts = '<option value="">every kind</option>' + "".join(
        f'<option value="{k}"{" selected" if k == kind else ""}>{k}</option>' for k in KINDS
    )
    base = run_href(view.run_id)
    form = (
        f'<form method="get" id="events-filter" action="{esc(base + "/events")}">'
        f'<select name="node" aria-label="node">{node_opts}</select> '
        f'<select name="kind" aria-label="kind">{kind_opts}</select> '
        "<button>Filter</button></form>"
    )
    title = view.name or view.run_id
    body = [
        f'<h2>event log of <a href="{esc(base)}">{esc(title)}</a> '
        f"<small><code>{esc(view.run_id)}</code></small></h2>",
        form,
        f'<p id="events-count">{len(shown)} of {len(every)} events</p>',
        events_table(shown, table_id="events"),
    ]
    return page(f"events · {title} · steerflow studio", "\n".join(body))


def events_href(run_id: str, *, node: str | None = None, kind: str | None = None) -> str:
    """The event log's URL, filtered."""
    query = urlencode({k: v for k, v in (("node", node), ("kind", kind)) if v})
    return run_href(run_id) + "/events" + (f"?{query}" if query else "")
