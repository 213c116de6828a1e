"""``FlowRun.events()``: a run's events as typed, frozen objects, in an async iterator.

The executor's :class:`~steerflow.executor.EventBus` calls its subscribers synchronously
and they must not block, so a stream only appends to its own buffer and wakes its
reader: a slow consumer never holds the run up (decision 160). The buffer is unbounded
unless ``max_pending`` is given; then the oldest events make room and the reader gets
one :class:`EventsDropped` saying how many it missed, where they were.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from steerflow.executor import FlowEvent

__all__ = [
    "AdmissionClosed",
    "ApprovalRequested",
    "CheckpointFailed",
    "CheckpointReconciled",
    "CheckpointSaved",
    "ControlApplied",
    "EventStream",
    "EventsDropped",
    "ModelStep",
    "NodeCompleted",
    "NodeFailed",
    "NodePaused",
    "NodeReplayed",
    "NodeSkipped",
    "NodeStarted",
    "NodeWithheld",
    "PlanReady",
    "PlanWarning",
    "RunEvent",
    "SpawnAccepted",
    "SpawnRejected",
    "ToolCallEnded",
    "ToolCallStarted",
    "typed_event",
]


@dataclass(frozen=True, kw_only=True)
class RunEvent:
    """Base of every event ``FlowRun.events()`` yields; ``type`` is the event bus's name."""

    type: ClassVar[str] = ""
    #: Wall-clock time (``time.time()``) the run emitted it.
    ts: float = 0.0


@dataclass(frozen=True, kw_only=True)
class _NodeEvent(RunEvent):
    #: The node's key (planned ``agent_id``, spawn id or ``synthesis``) and its node id.
    key: str
    node_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlanReady(RunEvent):
    """The graph is built: ``nodes`` to run (a resume's replayed ones included)."""

    type: ClassVar[str] = "plan_ready"
    nodes: int
    max_spawn: int


@dataclass(frozen=True, kw_only=True)
class PlanWarning(RunEvent):
    """Something about the plan the run tells its operator (``FlowResult.warnings`` too)."""

    type: ClassVar[str] = "plan_truncated"
    message: str


@dataclass(frozen=True, kw_only=True)
class NodeStarted(_NodeEvent):
    """The node's provider call is being made; ``model`` for an escalation retry."""

    type: ClassVar[str] = "node_started"
    model: str | None = None


@dataclass(frozen=True, kw_only=True)
class NodeCompleted(_NodeEvent):
    """The node returned a response (checkpointed before the next event of this node).

    ``response`` is its reply text, ``output`` its validated structured output (a node
    with an ``output_schema``; else None), ``usage`` what its calls cost (None: not
    reported).
    """

    type: ClassVar[str] = "node_completed"
    response: object = None
    output: object = None
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class NodeFailed(_NodeEvent):
    """The node failed; ``error`` is what its result records."""

    type: ClassVar[str] = "node_failed"
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class NodeSkipped(_NodeEvent):
    """An edge condition was not met (or nothing was there to synthesize)."""

    type: ClassVar[str] = "node_skipped"
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodeReplayed(_NodeEvent):
    """A resume took the node's recorded outcome instead of running it."""

    type: ClassVar[str] = "node_replayed"


@dataclass(frozen=True, kw_only=True)
class NodeWithheld(_NodeEvent):
    """The node was not admitted (admission closed, a dependency not run); resumable."""

    type: ClassVar[str] = "node_withheld"
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodePaused(_NodeEvent):
    """The node waits at the closed pause gate."""

    type: ClassVar[str] = "node_paused"


@dataclass(frozen=True, kw_only=True)
class ModelStep(_NodeEvent):
    """A tool node's model reply is on record: step ``index``, the tools it asked for."""

    type: ClassVar[str] = "model_step"
    index: int
    tool_calls: tuple[str, ...] = ()
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class _ToolCall(_NodeEvent):
    #: The step's index in the node's loop, the vendor's call id, the tool and its args.
    index: int
    call_id: str
    tool: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ToolCallStarted(_ToolCall):
    """A tool call's intent is on record and the tool runs now."""

    type: ClassVar[str] = "tool_call_started"


@dataclass(frozen=True, kw_only=True)
class ToolCallEnded(_ToolCall):
    """A tool call's outcome is on record: ``completed``, ``failed`` or ``skipped``."""

    type: ClassVar[str] = "tool_call_ended"
    status: str


