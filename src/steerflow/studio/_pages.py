"""Server-side HTML of the Studio's pages: every outside text goes through :func:`esc`.

Run ids, statuses, models, errors and notices may come from a plan, a model, a server
or an operator; none is ever written into a page unescaped, into a URL except through
:func:`urllib.parse.quote`, or into a script (the pages have none: the CSP forbids
inline script and there is no script to load yet).
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from steerflow.views import RunListing, RunProgress

__all__ = [
    "CSS",
    "STATUSES",
    "control_forms",
    "duration",
    "error_page",
    "esc",
    "page",
    "run_href",
    "runs_live",
    "runs_page",
    "when",
]

#: Session statuses a filter may name (anything else is ignored: the filter is shown off).
STATUSES = (
    "running",
    "completed",
    "failed",
    "timed_out",
    "interrupted",
    "stopped",
    "budget_exhausted",
)

CSS = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d1d1f; }
h1 { font-size: 1.3rem; margin: 0 0 .5rem; }
nav a { margin-right: .6rem; }
nav a.on { font-weight: bold; text-decoration: none; color: inherit; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid #ddd;
         vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { border-radius: .6rem; padding: 0 .5rem; background: #eee; }
.status-running { background: #d7ebff; } .status-completed { background: #d9f5dd; }
.status-failed { background: #ffd9d6; } .status-interrupted, .status-timed_out,
.status-stopped, .status-budget_exhausted { background: #fff0c2; }
.notice { padding: .5rem .8rem; background: #eef6ff; border: 1px solid #bcd; margin: .5rem 0; }
.error { padding: .5rem .8rem; background: #fff0f0; border: 1px solid #dbb; margin: .5rem 0; }
form.inline { display: inline; }
input[type=text] { width: 12rem; }
h1 a { color: inherit; text-decoration: none; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f7f7f8; padding: .6rem;
      border: 1px solid #e3e3e6; }
mark.steer { background: #fff3b0; display: block; }
.graph { overflow: auto; max-height: 70vh; border: 1px solid #e3e3e6; margin: .5rem 0; }
svg.dag text { font: 11px system-ui, sans-serif; fill: #1d1d1f; }
svg.dag rect { fill: #eee; stroke: #999; }
svg.dag .status-running rect { fill: #d7ebff; stroke: #3b82f6; }
svg.dag .status-completed rect { fill: #d9f5dd; stroke: #2e9a48; }
svg.dag .status-failed rect { fill: #ffd9d6; stroke: #d23c2f; }
svg.dag .status-paused rect { fill: #fff0c2; stroke: #b08900; }
svg.dag .status-skipped rect { fill: #f3f3f3; stroke: #bbb; }
svg.dag .kind-spawned rect { stroke-dasharray: 4 2; }
svg.dag .escalation rect { stroke-width: 2; stroke: #8b5cf6; }
svg.dag line.edge { stroke: #999; }
svg.dag line.spawn-edge { stroke-dasharray: 3 3; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .2rem 1rem; }
dl.facts dt { font-weight: bold; }
"""


def esc(value: object) -> str:
    """``value`` as HTML text or attribute content (quotes escaped too)."""
    return html.escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, *, live: str | None = None, live_kind: str = "run") -> str:
    """A whole page; ``live`` is the JSON the script polls to update it (no inline script).

    ``live_kind`` tells the script which page it updates: ``run`` or ``runs``.
    """
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title>"
        '<link rel="stylesheet" href="/static/studio.css">'
        + ('<script src="/static/studio.js" defer></script>' if live else "")
        + "</head>\n"
        + (
            f'<body data-live="{esc(live)}" data-live-kind="{esc(live_kind)}">'
            if live
            else "<body>"
        )
        + '\n<header><h1><a href="/runs">steerflow studio</a></h1></header>\n'
        + f"{body}\n</body></html>\n"
    )


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{rest:02d}s"


def _anchor(run_id: str) -> str:
    return "#run-" + quote(run_id, safe="")


def run_href(target: str) -> str:
    """The Run page of a run id (or, before it has one, a session id)."""
    return "/runs/" + quote(target, safe="")


def _links(run: RunListing) -> str:
    parts = []
    source = run.resumed_from_run
    if source:
        parts.append(f'resumed from <a href="{esc(_anchor(source))}">{esc(source)}</a>')
    elif run.resumed_from:
        parts.append(f"resumed from session {esc(run.resumed_from)}")
    by = []
    for item in run.resumed_by:
        target = item.get("run_id")
        label = esc(target or item.get("session_id")) + (" (fork)" if item.get("fork") else "")
        by.append(f'<a href="{esc(_anchor(str(target)))}">{label}</a>' if target else label)
    if by:
        parts.append("resumed by " + ", ".join(by))
    return "; ".join(parts) or "-"


