"""The Run page's header: who the run is, why it is where it is, when, what it cost.

Name (heading and tab title), status with its reason, start, end and duration that stay
right for a run that died (its end is its last recorded event, ``RunView.ended_at``),
spend against its cap, the resume chain either way, and the run's result. Everything is
read from the views (state DB and checkpoint); every text goes through :func:`esc`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steerflow._usage import cost_text
from steerflow.studio._pages import STATUSES, duration, esc, run_href, when
from steerflow.views import RunGraph, RunView

__all__ = ["RESULT_CHARS", "failures", "header", "recovered_failures", "status_reason", "title"]

#: How much of the run's result the header shows (the rest is on ``steerflow result``).
RESULT_CHARS = 2000


def title(view: RunView) -> str:
    """The tab title: the run's name first (what an operator looks for among tabs)."""
    name = view.name or "run"
    return f"{name} · {view.run_id} · steerflow studio"


def _replacements(graph: RunGraph) -> dict[str, str]:
    """Node -> the escalation retry that replaced it (the retry's ``parent``)."""
    return {n.parent: n.id for n in graph.nodes if n.escalated_from and n.parent}


def recovered_failures(graph: RunGraph) -> dict[str, str]:
    """Failed node -> the last attempt of its escalation chain, for chains that completed.

    A failed attempt an escalation retry replaced is not the run's failure (the flow's own
    ``_final_status`` rule): the page must not show it as one.
    """
    status = {n.id: n.status for n in graph.nodes}
    replaced = _replacements(graph)
    out: dict[str, str] = {}
    for node in graph.nodes:
        if node.status != "failed":
            continue
        last, seen = node.id, {node.id}
        while last in replaced and replaced[last] not in seen:
            last = replaced[last]
            seen.add(last)
        if last != node.id and status.get(last) == "completed":
            out[node.id] = last
    return out


def failures(view: RunView, graph: RunGraph) -> list[str]:
    """The failed nodes that count: not an attempt an escalation retry replaced."""
    replaced = _replacements(graph)
    return [n.id for n in view.nodes if n.status == "failed" and n.id not in replaced]


def status_reason(view: RunView, graph: RunGraph) -> str | None:
    """Why the run is in its status, in words (None when there is nothing to add)."""
    meta: Mapping[str, Any] = view.metadata
    status = view.status
    if status == "stopped" or (isinstance(meta.get("stopped_by"), dict) and status != "running"):
        stop = meta.get("stopped_by")
        if isinstance(stop, dict):
            how = "at once" if stop.get("now") else "when idle"
            said = stop.get("reason")
            control = str(stop.get("control_id") or "?")[:8]
            text = f"stopped by an operator {how} (control {control})"
            return text + (f": {said}" if said else "")
    if status == "budget_exhausted":
        spent = meta.get("budget_exhausted")
        line = spent.get("line") if isinstance(spent, dict) else None
        return str(line) if line else "the run's budget cap was reached"
    if status == "timed_out":
        return "the run's deadline passed before every node ran"
    if status == "failed":
        failed = failures(view, graph)
        if failed:
            first = view.node(failed[0])
            error = (first.detail or {}).get("error") if first is not None else None
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            return f"node {failed[0]} failed{more}" + (f": {error}" if error else "")
        checkpoint = meta.get("checkpoint")
        if isinstance(checkpoint, dict) and checkpoint.get("error"):
            return f"checkpoint: {checkpoint['error']}"
    if status == "interrupted":
        if meta.get("finished_at") is None:
            return "the flow process ended without finishing (killed or crashed)"
        return "the flow was interrupted (a signal) before every node ran"
    return None


def _spend(view: RunView) -> str:
    """What the run spent against its caps; ``not reported`` when no call reported any."""
    usage = view.usage or view.summary.get("usage") or {}
    caps = view.budget or {}
    tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
    parts = []
    cost = cost_text(usage)
    cap = caps.get("max_cost")
    if cost is not None or cap is not None:
        parts.append((cost or "cost not reported") + (f" of ${cap} cap" if cap is not None else ""))
    if tokens_in is not None or tokens_out is not None:
        total = (tokens_in or 0) + (tokens_out or 0)
        text = f"{total:,} tokens ({tokens_in or 0:,} in / {tokens_out or 0:,} out)"
        if caps.get("max_tokens") is not None:
            text += f" of {caps['max_tokens']:,} cap"
        parts.append(text)
    elif caps.get("max_tokens") is not None:
        parts.append(f"tokens not reported, cap {caps['max_tokens']:,}")
    return "; ".join(parts) or "not reported"


def _chain(view: RunView) -> str:
    links = []
    if view.resumed_from_run:
        href = esc(run_href(view.resumed_from_run))
        links.append(
            f'previous: <a id="run-previous" href="{href}">{esc(view.resumed_from_run)}</a>'
        )
    after = [item for item in view.resumed_by if item.get("run_id")]
    for item in after:
        target = str(item["run_id"])
        label = esc(target) + (" (fork)" if item.get("fork") else "")
        links.append(f'next: <a class="run-next" href="{esc(run_href(target))}">{label}</a>')
    return " · ".join(links) or "-"


def _end(view: RunView) -> str:
    if view.status == "running" or view.ended_at is None:
        return "-"
    dead = view.metadata.get("finished_at") is None
    note = " (last recorded event)" if dead else ""
    return (
        f'<span id="run-end" data-at="{view.ended_at:.3f}">{esc(when(view.ended_at))}</span>'
        f"{esc(note)}"
    )


def header(view: RunView, graph: RunGraph, result: str | None, *, controls: str = "") -> str:
    """The header: heading, status and reason, times, spend, chain, result, controls."""
    status = view.status or "unknown"
    known = status if status in STATUSES else "unknown"
    reason = status_reason(view, graph)
    heading = (
        f'<h2 id="run-name">{esc(view.name or "run " + view.run_id)} '
        f'<small class="run-id"><code>{esc(view.run_id)}</code></small></h2>'
    )
    rows = [
        (
            "status",
            f'<span class="status status-{known}" id="run-status">{esc(status)}</span>'
            + (f' <span id="run-reason">{esc(reason)}</span>' if reason else ""),
        ),
        ("started", f'<span id="run-start">{esc(when(view.created_at))}</span>'),
        ("ended", _end(view)),
        (
            "duration",
            f'<span id="run-duration" data-s="{esc(view.duration_s)}">'
            f"{esc(duration(view.duration_s))}</span>"
            + (" (so far)" if view.status == "running" else ""),
        ),
        ("spent", f'<span id="run-spend">{esc(_spend(view))}</span>'),
        ("resume chain", f'<span id="run-chain">{_chain(view)}</span>'),
    ]
    if result is not None:
        shown = result if len(result) <= RESULT_CHARS else result[:RESULT_CHARS] + "…"
        rows.append(("result", f'<pre id="run-result">{esc(shown)}</pre>'))
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows)
    bar = f'<div class="run-controls">{controls}</div>' if controls else ""
    return (
        f'<section class="run-header" id="run-header">{heading}{bar}'
        f'<dl class="facts">{facts}</dl></section>'
    )
