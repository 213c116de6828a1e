"""A run's graph for drawing: nodes with their dependencies, layered (one checkpoint load).

Edges come from the checkpoint (the plan's ``dep_indices``, spawned entries' ``depends_on``
and parents), statuses from the published rows where the run publishes them, as
``show RUN NODE`` reads them (``orchestrate._detail.read_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.orchestrate._detail import read_run

__all__ = ["GraphNode", "RunGraph", "run_graph"]


@dataclass(frozen=True)
class GraphNode:
    """One node to draw: ``layer`` is its longest dependency chain from a root."""

    id: str
    kind: str
    status: str
    depends_on: tuple[str, ...]
    parent: str | None
    #: The node an escalation retry (``<agent_id>.esc<N>``) retries, else None.
    escalated_from: str | None
    layer: int
    #: Dependency id -> ``{when, if_contains}`` for its conditional edges (plan
    #: ``depends_on: [{id, when, if_contains}]``); an unconditional edge is not listed.
    conditions: tuple[tuple[str, dict[str, Any]], ...] = ()

    def condition(self, dep: str) -> dict[str, Any] | None:
        """The condition on the edge from ``dep``, None when it is unconditional."""
        return next((c for d, c in self.conditions if d == dep), None)

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the same members."""
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "depends_on": list(self.depends_on),
            "parent": self.parent,
            "escalated_from": self.escalated_from,
            "layer": self.layer,
            "conditions": {d: dict(c) for d, c in self.conditions},
        }


@dataclass(frozen=True)
class RunGraph:
    """The nodes of one run in plan order (spawned ones after), each with its layer."""

    run_id: str
    nodes: tuple[GraphNode, ...]

    def layers(self) -> list[list[GraphNode]]:
        """Nodes grouped by layer, roots first, plan order within a layer."""
        out: list[list[GraphNode]] = [
            [] for _ in range(max((n.layer for n in self.nodes), default=-1) + 1)
        ]
        for node in self.nodes:
            out[node.layer].append(node)
        return out


def run_graph(home: Path, target: str) -> RunGraph:
    """Read run ``target``'s graph.

    Raises:
        UnknownIdError, AmbiguousIdError: ``target`` names no run or several.
    """
    record = read_run(home, target)
    edges: dict[str, tuple[str, ...]] = {}
    for node in record.nodes:
        deps = list(node.depends_on)
        if node.parent and node.parent not in deps:
            deps.append(node.parent)  # a spawned node hangs below the node that spawned it
        edges[node.key] = tuple(deps)
    layers = _layers(edges)
    return RunGraph(
        run_id=record.run_id,
        nodes=tuple(
            GraphNode(
                id=node.key,
                kind=node.kind,
                status=node.status,
                depends_on=edges[node.key],
                parent=node.parent,
                escalated_from=_str(node.extra("escalated_from")),
                layer=layers[node.key],
                conditions=tuple(sorted(node.conditions.items())),
            )
            for node in record.nodes
        ),
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _layers(edges: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """Longest path from a root, iteratively (a 10,000-deep chain must not recurse)."""
    layer: dict[str, int] = {}
    for start in edges:
        stack = [(start, False)]
        visiting: set[str] = set()
        while stack:
            key, expanded = stack.pop()
            if key in layer:
                continue
            deps = [d for d in edges.get(key, ()) if d in edges]
            if expanded:
                visiting.discard(key)
                # A dependency still being visited is a cycle in hand-edited data: cut it.
                layer[key] = 1 + max((layer.get(d, -1) for d in deps), default=-1)
                continue
            visiting.add(key)
            stack.append((key, True))
            stack.extend((d, False) for d in deps if d not in layer and d not in visiting)
    return layer
