"""The run's timeline (Gantt): every node's start and end on one time axis, as SVG.

Drawn on the server from the published call details (``started_at``/``ended_at``), so
the page reads without JavaScript. Each bar carries its times in ``data-start`` and
``data-end`` and the axis its origin in ``data-t0``: the script re-scales the bars and
the axis end from every live answer (attributes and ``textContent`` only, never HTML),
so a node that starts or ends after load is drawn where it is.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from steerflow.studio._pages import duration, esc
from steerflow.views import NodeState, RunView

__all__ = ["TIMELINE_W", "timeline_svg"]

TIMELINE_W = 560
_LABEL_W, _ROW_H, _BAR_H, _PAD, _AXIS_H = 150, 20, 12, 6, 18
_LABEL_CHARS = 22


def _times(detail: dict[str, object] | None) -> tuple[float | None, float | None]:
    detail = detail or {}
    start, end = detail.get("started_at"), detail.get("ended_at")
    return (
        float(start) if isinstance(start, (int, float)) else None,
        float(end) if isinstance(end, (int, float)) else None,
    )


def _end_of(
    node: NodeState, start: float | None, end: float | None
) -> tuple[float | None, float | None]:
    """A bar's start and end; a node that died in flight ends where the view stopped it.

    Its start plus its duration, not "now": its bar must not grow on every reload of a
    run that is long dead. A duration of 0 (the run's last sign of life came before the
    call's recorded start, as it can when the process is killed just after starting it)
    or none known is a bar of no length, never one that ends now.
    """
    if start is not None and end is None and node.status != "running":
        end = start + (node.duration_s or 0.0)
    return start, end


def timeline_svg(
    view: RunView,
    *,
    base: str,
    now: float | None = None,
    first: int = 0,
    count: int | None = None,
) -> str:
    """``<svg>`` of the nodes' call times; a node not started yet has a row and no bar.

    ``first``/``count``: draw only those rows (a long run's timeline is cut into parts),
    on the axis of the whole run so the parts line up.
    """
    now = time.time() if now is None else now
    every = [(n, *_end_of(n, *_times(n.detail))) for n in view.nodes]
    starts = [s for _, s, _ in every if s is not None]
    t0 = min(starts, default=now)
    t1 = max([e if e is not None else now for _, s, e in every if s is not None], default=now)
    rows = every[first : None if count is None else first + count]
    end_id = ' id="timeline-end"' if first == 0 else ""  # one per page
    span = max(t1 - t0, 0.001)
    height = _AXIS_H + _PAD * 2 + len(rows) * _ROW_H
    width = _LABEL_W + TIMELINE_W + _PAD * 2
    parts = [
        f'<line class="axis" x1="{_LABEL_W}" y1="{_AXIS_H}" x2="{_LABEL_W + TIMELINE_W}" '
        f'y2="{_AXIS_H}"/>',
        f'<text class="tick" x="{_LABEL_W}" y="{_AXIS_H - 5}">0s</text>',
        f'<text class="tick"{end_id} text-anchor="end" '
        f'x="{_LABEL_W + TIMELINE_W}" '
        f'y="{_AXIS_H - 5}">{esc(duration(span if starts else None))}</text>',
    ]
    for i, (node, start, end) in enumerate(rows):
        y = _AXIS_H + _PAD + i * _ROW_H
        label = node.id if len(node.id) <= _LABEL_CHARS else node.id[: _LABEL_CHARS - 1] + "…"
        href = esc(base + quote(node.id, safe=""))
        parts.append(
            f'<a href="{href}"><text class="row-label" x="0" y="{y + _BAR_H - 2}">'
            f"{esc(label)}</text></a>"
        )
        x = _LABEL_W + (0 if start is None else (start - t0) / span * TIMELINE_W)
        w = 0 if start is None else max(2.0, ((end or now) - start) / span * TIMELINE_W)
        status = esc(node.status)
        parts.append(
            f'<rect class="bar status-{status}" data-bar="{esc(node.id)}" '
            f'data-start="{"" if start is None else f"{start:.3f}"}" '
            f'data-end="{"" if end is None else f"{end:.3f}"}" x="{x:.1f}" y="{y}" '
            f'width="{w:.1f}" height="{_BAR_H}" rx="2"><title>{esc(node.id)}: '
            f"{esc(node.status)} {esc(duration(node.duration_s))}</title></rect>"
        )
    return (
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="timeline" '
        f'data-t0="{t0:.3f}" data-x0="{_LABEL_W}" data-w="{TIMELINE_W}">'
        + "".join(parts)
        + "</svg>"
    )
