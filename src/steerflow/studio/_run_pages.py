"""The Run page (graph, nodes, control log, recovery) and the Node page, rendered escaped."""

from __future__ import annotations

import html
import time
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlencode

from steerflow.executor import STEER_CLOSE, STEER_OPEN
from steerflow.orchestrate._detail import response_text
from steerflow.studio._events import events, events_href, events_table
from steerflow.studio._node_live import (
    STREAMING,
    KeptOutput,
    kept_section,
    lines_section,
    live_section,
)
from steerflow.studio._pages import (
    control_forms,
    duration,
    esc,
    in_flight_table,
    page,
    run_href,
    when,
)
from steerflow.studio._run_header import failures, header, recovered_failures, title
from steerflow.studio._steps import steps_section
from steerflow.studio._svg import graph_svg
from steerflow.studio._timeline import timeline_svg
from steerflow.studio._words import payload_words, readable_result, sender_of
from steerflow.views import (
    CheckpointReport,
    ControlStatus,
    NodeDetail,
    NodeState,
    ResumePreflight,
    RunGraph,
    RunView,
)

__all__ = [
    "RECOVERABLE",
    "history",
    "history_table",
    "node_page",
    "payload_words",
    "readable_result",
    "run_page",
    "sender_of",
    "steer_marked",
]

#: Rows a table or the timeline shows before the rest folds (issue 42 item 3).
ROWS = 50

#: Run statuses the Recovery section is shown for.
RECOVERABLE = ("interrupted", "failed", "timed_out", "stopped", "budget_exhausted")


def _phase(view: RunView) -> str:
    return (view.phase or "-") if view.status == "running" else "-"


def _facts(rows: list[tuple[str, str]]) -> str:
    """A ``<dl>``; values are HTML already escaped by the caller."""
    return (
        '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"
    )


def _node_href(run: str, node: str) -> str:
    return run_href(run) + "/nodes/" + quote(node, safe="")


def _resume_links(view: RunView) -> str:
    parts = []
    if view.resumed_from_run:
        parts.append(
            f'resumed from <a href="{esc(run_href(view.resumed_from_run))}">'
            f"{esc(view.resumed_from_run)}</a>"
        )
    for item in view.resumed_by:
        target = item.get("run_id") or item.get("session_id")
        label = esc(target) + (" (fork)" if item.get("fork") else "")
        parts.append(f'resumed by <a href="{esc(run_href(str(target)))}">{label}</a>')
    # The script reloads the page when the count changes: the new link is rendered here.
    return (
        f'<span id="run-resumes" data-count="{len(view.resumed_by)}">'
        + ("; ".join(parts) or "-")
        + "</span>"
    )


def _node_row(view: RunView, node: NodeState) -> str:
    status = node.status if node.status else "unknown"
    return (
        f'<tr data-node="{esc(node.id)}">'
        f'<td><a href="{esc(_node_href(view.run_id, node.id))}">{esc(node.id)}</a></td>'
        f"<td>{esc(node.kind)}</td>"
        f'<td data-node-status="{esc(node.id)}">{esc(status)}</td>'
        f'<td data-node-model="{esc(node.id)}">{esc(node.model or "-")}</td>'
        f'<td class="num" data-node-duration="{esc(node.id)}">'
        f"{esc(duration(node.duration_s))}</td>"
        f"<td>{esc(node.assignee or '-')}</td>"
        f'<td class="num">{len(node.artifacts) or "-"}</td></tr>'
    )


_NODES_HEAD = (
    "<table><thead><tr><th>node</th><th>kind</th><th>status</th>"
    "<th>model</th><th>duration</th><th>assignee</th><th>artifacts</th></tr></thead><tbody>"
)