def control_forms(session_id: str, csrf: str, *, back: str = "/runs") -> str:
    """Pause, Resume, Message, Stop and Budget forms for a running session (POST, CSRF)."""
    action = esc("/sessions/" + quote(session_id, safe="") + "/control")
    hidden = (
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="back" value="{esc(back)}">'
    )

    def button(verb: str, label: str, extra: str = "") -> str:
        return (
            f'<form class="inline" method="post" action="{action}">{hidden}'
            f'<input type="hidden" name="verb" value="{verb}">{extra}'
            f"<button>{label}</button></form>"
        )

    text = '<input type="text" name="text" maxlength="65536" placeholder="message" required>'
    usd = '<input type="text" name="max_cost" maxlength="32" placeholder="max cost USD" required>'
    return " ".join(
        [
            button("pause", "Pause"),
            button("resume", "Resume"),
            button("message", "Send", text),
            button("stop", "Stop"),
            button("budget", "Set cap", usd),
        ]
    )


def _row(run: RunListing, progress: RunProgress | None, csrf: str) -> str:
    run_id = run.run_id or ""
    done = f"{progress.done}/{progress.total}" if progress is not None else "-"
    model = progress.model if progress is not None else None
    status_class = run.status if run.status in STATUSES else "unknown"
    return (
        f'<tr id="{esc("run-" + run_id)}" data-run="{esc(run.session_id)}" '
        f'data-status="{esc(run.status)}">'
        f'<td><a href="{esc(run_href(run_id or run.session_id))}">{esc(run_id or "-")}</a>'
        f"<br><small>{esc(run.kind)} {esc(run.session_id)}</small></td>"
        f'<td><span class="status status-{status_class}">{esc(run.status)}</span></td>'
        f'<td data-field="phase">{esc(run.phase or "-")}</td>'
        f'<td class="num" data-field="progress">{esc(done)}</td>'
        f"<td>{esc(model or '-')}</td>"
        f"<td>{esc(when(run.created_at))}</td>"
        f'<td class="num" data-field="duration">{esc(duration(run.duration_s))}</td>'
        f"<td>{_links(run)}</td>"
        f"<td>{control_forms(run.session_id, csrf) if run.status == 'running' else '-'}</td></tr>"
    )


def runs_live(runs: Iterable[RunListing], progress: Mapping[str, RunProgress]) -> dict[str, Any]:
    """What the Runs page polls: each row's status and the texts the script updates."""
    out = []
    for run in runs:
        done = progress.get(run.session_id)
        out.append(
            {
                "session_id": run.session_id,
                "run_id": run.run_id,
                "status": run.status,
                "phase": run.phase or "-",
                "progress": f"{done.done}/{done.total}" if done is not None else "-",
                "duration": duration(run.duration_s),
            }
        )
    return {"runs": out}


def runs_page(
    runs: Iterable[RunListing],
    progress: Mapping[str, RunProgress],
    *,
    status: str | None,
    csrf: str,
    notice: str | None = None,
) -> str:
    """The Runs page: newest first, filtered by ``status`` when given."""
    filters = ['<a href="/runs"' + ("" if status else ' class="on"') + ">all</a>"]
    for name in STATUSES:
        href = esc("/runs?" + urlencode({"status": name}))
        on = ' class="on"' if name == status else ""
        filters.append(f'<a href="{href}"{on}>{esc(name)}</a>')
    rows = [_row(r, progress.get(r.session_id), csrf) for r in runs]
    body = [f"<nav>status: {' '.join(filters)}</nav>"]
    if notice:
        body.append(f'<p class="notice">{esc(notice)}</p>')
    if rows:
        body.append(
            '<table class="runs"><thead><tr><th>run</th><th>status</th><th>phase</th>'
            "<th>progress</th><th>model</th><th>started</th><th>duration</th>"
            "<th>resumes</th><th>controls</th></tr></thead>\n<tbody>\n"
            + "\n".join(rows)
            + "\n</tbody></table>"
        )
    else:
        body.append("<p>no runs" + (f" with status {esc(status)}" if status else "") + "</p>")
    live = "/api/runs" + (f"?{urlencode({'status': status})}" if status else "")
    return page("steerflow studio: runs", "\n".join(body), live=live, live_kind="runs")


def error_page(title: str, message: str) -> str:
    """A refusal or error, escaped, with a way back."""
    return page(
        f"steerflow studio: {title}",
        f'<p class="error"><strong>{esc(title)}</strong>: {esc(message)}</p>'
        '<p><a href="/runs">back to runs</a></p>',
    )
