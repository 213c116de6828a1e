"""The operation graph: nodes, conditional edges, statuses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from steerflow.plan import Dependency, EdgeWhen, PlanFile
from steerflow.providers import Message, Usage
from steerflow.state import NodeKind, NodeStatus

__all__ = [
    "TERMINAL",
    "Edge",
    "Graph",
    "NodeKind",
    "NodeStatus",
    "Operation",
    "build_graph",
]

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "skipped"})


@dataclass(frozen=True)
class Edge:
    """A dependency on ``source`` (a node id), taken only when its condition holds."""

    source: str
    when: EdgeWhen = "completed"
    if_contains: str | None = None

    def satisfied_by(self, op: Operation) -> bool:
        """True if the dependent may run given the source's terminal state."""
        ok = op.status in TERMINAL if self.when == "always" else op.status == self.when
        if ok and self.if_contains is not None:
            ok = op.status == "completed" and self.if_contains in str(op.response)
        return ok


@dataclass(eq=False)
class Operation:
    """One node of the flow; mutable only by the executor that runs it."""

    key: str
    instruction: str
    kind: NodeKind = "planned"
    assignee: str | None = None
    node_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    edges: list[Edge] = field(default_factory=list)
    inherit_context: bool = False
    parent_id: str | None = None
    status: NodeStatus = "pending"
    response: object = None
    error: str | None = None
    rendered_instruction: str | None = None
    branch: list[Message] = field(default_factory=list)
    usage: Usage | None = None
    artifacts: list[str] = field(default_factory=list)
    replayed: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    # The reason (signal name, ``deadline``) a call cancelled mid-flight was stopped
    # for; the node stays pending and its detail records who cancelled it.
    cancelled: str | None = None
    # Raw spawn requests of the completed call, consumed once by reactive expansion.
    spawn_requests: list[object] = field(default_factory=list)
    # Node ids of the children this operation's spawns created (its checkpoint entry
    # witnesses them, so a resume can tell when a child's entry went missing).
    spawned_ids: list[str] = field(default_factory=list)
    # What ``show RUN NODE`` reports about the call: the model spec that served it and
    # wall-clock start/end (epoch seconds) of the provider call.
    model: str | None = None
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def terminal(self) -> bool:
        """True once the node is completed, failed or skipped."""
        return self.status in TERMINAL


class Graph:
    """Operations keyed by node id, with a second index by leg key."""

    def __init__(self) -> None:
        self.ops: dict[str, Operation] = {}
        self.by_key: dict[str, Operation] = {}
        self.planned: list[Operation] = []

    def add(self, op: Operation) -> None:
        """Add a node; its key must be new."""
        if op.key in self.by_key:
            raise ValueError(f"duplicate node key {op.key!r}")
        self.ops[op.node_id] = op
        self.by_key[op.key] = op
        if op.kind == "planned":
            self.planned.append(op)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self.ops.values()))

    def __len__(self) -> int:
        return len(self.ops)

    def ancestors(self, node_id: str) -> set[str]:
        """Every node id ``node_id`` transitively depends on."""
        seen: set[str] = set()
        stack = [node_id]
        while stack:
            for edge in self.ops[stack.pop()].edges:
                if edge.source not in seen:
                    seen.add(edge.source)
                    stack.append(edge.source)
        return seen

    def dependents(self, node_id: str) -> list[Operation]:
        """Nodes with a direct edge from ``node_id``."""
        return [op for op in self.ops.values() if any(e.source == node_id for e in op.edges)]


def _edge(dep: Dependency, ids: dict[str, str]) -> Edge:
    return Edge(source=ids[dep.id], when=dep.when, if_contains=dep.if_contains)


def build_graph(plan: PlanFile) -> Graph:
    """Build the graph of a validated plan (ids already checked unique and acyclic)."""
    graph = Graph()
    ids: dict[str, str] = {}
    for entry in plan.plan:
        op = Operation(
            key=entry.agent_id,
            instruction=entry.instruction,
            assignee=entry.assignee,
            inherit_context=entry.inherit_context,
        )
        ids[entry.agent_id] = op.node_id
        graph.add(op)
    for entry, op in zip(plan.plan, graph.planned, strict=True):
        op.edges = [_edge(d, ids) for d in entry.dependencies]
    return graph
