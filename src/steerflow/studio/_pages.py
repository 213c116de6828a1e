"""Server-side HTML of the Studio's pages: every outside text goes through :func:`esc`.

Run ids, statuses, models, errors and notices may come from a plan, a model, a server
or an operator; none is ever written into a page unescaped, into a URL except through
:func:`urllib.parse.quote`, or into a script (the pages have none: the CSP forbids
inline script and there is no script to load yet).
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from steerflow._usage import cost_text
from steerflow.studio._assets import STYLESHEET_HREF
from steerflow.views import RunListing, RunProgress

__all__ = [
    "PAGE_SIZE",
    "STATUSES",
    "RunsQuery",
    "control_forms",
    "duration",
    "error_page",
    "esc",
    "page",
    "row_controls",
    "run_href",
    "runs_live",
    "runs_page",
    "server_timing",
    "visible",
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


#: Bidirectional embedding, override and isolate controls: shown as they are they reorder
#: the text around them (a reason that reads as something else), so each is named.
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def visible(text: str) -> str:
    """``text`` with each bidi control written as ``<U+XXXX>`` (before escaping)."""
    return _BIDI.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)


def esc(value: object) -> str:
    """``value`` as HTML text or attribute content (quotes escaped, bidi controls named)."""
    return html.escape(visible("" if value is None else str(value)), quote=True)


def page(
    title: str,
    body: str,
    *,
    live: str | None = None,
    live_kind: str = "run",
    data: Mapping[str, str] | None = None,
    section: str = "runs",
) -> str:
    """A whole page; ``live`` is the JSON the script polls to update it (no inline script).

    ``live_kind`` tells the script which page it updates: ``run``, ``runs`` or ``node``;
    ``data`` are more ``data-*`` attributes of the body the script reads; ``section``
    is the navigation entry the page belongs to (``runs`` or ``approvals``).
    """
    nav = "".join(
        f'<a href="/{key}"'
        + (' class="on" aria-current="page"' if key == section else "")
        + f">{label}</a>"
        for key, label in (("runs", "Runs"), ("approvals", "Approvals"))
    )
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in (data or {}).items())
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        f'<link rel="stylesheet" href="{esc(STYLESHEET_HREF)}">'
        + ('<script src="/static/studio.js" defer></script>' if live else "")
        + "</head>\n"
        + (
            f'<body data-live="{esc(live)}" data-live-kind="{esc(live_kind)}"{attrs}>'
            if live
            else "<body>"
        )
        # The brand is text, not a link: "Runs" is the way home, and a click on the
        # heading (to leave a field) must not navigate.
        + '\n<header class="topbar"><h1><span class="mark"></span>steerflow studio</h1>'
        + f'<nav class="main-nav" aria-label="Studio">{nav}</nav></header>\n'
        + f"<main>{body}\n</main></body></html>\n"
    )


def server_timing(began: float) -> str:
    """A ``Server-Timing`` header value: the milliseconds since ``began`` (perf_counter)."""
    return f"render;dur={(time.perf_counter() - began) * 1000:.1f}"


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


def control_forms(
    session_id: str,
    csrf: str,
    *,
    back: str = "/runs",
    target: str | None = None,
    only: Sequence[str] | None = None,
) -> str:
    """Pause, Resume and Message forms (POST, with CSRF); Stop and Set cap confirm first.

    Stop and Set cap are GETs to the run's stop and budget pages (``target``: its run id,
    else the session id): they say what is in flight, or what the new cap is against what
    was spent, before anything is sent.
    """
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
    stop = (
        f'<form class="inline" method="get" action="{esc(run_href(target or session_id))}/stop">'
        '<input type="text" name="reason" maxlength="500" placeholder="reason (optional)">'
        '<label><input type="checkbox" name="now" value="1"> now</label>'
        "<button>Stop…</button></form>"
    )
    # Set cap confirms first, as Stop does: the new cap against what the chain has spent.
    budget = (
        f'<form class="inline" method="get" action="{esc(run_href(target or session_id))}/budget">'
        '<input type="text" name="max_cost" maxlength="32" placeholder="max cost USD">'
        '<input type="text" name="max_tokens" maxlength="20" placeholder="max tokens">'
        "<button>Set cap…</button></form>"
    )
    forms = {
        "pause": button("pause", "Pause"),
        "resume": button("resume", "Resume"),
        "message": button("message", "Send", text),
        "stop": stop,
        "budget": budget,
    }
    return " ".join(v for k, v in forms.items() if only is None or k in only)


def row_controls(session_id: str, csrf: str, *, target: str | None = None) -> str:
    """The Runs list's controls: Pause and Resume, Stop…, the rest folded under "more".

    The full row of forms made the table 1,733 px wide (issue 42): Pause, Resume and Stop
    stay in view at 1280 px; Send and Set cap open from a ``<details>`` (no script).
    """
    action = esc("/sessions/" + quote(session_id, safe="") + "/control")
    hidden = f'<input type="hidden" name="csrf" value="{esc(csrf)}">'

    def button(verb: str, label: str) -> str:
        return (
            f'<form class="inline" method="post" action="{action}">{hidden}'
            f'<input type="hidden" name="verb" value="{verb}"><button>{label}</button></form>'
        )

    stop = f'<a class="action" href="{esc(run_href(target or session_id) + "/stop")}">Stop…</a>'
    more = control_forms(session_id, csrf, target=target, only=("message", "budget"))
    return (
        '<div class="row-controls">'
        f"{button('pause', 'Pause')} {button('resume', 'Resume')} {stop}"
        f'<details class="more"><summary>more</summary>{more}</details></div>'
    )


def _counts(progress: RunProgress | None, status: str = "running") -> str:
    """Settled of all published nodes, with the failed and running ones named.

    A node still published ``running`` in a run that is not running any more was in
    flight when the run died: it reads ``interrupted``, as on the run page (decision 200).
    """
    if progress is None:
        return "-"
    text = f"{progress.done}/{progress.total}"
    in_flight = "running" if status == "running" else "interrupted"
    extra = [f"{progress.by_status[k]} {in_flight if k == 'running' else k}"
             for k in ("running", "failed") if progress.by_status.get(k)]  # fmt: skip
    return text + (f" ({', '.join(extra)})" if extra else "")


def _row(run: RunListing, progress: RunProgress | None, csrf: str) -> str:
    run_id = run.run_id or ""
    done = _counts(progress, run.status)
    model = progress.model if progress is not None else None
    status_class = run.status if run.status in STATUSES else "unknown"
    running = run.status == "running"
    forms = row_controls(run.session_id, csrf, target=run.run_id) if running else "-"
    return (
        f'<tr id="{esc("run-" + run_id)}" data-run="{esc(run.session_id)}" '
        f'data-status="{esc(run.status)}">'
        f'<td><a href="{esc(run_href(run_id or run.session_id))}">{esc(run.name or run_id or "-")}'
        f'</a><br><small><span class="nowrap">{esc(run_id or "-")}</span> {esc(run.kind)} '
        f"{esc(run.session_id)}</small></td>"
        f'<td><span class="status status-{status_class}">{esc(run.status)}</span></td>'
        f'<td data-field="phase">{esc(_phase(run))}</td>'
        f'<td class="num" data-field="progress">{esc(done)}</td>'
        f'<td class="model">{esc(model or "-")}</td>'
        f'<td class="nowrap">{esc(when(run.created_at))}</td>'
        f'<td class="num" data-field="duration">{esc(duration(run.duration_s))}</td>'
        f'<td class="num nowrap">{esc(spend(run.usage))}</td>'
        f'<td class="links">{_links(run)}</td>'
        f"<td>{forms}</td></tr>"
    )


def spend(usage: Mapping[str, Any] | None) -> str:
    """Tokens and cost of a finished run (``-`` while it runs or when nothing was reported)."""
    if not usage:
        return "-"
    tokens = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0)
    cost = usage.get("cost_usd")
    if not tokens and cost is None:
        return "-"
    text = cost_text(usage)  # a partial total says so (decision 249)
    return f"{tokens:,} tok" + ("" if text is None else f" {text}")


def _phase(run: RunListing) -> str:
    """A phase is where a running flow is: a settled run has none left to show."""
    return (run.phase or "-") if run.status == "running" else "-"


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
                "phase": _phase(run),
                "progress": _counts(done, run.status),
                "duration": duration(run.duration_s),
            }
        )
    return {"runs": out}


#: Runs one page of the list shows.
PAGE_SIZE = 50


@dataclass(frozen=True)
class RunsQuery:
    """What the Runs page lists: a status, a text, a time range, a sort, and which page."""

    status: str | None = None
    text: str = ""
    page: int = 0
    #: ``1h``, ``24h``, ``7d``, ``30d`` (``_runs_list.SINCE``), or empty: any time.
    since: str = ""
    #: ``newest`` (empty: the default), ``oldest``, ``duration``, ``spend``.
    sort: str = ""

    def params(self, **change: object) -> str:
        """This query (with ``change``) as a URL query string, empty members left out."""
        values: dict[str, object] = {
            "status": self.status,
            "q": self.text,
            "since": self.since,
            "sort": self.sort,
            "page": self.page,
        }
        values.update({("q" if k == "text" else k): v for k, v in change.items()})
        return urlencode({k: v for k, v in values.items() if v})


#: The time ranges and sorts the Runs page offers (``_runs_list`` holds their meaning).
_SINCE_LABELS = (("", "any time"), ("1h", "last hour"), ("24h", "last 24 h"),
                 ("7d", "last 7 days"), ("30d", "last 30 days"))  # fmt: skip
_SORT_LABELS = (("", "newest first"), ("oldest", "oldest first"),
                ("duration", "longest first"), ("spend", "most spent first"))  # fmt: skip


def _select(name: str, chosen: str, options: Sequence[tuple[str, str]]) -> str:
    items = "".join(
        f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(label)}</option>'
        for v, label in options
    )
    return f'<select name="{name}" aria-label="{name}">{items}</select>'


def _filters(query: RunsQuery) -> str:
    links = ['<a href="/runs"' + ("" if query.status else ' class="on"') + ">all</a>"]
    for name in STATUSES:
        href = esc("/runs?" + RunsQuery(name, query.text, 0, query.since, query.sort).params())
        on = ' class="on"' if name == query.status else ""
        links.append(f'<a href="{href}"{on}>{esc(name)}</a>')
    kept = (
        f'<input type="hidden" name="status" value="{esc(query.status)}">' if query.status else ""
    )
    # One GET form: the text, the time range and the sort go together (no script needed).
    find = (
        f'<form class="inline" id="runs-find" method="get" action="/runs">{kept}'
        f'<input type="search" name="q" value="{esc(query.text)}" maxlength="200" '
        'placeholder="name or run id"> '
        + _select("since", query.since, _SINCE_LABELS)
        + " "
        + _select("sort", query.sort, _SORT_LABELS)
        + " <button>Find</button></form>"
    )
    return f'<nav class="filters">status: {" ".join(links)}<br>{find}</nav>'


def _pager(query: RunsQuery, shown: int, more: bool) -> str:
    parts = []
    if query.page:
        parts.append(f'<a rel="prev" href="{esc("/runs?" + query.params(page=query.page - 1))}">'
                     "newer</a>")  # fmt: skip
    first = query.page * PAGE_SIZE + (1 if shown else 0)
    parts.append(f"runs {first}-{query.page * PAGE_SIZE + shown}")
    if more:
        parts.append(f'<a rel="next" href="{esc("/runs?" + query.params(page=query.page + 1))}">'
                     "older</a>")  # fmt: skip
    return '<nav class="pager">' + " · ".join(parts) + "</nav>"


def runs_page(
    runs: Sequence[RunListing],
    progress: Mapping[str, RunProgress],
    *,
    query: RunsQuery,
    csrf: str,
    more: bool = False,
    notice: str | None = None,
) -> str:
    """The Runs page: newest first, filtered by status and text, one page of them."""
    rows = [_row(r, progress.get(r.session_id), csrf) for r in runs]
    body = [_filters(query)]
    if notice:
        body.append(f'<p class="notice">{esc(notice)}</p>')
    if rows:
        body.append(
            '<div class="wide"><table class="runs"><thead><tr><th>run</th><th>status</th>'
            "<th>phase</th><th>nodes</th><th>model</th><th>started</th><th>duration</th>"
            "<th>spent</th><th>resumes</th><th>controls</th></tr></thead>\n<tbody>\n"
            + "\n".join(rows)
            + "\n</tbody></table></div>"
        )
    else:
        what = f" with status {esc(query.status)}" if query.status else ""
        body.append(
            f"<p>no runs{what}" + (f" matching {esc(query.text)}" if query.text else "") + "</p>"
        )
    body.append(_pager(query, len(rows), more))
    live = "/api/runs" + (f"?{query.params()}" if query.params() else "")
    return page("steerflow studio: runs", "\n".join(body), live=live, live_kind="runs")


def in_flight_table(calls: Sequence[Mapping[str, Any]], line: str | None) -> list[str]:
    """A resume preflight's calls that may have been paid (decision 217), as a table."""
    if not calls:
        return []

    def reserved(cost: object) -> str:
        return f"${cost:.4f}" if isinstance(cost, (int, float)) else "not known"

    rows = [
        "<tr>"
        f"<td>{esc(c['node'])}</td><td>{esc(c['attempt'])}</td><td>{esc(c['model'] or '-')}</td>"
        f"<td>{esc(when(c['started_at']))}</td><td>{esc(reserved(c['reserved_cost_usd']))}</td>"
        "</tr>"
        for c in calls
    ]
    return [
        f'<p class="error" id="in-flight-line">{esc(line or "")}</p>',
        '<table id="in-flight-calls"><tr><th>node</th><th>attempt</th><th>model</th>'
        "<th>started</th><th>reserved</th></tr>",
        *rows,
        "</table>",
    ]


def error_page(title: str, message: str) -> str:
    """A refusal or error, escaped, with a way back."""
    return page(
        f"steerflow studio: {title}",
        f'<p class="error"><strong>{esc(title)}</strong>: {esc(message)}</p>'
        '<p><a href="/runs">back to runs</a></p>',
    )
