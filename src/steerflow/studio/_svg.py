"""The run's DAG as SVG, drawn on the server: layered by dependency, coloured by class.

No inline style (the CSP forbids it): colours come from the stylesheet through classes
(``status-<status>``, ``kind-spawned``, ``escalation``). Every id is escaped; links are
built with :func:`urllib.parse.quote`.
"""

from __future__ import annotations

from urllib.parse import quote

from steerflow.studio._pages import esc
from steerflow.views import RunGraph

__all__ = ["NODE_H", "NODE_W", "graph_svg"]

NODE_W, NODE_H = 150, 26
_GAP_X, _GAP_Y, _PAD = 50, 12, 8
_NODE_STATUSES = ("pending", "running", "paused", "completed", "failed", "skipped")
_LABEL_CHARS = 20


def _label(text: str) -> str:
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"


def graph_svg(graph: RunGraph, *, base: str) -> str:
    """``<svg>`` of ``graph``; each node links to ``base + quote(node id)``."""
    layers = graph.layers()
    where: dict[str, tuple[int, int]] = {}
    for col, nodes in enumerate(layers):
        for row, node in enumerate(nodes):
            where[node.id] = (_PAD + col * (NODE_W + _GAP_X), _PAD + row * (NODE_H + _GAP_Y))
    width = _PAD * 2 + max(len(layers), 1) * (NODE_W + _GAP_X) - _GAP_X
    height = _PAD * 2 + max((len(n) for n in layers), default=1) * (NODE_H + _GAP_Y) - _GAP_Y
    edges: list[str] = []
    shapes: list[str] = []
    for node in graph.nodes:
        x, y = where[node.id]
        for dep in node.depends_on:
            if dep not in where:
                continue
            dx, dy = where[dep]
            kind = " spawn-edge" if dep == node.parent else ""
            edges.append(
                f'<line class="edge{kind}" x1="{dx + NODE_W}" y1="{dy + NODE_H // 2}" '
                f'x2="{x}" y2="{y + NODE_H // 2}"/>'
            )
        status = node.status if node.status in _NODE_STATUSES else "unknown"
        classes = f"node status-{status} kind-{'spawned' if node.kind == 'spawned' else 'planned'}"
        if node.escalated_from:
            classes += " escalation"
        href = esc(base + quote(node.id, safe=""))
        shapes.append(
            f'<a href="{href}"><g class="{classes}" data-node="{esc(node.id)}">'
            f"<title>{esc(node.id)} ({esc(node.status)})</title>"
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="4"/>'
            f'<text x="{x + 6}" y="{y + NODE_H - 8}">{esc(_label(node.id))}</text></g></a>'
        )
    return (
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="dependency graph">' + "".join(edges) + "".join(shapes) + "</svg>"
    )
