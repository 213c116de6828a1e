"""A tool node's steps on its Studio page, as a timeline (issue 39 item 6).

One row per step, in order: a bar placed on the node's time axis (where the step began,
how long it took), what it was (the model's reply and the tools it asked for; a tool's
arguments, status and result), drawn on the server from ``show RUN NODE --json``'s
``steps``, so the page reads without JavaScript.
"""

from __future__ import annotations

import json
from typing import Any

from steerflow.studio._pages import duration, esc

__all__ = ["steps_section"]

_BAR_W = 160  # pixels of the widest bar: the node's whole loop
_TEXT = 160  # characters of a reply or result shown in the row


def _clip(text: object) -> str:
    value = "" if text is None else str(text)
    return value if len(value) <= _TEXT else value[: _TEXT - 1] + "…"


def _bar(step: dict[str, Any], t0: float, span: float) -> str:
    start, end = step.get("started_at"), step.get("ended_at")
    if not isinstance(start, int | float):
        return '<svg class="step-bar" width="160" height="10"></svg>'
    left = (start - t0) / span * _BAR_W
    width = max(2.0, ((end if isinstance(end, int | float) else start) - start) / span * _BAR_W)
    return (
        f'<svg class="step-bar" width="{_BAR_W}" height="10"><rect x="{left:.1f}" y="1" '
        f'width="{min(width, _BAR_W - left):.1f}" height="8" class="bar-{esc(step["status"])}"/>'
        "</svg>"
    )


def _what(step: dict[str, Any]) -> str:
    if step["kind"] == "model":
        calls = ", ".join(str(c.get("name")) for c in step.get("tool_calls") or ())
        said = f"calls {calls}" if calls else f"replied: {_clip(step.get('text'))}"
        steered = f" (operator message {', '.join(step['steered'])})" if step.get("steered") else ""
        return f"model {esc(said)}{esc(steered)}"
    args = json.dumps(step.get("args"), sort_keys=True, ensure_ascii=False)
    if step["kind"] == "approval":
        by = f" by {step['sender']}" if step.get("sender") else ""
        why = f": {step['reason']}" if step.get("reason") else ""
        return (
            f"approval <code>{esc(step.get('request_id'))}</code> of "
            f"<code>{esc(step.get('tool') or 'the node call')}</code> "
            f"<code>{esc(_clip(args))}</code>: {esc(step['status'])}{esc(by)}{esc(_clip(why))}"
        )
    decided = f" ({step['decision']})" if step.get("decision") else ""
    cut = " [truncated]" if step.get("truncated") else ""
    return (
        f"tool <code>{esc(step.get('tool'))}</code> <code>{esc(_clip(args))}</code>: "
        f"{esc(step['status'])}{esc(decided)}: {esc(_clip(step.get('result')))}{esc(cut)}"
    )


def steps_section(steps: list[dict[str, Any]]) -> str:
    """The ``<h3>steps</h3>`` section of a tool node's page; empty for any other node."""
    if not steps:
        return ""
    starts = [s["started_at"] for s in steps if isinstance(s.get("started_at"), int | float)]
    ends = [s["ended_at"] for s in steps if isinstance(s.get("ended_at"), int | float)]
    t0 = min(starts, default=0.0)
    span = max(max([*ends, *starts], default=t0) - t0, 1e-6)
    rows = [
        f'<li class="step step-{esc(s["kind"])}" data-index="{esc(s["index"])}">'
        f'{_bar(s, t0, span)} <span class="step-n">{esc(s["index"])}</span> '
        f'{_what(s)} <span class="step-took">{esc(duration(s.get("duration_s")))}</span></li>'
        for s in steps
    ]
    return f'<h3>steps ({len(steps)})</h3>\n<ol class="steps">\n' + "\n".join(rows) + "\n</ol>"
