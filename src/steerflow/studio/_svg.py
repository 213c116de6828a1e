"""The run's DAG as SVG, drawn on the server: laid out by grandalf's Sugiyama layout.

grandalf (decision 201) ranks the nodes top-down, orders each layer to cut crossings and
puts a dummy vertex on every layer an edge skips, so an edge from ``parse`` to ``report``
past ``chart`` runs through the gap grandalf kept for it instead of through ``chart``'s
box. Each edge is drawn as a polyline: down from the source's bottom edge, through each
of its dummies vertically (the layer's height, clear of the boxes beside it), into the
target's top edge, ending in an arrowhead.

No inline style (the CSP forbids it): colours come from the stylesheet through classes
(``status-<status>``, ``kind-spawned``, ``escalation``, ``edge-failed``...). Every id and
label is escaped; links are built with :func:`urllib.parse.quote`.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import quote

from steerflow.studio._pages import esc
from steerflow.views import GraphNode, RunGraph

__all__ = ["NODE_H", "NODE_W", "graph_svg", "layout"]

NODE_W, NODE_H = 150, 26
_PAD, _X_SPACE, _Y_SPACE, _COMPONENT_GAP = 12, 24, 44, 40
_NODE_STATUSES = ("pending", "running", "paused", "completed", "failed", "skipped", "interrupted")
_LABEL_CHARS = 20
_CONDITION_CHARS = 24

Point = tuple[float, float]


class _View:
    """What grandalf reads and writes on a vertex: its size, then its centre."""

    def __init__(self, w: float, h: float) -> None:
        self.w, self.h = w, h
        self.xy: Point = (0.0, 0.0)


class _EdgeView:
    def __init__(self) -> None:
        self.points: list[Point] = []

    def setpath(self, pts: list[Point]) -> None:
        self.points = list(pts)


def _label(text: str, limit: int = _LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


Layout = tuple[dict[str, Point], dict[tuple[str, str], list[Point]]]
#: Components are laid side by side until a row is this wide, then a new row starts: 30
#: independent chains must not make a 7,388 px wide page (issue 42 item 3).
ROW_W = 1600.0


def layout(graph: RunGraph) -> Layout:
    """Node id -> top-left corner, and (dependency, node) -> the edge's polyline.

    The layout depends on the graph's shape only (ids and edges, not statuses), and a
    page is drawn again on every status change of a live run: it is computed once per
    shape (most of a 300-node page's server time was the layout).
    """
    shape = tuple((n.id, tuple(n.depends_on)) for n in graph.nodes)
    return _layout(shape)


@functools.lru_cache(maxsize=16)
def _layout(shape: tuple[tuple[str, tuple[str, ...]], ...]) -> Layout:
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    vertices = {key: Vertex(key) for key, _ in shape}
    for v in vertices.values():
        v.view = _View(NODE_W, NODE_H)
    edges: dict[tuple[str, str], Any] = {}
    for key, deps in shape:
        for dep in deps:
            if dep in vertices and dep != key and (dep, key) not in edges:
                edge = Edge(vertices[dep], vertices[key])
                edge.view = _EdgeView()
                edges[(dep, key)] = edge
    where: dict[str, Point] = {}
    offset = float(_PAD)
    top, bottom = 0.0, 0.0  # the current row of components: its top, its lowest box
    for component in Graph(list(vertices.values()), list(edges.values())).C:
        sug = SugiyamaLayout(component)
        sug.xspace, sug.yspace = _X_SPACE, _Y_SPACE
        sug.init_all()
        sug.dw, sug.dh = 12, NODE_H  # dummies as tall as a box: a layer's band is uniform
        sug.draw()
        # Dummy vertices (an edge's bends) may lie beside every box: bound them too.
        bends = [x for e in component.sE for x, _ in e.view.points]
        left = min([v.view.xy[0] - v.view.w / 2 for v in component.sV] + bends)
        right = max([v.view.xy[0] + v.view.w / 2 for v in component.sV] + bends)
        if offset > _PAD and offset + (right - left) > ROW_W:
            offset, top = float(_PAD), bottom + _COMPONENT_GAP  # a new row below
        shift, lift = offset - left, top + _PAD
        for v in component.sV:
            x, y = v.view.xy
            v.view.xy = (x + shift, y + lift)
            where[v.data] = (x + shift - NODE_W / 2, y + lift - NODE_H / 2)
            bottom = max(bottom, y + lift + NODE_H / 2)
        for e in component.sE:
            e.view.points = [(x + shift, y + lift) for x, y in e.view.points]
        offset = right + shift + _COMPONENT_GAP
    return where, {key: _route(e.view.points) for key, e in edges.items()}


def _route(centres: list[Point]) -> list[Point]:
    """Bottom of the source, vertically through each dummy's layer, top of the target."""
    if len(centres) < 2:
        return []
    (sx, sy), (tx, ty) = centres[0], centres[-1]
    if ty < sy:  # an edge grandalf inverted to break a cycle: drawn as it is stored
        return [(sx, sy - NODE_H / 2), (tx, ty + NODE_H / 2)]
    out = [(sx, sy + NODE_H / 2)]
    for dx, dy in centres[1:-1]:
        out += [(dx, dy - NODE_H / 2), (dx, dy + NODE_H / 2)]
    out.append((tx, ty - NODE_H / 2))
    return out


def _edge_label(condition: dict[str, Any] | None) -> str | None:
    if condition is None:
        return None
    when = condition.get("when") or "completed"
    parts = {"failed": ["on failure"], "always": ["always"]}.get(str(when), [])
    contains = condition.get("if_contains")
    if isinstance(contains, str):
        parts.append(f"if contains “{_label(contains, _CONDITION_CHARS)}”")
    return ", ".join(parts) or None


def _edge(dep: str, node: GraphNode, points: list[Point]) -> str:
    condition = node.condition(dep)
    classes = ["edge"]
    if dep == node.parent:
        classes.append("spawn-edge")
    if condition is not None:
        classes.append(f"edge-{condition.get('when') or 'completed'}")
        if condition.get("if_contains") is not None:
            classes.append("edge-contains")
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    label = _edge_label(condition)
    text = ""
    if label is not None:
        # Midway along the last segment: just above the target, where the edge is its own.
        (x0, y0), (x1, y1) = points[-2], points[-1]
        text = (
            f'<text class="edge-label" x="{(x0 + x1) / 2 + 4:.1f}" y="{(y0 + y1) / 2:.1f}">'
            f"{esc(label)}</text>"
        )
    return (
        f'<g class="{" ".join(classes)}" data-edge="{esc(dep)}>{esc(node.id)}">'
        f"<title>{esc(dep)} → {esc(node.id)}{esc(': ' + label if label else '')}</title>"
        f'<polyline points="{path}" marker-end="url(#arrow)"/>{text}</g>'
    )


def graph_svg(graph: RunGraph, *, base: str, zoom: str = "100", found: str | None = None) -> str:
    """``<svg>`` of ``graph``; each node links to ``base + quote(node id)``.

    ``zoom``: ``fit`` (the drawing scales to the page's width, its viewBox kept) or a
    percentage of the drawn size; ``found``: the node a search found, marked and the
    target of the page's ``#dag-<id>`` fragment.
    """
    where, routes = layout(graph) if graph.nodes else ({}, {})
    bends = [x for points in routes.values() for x, _ in points]
    width = max([x + NODE_W for x, _ in where.values()] + bends, default=0) + _PAD
    height = max((y + NODE_H for _, y in where.values()), default=0) + _PAD
    edges: list[str] = []
    shapes: list[str] = []
    for node in graph.nodes:
        x, y = where[node.id]
        for dep in node.depends_on:
            points = routes.get((dep, node.id))
            if points:
                edges.append(_edge(dep, node, points))
        status = node.status if node.status in _NODE_STATUSES else "unknown"
        classes = f"node status-{status} kind-{'spawned' if node.kind == 'spawned' else 'planned'}"
        if node.escalated_from:
            classes += " escalation"
        mark = ""
        if node.id == found:
            classes += " found"
            mark = f' id="dag-{esc(quote(node.id, safe=""))}"'
        href = esc(base + quote(node.id, safe=""))
        shapes.append(
            f'<a href="{href}"{mark}><g class="{classes}" data-node="{esc(node.id)}">'
            f"<title>{esc(node.id)} ({esc(node.status)})</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="4"/>'
            f'<text x="{x + 6:.1f}" y="{y + NODE_H - 8:.1f}">{esc(_label(node.id))}</text></g></a>'
        )
    marker = (
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path class="arrowhead" '
        'd="M0,0 L10,5 L0,10 z"/></marker></defs>'
    )
    if zoom == "fit":
        size = 'width="100%" data-zoom="fit"'
    else:
        scale = int(zoom) / 100 if zoom.isdigit() else 1.0
        size = f'width="{width * scale:.0f}" height="{height * scale:.0f}" data-zoom="{zoom}"'
    return (
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" {size} '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="dependency graph">' + marker + "".join(edges) + "".join(shapes) + "</svg>"
    )
