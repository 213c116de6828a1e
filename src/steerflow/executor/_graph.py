"""The operation graph: nodes, conditional edges, statuses."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from steerflow.artifacts import ArtifactRecord, merge_declared
from steerflow.plan import Dependency, EdgeWhen, PlanFile
from steerflow.providers import Message, Usage
from steerflow.state import NodeKind, NodeStatus

__all__ = [
    "TERMINAL",
    "CallBranch",
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


@dataclass(eq=False, slots=True, weakref_slot=True)
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
    # ``response``: the reply text, or how to read it back from the checkpoint once the
    # run keeps it only there (issue 43 item 2, decision 393).
    _response: object = field(default=None, repr=False)
    _read_back: Callable[[], object] | None = field(default=None, repr=False)
    error: str | None = None
    # The instruction its provider received: a string, or how to render it again when it
    # embeds its dependencies' results (those stay on their operations: decision 65).
    _rendered: str | Callable[[], str] | None = field(default=None, repr=False)
    branch: Sequence[Message] = field(default_factory=list)
    usage: Usage | None = None
    artifacts: list[str] = field(default_factory=list)
    # The files this leg must leave in its directory (its artifact contract), and what
    # the live check found there once it completed (sorted by path).
    declared_artifacts: tuple[str, ...] = ()
    artifact_records: list[ArtifactRecord] = field(default_factory=list)
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
    # An escalation retry (Amendment 3 item 4): the node id of the logical operation it
    # retries (the chain's first attempt), its attempt number N (spawn id
    # ``<agent_id>.esc<N>``; 0 for a first attempt) and the ladder model it runs at.
    escalated_from: str | None = None
    escalation: int = 0
    pinned_model: str | None = None
    # The tool specs its model may call (plan, role and entry ``tools``): with any, its
    # call is a model-and-tool loop of at most ``max_steps`` model requests (issue 39).
    tools: tuple[str, ...] = ()
    max_steps: int | None = None
    # The JSON Schema its reply must satisfy (issue 40 item 2), and the validated output
    # once it completed (its ``response`` is then that output as JSON text).
    output_schema: dict[str, object] | None = None
    output: object = None
    # How often a reply that does not fit ``output_schema`` is asked again (the entry's
    # ``retry.attempts``, else 1: decision 284).
    output_reasks: int = 1
    # Per-node settings (issue 40): tries after the first failed call (None: no retry),
    # the pause before each, and the longest one call may take (decisions 276-278).
    retry_attempts: int | None = None
    retry_backoff_s: float = 0.0
    timeout_s: float | None = None
    # Approvals (issue 41): ``approval: required`` makes the node wait before its call;
    # a tool whose name matches one of ``approve`` (role and entry patterns) waits
    # before each call, unless its ``tool_options`` say otherwise.
    approval: bool = False
    approve: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        """True once the node is completed, failed or skipped."""
        return self.status in TERMINAL

    @property
    def response(self) -> object:
        """The completed call's reply (a typed node's: its output as JSON text), else None.

        Read back from the checkpoint when the run keeps it only there (decision 393).
        """
        read = self._read_back
        return self._response if read is None else read()

    @response.setter
    def response(self, value: object) -> None:
        self._response, self._read_back = value, None

    @property
    def response_in_memory(self) -> object:
        """``response`` when it is held here, else None (never reads it back)."""
        return self._response

    @property
    def response_read_back(self) -> Callable[[], object] | None:
        """How ``response`` is read back, when it is kept only in the checkpoint."""
        return self._read_back

    def keep_response_elsewhere(self, read_back: Callable[[], object]) -> None:
        """Drop the response held here; ``read_back`` returns it from now on."""
        self._response, self._read_back = None, read_back

    @property
    def rendered_instruction(self) -> str | None:
        """The instruction its provider received (steer block, dependency results)."""
        rendered = self._rendered
        return rendered() if callable(rendered) else rendered

    @rendered_instruction.setter
    def rendered_instruction(self, value: str | None) -> None:
        self._rendered = value

    def render_later(self, render: Callable[[], str]) -> None:
        """Keep ``render`` instead of the rendered text, which it must reproduce exactly."""
        self._rendered = render


class CallBranch(Sequence[Message]):
    """A completed call's conversation: what it started from, its instruction, its reply.

    The instruction turn is read from the operation when asked for, so a rendered
    instruction that embeds its dependencies' results is not kept a second time for
    every node (decision 65). Equal to any list or tuple of the same messages.
    """

    __slots__ = ("_history", "_op", "_reply")

    def __init__(self, history: Sequence[Message], op: Operation, reply: str) -> None:
        self._history = tuple(history)
        self._op = op
        # The operation's own response is read from it (it may be kept only in the
        # checkpoint later: decision 393), not held a second time here.
        self._reply: str | None = None if reply is op.response_in_memory else reply

    def _messages(self) -> list[Message]:
        instruction = self._op.rendered_instruction
        reply = self._reply if self._reply is not None else str(self._op.response)
        return [
            *self._history,
            Message("user", self._op.instruction if instruction is None else instruction),
            Message("assistant", reply),
        ]

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self._messages()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages())

    def __len__(self) -> int:
        return len(self._history) + 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CallBranch | list | tuple):
            return self._messages() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-equal like the list it stands for

    def __repr__(self) -> str:
        return repr(self._messages())


class Graph:
    """Operations keyed by node id, with a second index by leg key."""

    def __init__(self) -> None:
        self.ops: dict[str, Operation] = {}
        self.by_key: dict[str, Operation] = {}
        self.planned: list[Operation] = []
        #: Escalation chains: failed attempt's node id -> the retry spliced after it.
        self.replaced_by: dict[str, str] = {}
        #: The run's synthesis (CONTRACT §10): runs once every other node is terminal.
        self.synthesis: Operation | None = None
        #: Whether the synthesis runs when no worker completed (``when_all_failed: run``).
        self.synthesis_when_all_failed = False

    def add(self, op: Operation) -> None:
        """Add a node; its key must be new."""
        if op.key in self.by_key:
            raise ValueError(f"duplicate node key {op.key!r}")
        self.ops[op.node_id] = op
        self.by_key[op.key] = op
        if op.kind == "planned":
            self.planned.append(op)

    def add_synthesis(self, op: Operation, *, when_all_failed: bool = False) -> None:
        """Add the synthesis node: in the graph, but not one of the plan's entries.

        ``when_all_failed``: it runs even when no worker completed (else it is skipped).
        """
        if op.key in self.by_key:
            raise ValueError(f"duplicate node key {op.key!r}")
        self.ops[op.node_id] = op
        self.by_key[op.key] = op
        self.synthesis = op
        self.synthesis_when_all_failed = when_all_failed

    def workers(self) -> list[Operation]:
        """Every node but the synthesis, each escalation chain by its last attempt only.

        An attempt is replaced when another node names it as ``parent_id`` while
        carrying ``escalated_from`` (Amendment 3 item 4), so the rule holds for a graph
        rebuilt from a checkpoint as well as for one spliced live.
        """
        replaced = {op.parent_id for op in self.ops.values() if op.escalated_from}
        return [
            op
            for op in self.ops.values()
            if op is not self.synthesis and op.node_id not in replaced
        ]

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

    def splice_after(self, anchor: str, retry: Operation) -> None:
        """Put ``retry`` in ``anchor``'s place: every edge on ``anchor`` moves to it.

        Conditions (``when``, ``if_contains``) move with the edges, so dependents wait
        for the end of the replacement chain and a ``when: failed`` fallback sees the
        last attempt. ``retry``'s own edges are left alone; it is added if new. An
        anchor is replaced at most once (a chain, not a tree).
        """
        if anchor not in self.ops:
            raise ValueError(f"splice anchor {anchor!r} is not in the graph")
        if anchor in self.replaced_by:
            raise ValueError(f"node {self.ops[anchor].key!r} is already replaced")
        if retry.node_id not in self.ops:
            self.add(retry)
        for op in self.ops.values():
            if op is retry or not any(e.source == anchor for e in op.edges):
                continue
            op.edges = [
                Edge(retry.node_id, e.when, e.if_contains) if e.source == anchor else e
                for e in op.edges
            ]
        self.replaced_by[anchor] = retry.node_id

    def chain_end(self, node_id: str) -> str:
        """The last attempt of the replacement chain ``node_id`` belongs to (itself if none)."""
        while node_id in self.replaced_by:
            node_id = self.replaced_by[node_id]
        return node_id

    def superseded(self, op: Operation) -> bool:
        """True for a failed attempt that an escalation retry replaced."""
        return op.node_id in self.replaced_by


def _edge(dep: Dependency, ids: dict[str, str]) -> Edge:
    return Edge(source=ids[dep.id], when=dep.when, if_contains=dep.if_contains)


def build_graph(plan: PlanFile) -> Graph:
    """Build the graph of a validated plan (ids already checked unique and acyclic)."""
    graph = Graph()
    ids: dict[str, str] = {}
    for entry in plan.plan:
        role = plan.roles.get(entry.assignee or "")
        op = Operation(
            key=entry.agent_id,
            instruction=entry.instruction,
            assignee=entry.assignee,
            inherit_context=entry.inherit_context,
            declared_artifacts=merge_declared(role.artifacts if role else (), entry.artifacts),
            tools=tuple(plan.tools_of(entry)),
            max_steps=entry.max_steps,
            output_schema=entry.output_schema,
            output_reasks=entry.retry.attempts if entry.retry is not None else 1,
            # The entry's own model wins over its role's and the run's (decision 277).
            pinned_model=entry.model,
            timeout_s=entry.timeout_s,
            approval=entry.approval == "required",
            approve=tuple(plan.approve_of(entry)),
        )
        if entry.retry is not None:
            op.retry_attempts, op.retry_backoff_s = entry.retry.attempts, entry.retry.backoff_s
        ids[entry.agent_id] = op.node_id
        graph.add(op)
    for entry, op in zip(plan.plan, graph.planned, strict=True):
        op.edges = [_edge(d, ids) for d in entry.dependencies]
    return graph