@dataclass(frozen=True, kw_only=True)
class ApprovalRequested(_NodeEvent):
    """The node waits for an operator's approval of ``request_id`` (issue 41).

    ``tool`` and ``args``: the call asked about (``tool`` None for the node's own call,
    its instruction in ``args``); ``text``: the model's text before it. Decide with
    ``steerflow.approve``/``steerflow.deny``.
    """

    type: ClassVar[str] = "approval_requested"
    request_id: str
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class SpawnAccepted(_NodeEvent):
    """``emitter`` spawned node ``key``; ``escalation`` N for the Nth escalation retry."""

    type: ClassVar[str] = "node_spawned"
    emitter: str | None = None
    escalation: int | None = None
    model: str | None = None


@dataclass(frozen=True, kw_only=True)
class SpawnRejected(RunEvent):
    """A spawn request of ``emitter`` refused; ``reason`` as in ``spawn_rejections``."""

    type: ClassVar[str] = "spawn_rejected"
    emitter: str | None
    agent_id: str | None
    reason: str
    detail: str | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(RunEvent):
    """The checkpoint acknowledged a record: ``what`` is ``flush``, ``op`` or ``spawn``."""

    type: ClassVar[str] = "checkpoint_saved"
    what: str | None = None
    node_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(RunEvent):
    """A record could not be persisted; the run admits nothing more (decision 35)."""

    type: ClassVar[str] = "checkpoint_failed"
    key: str | None
    error: str


@dataclass(frozen=True, kw_only=True)
class CheckpointReconciled(RunEvent):
    """A failed write was recovered from the checkpoint's durable prefix."""

    type: ClassVar[str] = "checkpoint_reconciled"
    key: str | None
    error: str


@dataclass(frozen=True, kw_only=True)
class ControlApplied(RunEvent):
    """An operator control took effect.

    ``verb`` ``pause``/``resume``/``stop`` when the poller applied it (``control_id``
    is the stop's; a pause or resume carries none); ``message`` when messages were
    rendered into node ``key``'s instruction (``messages`` of them).
    """

    type: ClassVar[str] = "control_applied"
    verb: str
    control_id: str | None = None
    key: str | None = None
    messages: int = 0


@dataclass(frozen=True, kw_only=True)
class AdmissionClosed(RunEvent):
    """Nothing new is admitted any more, and why (``reason``).

    ``stop``, ``deadline``, ``SIGINT``, ``SIGTERM``, ``checkpoint-failed`` or a lost
    lease's reason.
    """

    type: ClassVar[str] = "admission_closed"
    reason: str


@dataclass(frozen=True, kw_only=True)
class EventsDropped(RunEvent):
    """``count`` events were dropped here: the stream's ``max_pending`` was reached."""

    type: ClassVar[str] = "events_dropped"
    count: int


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_PLAIN: dict[str, type[_NodeEvent]] = {
    "node_replayed": NodeReplayed,
    "node_paused": NodePaused,
}


def _node(event: FlowEvent, error: str | None, completed: dict[str, Any] | None) -> RunEvent:
    d, ts, key, node_id = event.data, event.ts, event.node_key or "", event.node_id
    if event.type == "node_completed":
        return NodeCompleted(ts=ts, key=key, node_id=node_id, **(completed or {}))
    if event.type in _STEPS:
        return _step(event, key)
    if event.type == "approval_requested":
        args = d.get("args")
        return ApprovalRequested(
            ts=ts, key=key, node_id=node_id, request_id=str(d.get("request_id")),
            tool=_text(d.get("tool")), args=dict(args) if isinstance(args, dict) else {},
            text=str(d.get("text") or ""),
        )  # fmt: skip
    plain = _PLAIN.get(event.type)
    if plain is not None:
        return plain(ts=ts, key=key, node_id=node_id)
    match event.type:
        case "node_started":
            return NodeStarted(ts=ts, key=key, node_id=node_id, model=_text(d.get("model")))
        case "node_failed":
            return NodeFailed(ts=ts, key=key, node_id=node_id, error=error)
        case "node_skipped":
            return NodeSkipped(ts=ts, key=key, node_id=node_id, reason=str(d.get("reason", "")))
        case "node_withheld":
            return NodeWithheld(ts=ts, key=key, node_id=node_id, reason=str(d.get("reason", "")))
    return SpawnAccepted(
        ts=ts,
        key=key,
        node_id=node_id,
        emitter=_text(d.get("emitter")),
        escalation=_int(d.get("escalation")),
        model=_text(d.get("model")),
    )