def _nodes_table(view: RunView) -> str:
    """The nodes; past :data:`ROWS` the rest fold under a ``<details>`` (no script needed).

    Failed and interrupted nodes come into the first part whatever their place: they are
    what an operator opens a long run's page for.
    """
    urgent = [n for n in view.nodes if n.status in ("failed", "interrupted", "running")]
    others = [n for n in view.nodes if n.status not in ("failed", "interrupted", "running")]
    ordered = urgent + others if len(view.nodes) > ROWS else list(view.nodes)
    head, tail = ordered[:ROWS], ordered[ROWS:]
    out = (
        '<div class="wide">'
        + _NODES_HEAD
        + "".join(_node_row(view, n) for n in head)
        + "</tbody></table></div>"
    )
    if tail:
        out += (
            f'<details id="nodes-more"><summary>{len(tail)} more nodes</summary>'
            f'<div class="wide">{_NODES_HEAD}'
            + "".join(_node_row(view, n) for n in tail)
            + "</tbody></table></div></details>"
        )
    return out


def graph_tools(run_id: str, zoom: str, find: str | None) -> str:
    """Zoom links (fit, 50 %, 100 %, 200 %) and a find-a-node form: GETs, no script."""
    base = run_href(run_id)
    links = []
    for value, label in (("fit", "fit"), ("50", "50 %"), ("100", "100 %"), ("200", "200 %")):
        query = urlencode({"zoom": value, **({"found": find} if find else {})})
        on = ' class="on"' if value == zoom else ""
        links.append(f'<a{on} data-zoom="{value}" href="{esc(base + "?" + query)}">{label}</a>')
    return (
        f'<nav class="graph-tools" id="graph-tools">zoom: {" ".join(links)} '
        f'<form class="inline" method="get" action="{esc(base)}" id="find-node">'
        f'<input type="hidden" name="zoom" value="{esc(zoom)}">'
        f'<input type="search" name="find" value="{esc(find or "")}" maxlength="200" '
        'placeholder="node id" aria-label="find a node"> <button>Find</button></form></nav>'
    )


def _control_log(status: ControlStatus | None) -> str:
    # The count lets the script reload once a control is sent from anywhere (ctl, MCP).
    count = len(status.controls) if status is not None else 0
    head = f'<div id="control-log" data-count="{count}">'
    if status is None or not status.controls:
        return head + "<p>no controls sent</p></div>"
    rows = [
        f"<tr><td><code>{esc(c.id)}</code></td><td>{esc(c.verb)}</td>"
        f"<td>{esc(payload_words(c.verb, c.payload))}</td>"
        f'<td class="sender">{esc(sender_of(c.sender))}</td><td>{esc(when(c.created_at))}</td>'
        f"<td>{esc(when(c.applied_at))}</td>" + _result(c.result)
        for c in status.controls
    ]
    return (
        head + "<table><thead><tr><th>control</th><th>verb</th><th>details</th><th>by</th>"
        "<th>sent</th><th>applied</th><th>result</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def _errors(view: RunView, graph: RunGraph) -> str:
    """The failed nodes and their errors, first thing under the facts (not a click away).

    A failed attempt that an escalation retry replaced, and whose chain completed, is not
    the run's failure: it is listed as recovered, not in the red box.
    """
    recovered = recovered_failures(graph)
    counted = set(failures(view, graph))
    failed = [n for n in view.nodes if n.id in counted]
    out = ""
    if failed:
        items = "".join(
            f'<li><a href="{esc(_node_href(view.run_id, n.id))}">{esc(n.id)}</a>: '
            f"<code>{esc((n.detail or {}).get('error') or 'no error recorded')}</code></li>"
            for n in failed
        )
        out += (
            f'<section id="failures" class="error"><h3>failed nodes</h3><ul>{items}</ul></section>'
        )
    if recovered:
        items = "".join(
            f'<li><a href="{esc(_node_href(view.run_id, k))}">{esc(k)}</a> failed; '
            f'<a href="{esc(_node_href(view.run_id, v))}">{esc(v)}</a> completed it</li>'
            for k, v in recovered.items()
        )
        out += (
            f'<section id="recovered" class="notice"><h3>recovered by escalation</h3>'
            f"<ul>{items}</ul></section>"
        )
    return out


def with_view_statuses(graph: RunGraph, view: RunView) -> RunGraph:
    """The graph with the view's node statuses: one word per node across the page.

    The graph reads the published rows as they are; the view names a node that was in
    flight when its run died ``interrupted`` (decision 200). The page draws the view's.
    """
    shown = {n.id: n.status for n in view.nodes}
    nodes = tuple(
        replace(n, status=shown[n.id]) if shown.get(n.id, n.status) != n.status else n
        for n in graph.nodes
    )
    return replace(graph, nodes=nodes)


def history(view: RunView, control: ControlStatus | None) -> list[tuple[float, str, str]]:
    """``(when, what, detail)`` of the run's events, in time order (see ``_events``)."""
    return [(e.at, e.what, e.detail) for e in events(view, control)]


def history_table(view: RunView, control: ControlStatus | None, *, last: int | None = None) -> str:
    """The run's event log as a table (its ``last`` events), and a link to the whole log."""
    every = events(view, control)
    shown = every if last is None else every[-last:]
    more = f"all {len(every)} events" if len(shown) < len(every) else "the event log"
    link = (
        f'<p><a id="events-link" href="{esc(events_href(view.run_id))}">'
        f"{more}, by node and kind</a></p>"
    )
    return events_table(shown) + link


def _result(result: str | None) -> str:
    if result:
        return f"<td>{esc(readable_result(result))}</td></tr>"
    # The script reloads the page once the flow stamps a pending row (a changed answer).
    return "<td data-control-pending>pending</td></tr>"


def _stranded(messages: tuple[dict[str, Any], ...]) -> list[str]:
    """The operator messages a dead process left behind: text, when sent, who took them."""
    if not messages:
        return []
    rows = [
        "<tr>"
        f"<td><code>{esc(m['control_id'])}</code></td><td>{esc(m['state'])}</td>"
        f"<td>{esc(m['text'])}</td><td>{esc(_when(m['sent_at']))}</td>"
        f"<td>{esc(m.get('claimed_by') or '-')}</td>"
        "</tr>"
        for m in messages
    ]
    return [
        "<h4>operator messages left behind</h4>",
        '<table id="stranded-messages"><tr><th>control</th><th>state</th><th>text</th>'
        "<th>sent</th><th>claimed by</th></tr>",
        *rows,
        "</table>",
        "<p>pending ones are re-queued into the resumed run; claimed ones only with "
        "<code>steerflow resume --redeliver-claimed</code> (a possible duplicate), except "
        "one an agent's turn in flight took: the resume runs that turn with it.</p>",
    ]


def _when(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def _recovery(
    view: RunView,
    report: CheckpointReport,
    preflight: ResumePreflight,
    *,
    verdicts: dict[str, ResumePreflight],
) -> str:
    run_id = view.run_id
    rec = report.report or {}
    lines = [
        "<h3>checkpoint</h3>",
        _facts(
            [
                ("status", esc(report.status)),
                ("version", esc(report.version if report.version is not None else "-")),
                ("records applied", esc(rec.get("records_applied", "-"))),
                ("torn tail bytes", esc(rec.get("discarded_tail_bytes", "-"))),
                ("refusal", esc(report.error or "-")),
            ]
        ),
        "<h3>resume preflight (<code>steerflow resume --dry-run</code>)</h3>",
    ]
    if preflight.refusal is not None:
        lines.append(
            f'<p class="error" id="preflight-refusal"><strong>refused: '
            f"{esc(preflight.refusal.code)}</strong> (exit {preflight.refusal.exit_code}): "
            f"{esc(preflight.refusal.message)}</p>"
        )
    else:
        replayed, to_run = preflight.replayed, preflight.to_run
        lines.append(
            '<p id="preflight-verdict">would replay '
            f"{len(replayed)}: {esc(', '.join(replayed) or '-')}; would run {len(to_run)}: "
            f"{esc(', '.join(to_run) or '-')}</p>"
        )
    if preflight.degraded_context:
        lines.append(f"<p>degraded context: {esc(', '.join(preflight.degraded_context))}</p>")
    lines += [f'<p class="notice">{esc(w)}</p>' for w in preflight.warnings]
    lines += _stranded(preflight.stranded_messages)
    lines += in_flight_table(preflight.in_flight_calls, preflight.in_flight_line)
    lines.append(_actions(run_id, verdicts or {"resume": preflight}))
    if view.status == "budget_exhausted" and (verdicts or {}).get("resume", preflight).allowed:
        lines.append(_raise_cap_form(view))
    return "\n".join(lines)


#: The run page's recovery modes, in the order they are offered.
_MODES = (
    ("resume", "Resume"),
    ("retry_failed", "Retry failed"),
    ("fork", "Fork"),
    ("rerun_unsettled", "Rerun unsettled"),
)


def _actions(run_id: str, verdicts: dict[str, ResumePreflight]) -> str:
    """The recovery modes: a link to each one's confirmation that its dry run accepts.

    The others are shown disabled, with the dry run's reason: never an action the
    resume would refuse.
    """
    items = []
    for mode, label in _MODES:
        verdict = verdicts.get(mode)
        if verdict is None:
            continue
        if verdict.refusal is None:
            href = esc(run_href(run_id) + "/resume?mode=" + mode)
            items.append(f'<a class="action" data-mode="{mode}" href="{href}">{label}…</a>')
        else:
            why = f"{verdict.refusal.code}: {verdict.refusal.message}"
            items.append(
                f'<span class="action disabled" data-mode="{mode}" aria-disabled="true" '
                f'title="{esc(why)}">{label}…</span> <small class="refused">(refused: '
                f"{esc(verdict.refusal.code)})</small>"
            )
    return f'<p id="recovery-actions">{" · ".join(items)}</p>'


def _raise_cap_form(view: RunView) -> str:
    """Raise the cap and resume: the cap reached is shown, a higher one goes with the resume.

    A GET to the resume confirmation (its dry run first); only that page's POST starts
    ``steerflow resume RUN --max-cost USD --max-tokens N``.
    """
    caps = view.budget or {}
    now = (
        ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in caps.items() if v is not None)
        or "none recorded"
    )
    return (
        '<h3>raise the cap and resume</h3><form method="get" id="raise-cap" '
        f'action="{esc(run_href(view.run_id) + "/resume")}">'
        '<input type="hidden" name="mode" value="resume">'
        f"<p>the cap in force: {esc(now)}; a resume with the same cap is exhausted at once.</p>"
        '<label>max cost USD <input type="text" name="max_cost" maxlength="32"></label> '
        '<label>max tokens <input type="text" name="max_tokens" maxlength="20"></label> '
        "<button>Resume with this cap…</button></form>"
    )


def _graph_and_timeline(
    view: RunView, graph: RunGraph, nodes_base: str, *, zoom: str | None, find: str | None
) -> str:
    """The DAG (zoom, find) and the timeline, its rows past the first 50 folded."""
    zoom = zoom or ("fit" if len(graph.nodes) > ROWS else "100")
    parts = [
        "<h3>graph</h3>",
        graph_tools(view.run_id, zoom, find),
        '<div class="graph">',
        graph_svg(graph, base=nodes_base, zoom=zoom, found=find),
        '</div><h3>timeline</h3><div class="wide">',
        timeline_svg(view, base=nodes_base, count=ROWS),
        "</div>",
    ]
    rest = len(view.nodes) - ROWS
    if rest > 0:  # the rest folded: a 300-node run must not make the page 34,545 px tall
        parts.append(
            f'<details id="timeline-more"><summary>{rest} more rows of the timeline</summary>'
            f'<div class="wide">{timeline_svg(view, base=nodes_base, first=ROWS)}</div></details>'
        )
    return "\n".join(parts)


def run_page(
    view: RunView,
    graph: RunGraph,
    control: ControlStatus | None,
    recovery: tuple[CheckpointReport, ResumePreflight] | None,
    *,
    csrf: str,
    notice: str | None = None,
    result: str | None = None,
    verdicts: dict[str, ResumePreflight] | None = None,
    zoom: str | None = None,
    find: str | None = None,
) -> str:
    """One run: header (with controls while it runs), the DAG, nodes, logs, recovery."""
    summary = view.summary
    graph = with_view_statuses(graph, view)
    controls = ""
    if view.status == "running" and view.session_id:
        back = run_href(view.run_id)
        controls = control_forms(view.session_id, csrf, back=back, target=view.run_id)
    body = [header(view, graph, result, controls=controls)]
    if notice:
        body.append(f'<p class="notice" id="page-notice">{esc(notice)}</p>')
    body.append(
        _facts(
            [
                # A phase is where a running flow is: a settled run has none left.
                ("phase", f'<span id="run-phase">{esc(_phase(view))}</span>'),
                ("kind", esc(view.kind or "-")),
                ("session", f"<code>{esc(view.session_id or '-')}</code>"),
                (
                    "progress",
                    f'<span id="run-progress">{esc(summary.get("completed"))} completed, '
                    f"{esc(summary.get('failed'))} failed, {esc(summary.get('running'))} "
                    f"running of {esc(summary.get('total'))}</span>",
                ),
                ("resumes", _resume_links(view)),
                (
                    "checkpoint",
                    esc(f"v{view.checkpoint_version}" if view.checkpoint_exists else "none"),
                ),
            ]
        )
    )
    waiting = control.approvals_waiting if control is not None else 0
    if waiting:  # issue 41: a node waits for an operator's decision
        body.append(
            f'<p class="notice">{waiting} approval '
            f"{'requests wait' if waiting != 1 else 'request waits'} for a decision: "
            '<a href="/approvals">approvals</a></p>'
        )
    nodes_base = run_href(view.run_id) + "/nodes/"
    body.append(_errors(view, graph))
    body.append(_graph_and_timeline(view, graph, nodes_base, zoom=zoom, find=find))
    body.append("<h3>nodes</h3>")
    body.append(_nodes_table(view))
    if view.status == "running":  # each running node's last line (issue 31)
        body.append(lines_section(f"/api/runs/{quote(view.run_id, safe='')}/last-lines", esc))
    body.append("<h3>control log</h3>")
    body.append(_control_log(control))
    body.append("<h3>history</h3>")
    body.append(history_table(view, control, last=ROWS))
    if recovery is not None:
        body.append('<section id="recovery"><h2>recovery</h2>')
        body.append(_recovery(view, *recovery, verdicts=verdicts or {}))
        body.append("</section>")
    live = "/api/runs/" + quote(view.run_id, safe="")
    return page(title(view), "\n".join(body), live=live)


def steer_marked(instruction: str) -> str:
    """The instruction escaped, each operator steer block inside ``<mark class="steer">``."""
    out: list[str] = []
    rest = instruction
    while True:
        start = rest.find(STEER_OPEN)
        end = rest.find(STEER_CLOSE, start + len(STEER_OPEN)) if start >= 0 else -1
        if start < 0 or end < 0:
            out.append(esc(rest))
            return "".join(out)
        stop = end + len(STEER_CLOSE)
        out.append(esc(rest[:start]))
        out.append(f'<mark class="steer">{esc(rest[start:stop])}</mark>')
        rest = rest[stop:]


def _artifacts(items: tuple[object, ...], base: str) -> str:
    if not items:
        return "<p>none recorded</p>"
    rows = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            href = esc(base + quote(item["path"], safe="/"))
            rows.append(
                f'<tr><td><a href="{href}">{esc(item["path"])}</a></td><td class="num">'
                f"{esc(item.get('bytes', '?'))}</td><td><code>{esc(item.get('digest') or '-')}"
                "</code></td></tr>"
            )
        else:
            rows.append(f"<tr><td>{esc(item)}</td><td>?</td><td>-</td></tr>")
    return (
        "<table><thead><tr><th>path</th><th>bytes</th><th>digest</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _usage(usage: dict[str, object] | None) -> str:
    """Tokens and cost; ``not reported`` when no call reported any (never "0 in / 0 out")."""
    if not usage or all(
        usage.get(k) is None for k in ("input_tokens", "output_tokens", "cost_usd")
    ):
        return "not reported"
    cost = usage.get("cost_usd")
    text = f"{usage.get('input_tokens') or 0} in / {usage.get('output_tokens') or 0} out tokens"
    return text + (f", ${cost}" if cost is not None else "")


def _links(run: str, keys: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f'<a href="{esc(_node_href(run, k))}">{esc(k)}</a>' for k in keys) or "-"


def _rerun_form(detail: NodeDetail) -> str:
    """The "Rerun from here" form: it asks for the fork's dry run first (``/runs/RUN/rerun``, GET).

    The textarea holds the node's planned instruction; ``original`` carries it too, so
    sending it unchanged is no edit. Only the confirmation page's POST starts anything.
    """
    planned = detail.planned_instruction or ""
    edited = detail.raw.get("instruction_edited")
    note = (
        f'<p class="notice" id="instruction-edited">this instruction was edited when run '
        f"{esc(edited.get('run_id'))} was rerun from this node; it was: "
        f"<code>{esc(edited.get('original'))}</code></p>"
        if isinstance(edited, dict)
        else ""
    )
    return (
        f'<h3>rerun from here</h3>{note}<form method="get" id="rerun-from" '
        f'action="{esc(run_href(detail.run_id) + "/rerun")}">'
        f'<input type="hidden" name="node" value="{esc(detail.id)}">'
        f'<input type="hidden" name="original" value="{html.escape(planned)}">'
        f'<textarea name="instruction" rows="4" cols="80">{html.escape(planned)}</textarea>'
        "<p>a fork: this node and everything downstream of it run again and are paid for; "
        "what is upstream is replayed. The next page shows its dry run.</p>"
        "<button>Rerun from here…</button></form>"
    )


def node_page(detail: NodeDetail, kept: KeptOutput | None = None) -> str:
    """One node: facts, the instruction as sent (steer blocks marked), response, artifacts.

    ``kept``: what the node's live files hold (streamed so far, or as it was streamed).
    """
    run = detail.run_id
    facts = [
        ("run", f'<a href="{esc(run_href(run))}">{esc(run)}</a>'),
        ("status", esc(detail.status)),
        ("kind", esc(detail.kind)),
        ("assignee", esc(detail.assignee or "-")),
        ("model", esc(detail.model or "-")),
        ("started", esc(when(detail.started_at))),
        ("ended", esc(when(detail.ended_at))),
        ("duration", esc(duration(detail.duration_s))),
        ("usage", esc(_usage(detail.usage))),
        ("depends on", _links(run, detail.depends_on)),
        ("spawned by", _links(run, [detail.parent] if detail.parent else [])),
        ("spawned", _links(run, detail.spawned)),
    ]
    attempt = detail.raw.get("escalation_attempt")
    if attempt is not None:
        facts.append(("escalation attempt", esc(attempt)))
    if detail.replayed:
        origin = detail.raw.get("replayed_from") or {}
        facts.append(("replayed", esc(f"recorded by run {origin.get('run_id') or '?'}")))
    if detail.note:
        facts.append(("note", esc(detail.note)))
    if detail.checkpoint_error:
        facts.append(("checkpoint", esc(detail.checkpoint_error)))
    facts.append(
        (
            "events",
            f'<a id="node-events" href="{esc(events_href(run, node=detail.id))}">'
            "this node in the event log</a>",
        )
    )
    body = [f"<h2>node {esc(detail.id)}</h2>", _facts(facts)]
    body.append("<h3>instruction (as the provider received it)</h3>")
    if detail.instruction is None:
        body.append("<p>not rendered yet</p>")
    else:
        body.append(f'<pre class="instruction">{steer_marked(detail.instruction)}</pre>')
    if detail.status == "failed":
        body.append(f"<h3>error</h3><pre>{esc(detail.error or 'not recorded')}</pre>")
    else:
        shown = None if detail.response is None else response_text(detail.response)
        body.append("<h3>response</h3>")
        body.append(
            f'<pre class="response">{esc(shown)}</pre>' if shown is not None else "<p>none</p>"
        )
    body.append(steps_section(detail.raw.get("steps") or []))
    if detail.status in STREAMING:
        # The call's output as it comes (issue 31); the script stops once the node ended.
        output = f"/api/runs/{quote(run, safe='')}/nodes/{quote(detail.id, safe='')}/output"
        body.append(live_section(output, esc, kept))
    else:
        # The reload on completion must not lose what was streamed: keep it on the page.
        body.append(kept_section(kept, esc))
    body.append("<h3>artifacts</h3>")
    body.append(_artifacts(detail.artifacts, _node_href(run, detail.id) + "/artifacts/"))
    if detail.kind == "planned":
        body.append(_rerun_form(detail))
    # The node page reloads when the node's status moves (its response or error lands).
    return page(
        f"steerflow studio: {detail.id} of {run}",
        "\n".join(body),
        live="/api/runs/" + quote(run, safe=""),
        live_kind="node",
        data={"node": detail.id, "node-status": detail.status},
    )