_STEPS = frozenset({"model_step", "tool_call_started", "tool_call_ended"})


def _step(event: FlowEvent, key: str) -> RunEvent:
    d, ts, node_id = event.data, event.ts, event.node_id
    index = _int(d.get("index")) or 0
    if event.type == "model_step":
        usage = d.get("usage")
        calls = d.get("tool_calls")
        return ModelStep(
            ts=ts, key=key, node_id=node_id, index=index,
            tool_calls=tuple(str(c) for c in calls) if isinstance(calls, list) else (),
            usage=dict(usage) if isinstance(usage, dict) else None,
        )  # fmt: skip
    args = d.get("args")
    common: dict[str, Any] = {
        "ts": ts, "key": key, "node_id": node_id, "index": index,
        "call_id": str(d.get("call_id")), "tool": str(d.get("tool")),
        "args": dict(args) if isinstance(args, dict) else {},
    }  # fmt: skip
    if event.type == "tool_call_started":
        return ToolCallStarted(**common)
    return ToolCallEnded(**common, status=str(d.get("status")))


def typed_event(
    event: FlowEvent, *, error: str | None = None, completed: dict[str, Any] | None = None
) -> RunEvent:
    """The typed form of one bus event.

    ``error``: a failed node's recorded error; ``completed``: a completed node's
    ``response``, ``output`` and ``usage`` (read from its operation, not the bus).
    """
    d, ts = event.data, event.ts
    match event.type:
        case "plan_ready":
            return PlanReady(
                ts=ts, nodes=_int(d.get("nodes")) or 0, max_spawn=_int(d.get("max_spawn")) or 0
            )
        case "plan_truncated":
            return PlanWarning(ts=ts, message=str(d.get("message", "")))
        case "spawn_rejected":
            return SpawnRejected(
                ts=ts,
                emitter=event.node_key,
                agent_id=_text(d.get("agent_id")),
                reason=str(d.get("reason", "")),
                detail=_text(d.get("detail")),
            )
        case "checkpoint_saved":
            key = _text(d.get("key")) or None  # a flush names no node
            return CheckpointSaved(ts=ts, what=_text(d.get("what")), node_id=key)
        case "checkpoint_failed":
            return CheckpointFailed(ts=ts, key=event.node_key, error=str(d.get("error", "")))
        case "checkpoint_reconciled":
            return CheckpointReconciled(ts=ts, key=event.node_key, error=str(d.get("error", "")))
        case "control_applied":
            count = _int(d.get("messages")) or 0
            return ControlApplied(
                ts=ts, verb=str(d.get("verb")), key=event.node_key, messages=count
            )
        case "admission_closed":
            return AdmissionClosed(ts=ts, reason=str(d.get("reason", "")))
        case "approval_decided":  # an approve/deny control took effect on the node
            verb = "approve" if d.get("verdict") == "approved" else "deny"
            return ControlApplied(ts=ts, verb=verb, key=event.node_key, messages=0)
    return _node(event, error, completed)


@dataclass(eq=False)
class EventStream:
    """One reader's buffer of a run's typed events; iterate it with ``async for``.

    Fed synchronously (:meth:`push`) by the run; ends once the run closed it and the
    buffer is drained. ``max_pending`` None keeps every event (what a run emits is
    bounded by its plan and spawn budget); a number keeps the newest that many.
    """

    max_pending: int | None = None
    _buffer: deque[RunEvent] = field(default_factory=deque, init=False, repr=False)
    _dropped: int = field(default=0, init=False)
    _closed: bool = field(default=False, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def push(self, event: RunEvent) -> None:
        """Buffer one event; never waits (the run calls this from its own loop)."""
        if self._closed:
            return
        if self.max_pending is not None and len(self._buffer) >= self.max_pending:
            self._buffer.popleft()
            self._dropped += 1
        self._buffer.append(event)
        self._wake.set()

    def close(self) -> None:
        """The run ended: the reader gets what is buffered, then the iteration ends."""
        self._closed = True
        self._wake.set()

    @property
    def closed(self) -> bool:
        """Whether the run ended (or the reader stopped)."""
        return self._closed

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> RunEvent:
        while True:
            if self._dropped:
                count, self._dropped = self._dropped, 0
                return EventsDropped(ts=self._buffer[0].ts if self._buffer else 0.0, count=count)
            if self._buffer:
                return self._buffer.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()

    async def aclose(self) -> None:
        """Stop reading early: what is buffered is dropped, later events are not kept."""
        self._buffer.clear()
        self.close()
