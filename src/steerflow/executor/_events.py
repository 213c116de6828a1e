"""The event stream: what the terminal progress, tests and the Studio consume."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["EventBus", "EventType", "FlowEvent", "step_event"]

#: Events an :class:`EventBus` remembers by default: plenty for a test or a debugger to
#: read back, a fixed cost however many nodes a run has (decision 64).
HISTORY_LIMIT = 1000

EventType = Literal[
    "plan_ready",
    "plan_truncated",
    "node_started",
    "node_completed",
    "node_failed",
    "node_skipped",
    "node_replayed",
    "node_withheld",
    "node_spawned",
    "node_paused",
    "spawn_rejected",
    "checkpoint_saved",
    "checkpoint_failed",
    "checkpoint_reconciled",
    "control_applied",
    "admission_closed",
    # a tool node's loop, step by step (issue 39 item 6)
    "model_step",
    "tool_call_started",
    "tool_call_ended",
    # a node waits for an operator's approval, and got it (issue 41)
    "approval_requested",
    "approval_decided",
]


@dataclass(frozen=True)
class FlowEvent:
    """One thing that happened in a flow."""

    type: EventType
    node_key: str | None = None
    node_id: str | None = None
    data: dict[str, object] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)


def step_event(entry: Mapping[str, Any]) -> tuple[EventType, dict[str, object]] | None:
    """The event saying one journaled tool-loop step (a model reply, a tool call).

    A flow's tool node and an agent's tool turn say their steps alike, so a reader (the
    tracer, the live stream) sees one shape. ``None`` for an approval step: a flow says
    those with its approval events, and an agent takes none.
    """
    if entry["type"] == "approval":
        return None
    data = entry["data"]
    out: dict[str, object] = {"index": entry["index"], "status": entry["status"]}
    if entry["type"] == "model":
        calls = data.get("tool_calls") or ()
        out.update(tool_calls=[c["name"] for c in calls], usage=data.get("usage"))
        return "model_step", out
    out.update(call_id=entry["call_id"], tool=data.get("tool"), args=data.get("args"))
    return ("tool_call_started" if entry["status"] == "in_flight" else "tool_call_ended"), out


class EventBus:
    """Synchronous fan-out to subscribers; a subscriber must not block.

    The bus keeps only the last ``history_limit`` events (0: none): subscribers are how
    a consumer sees every event, and a 10,000-node run emits tens of thousands.
    """

    def __init__(self, *, history_limit: int = HISTORY_LIMIT) -> None:
        self._subscribers: list[Callable[[FlowEvent], None]] = []
        self._recent: deque[FlowEvent] = deque(maxlen=max(0, history_limit))

    @property
    def history(self) -> list[FlowEvent]:
        """The most recent events (at most ``history_limit``), oldest first."""
        return list(self._recent)

    def subscribe(self, callback: Callable[[FlowEvent], None]) -> None:
        """Call ``callback`` for every later event."""
        self._subscribers.append(callback)

    def emit(self, event: FlowEvent) -> None:
        """Deliver one event to every subscriber, in subscription order."""
        self._recent.append(event)
        for callback in list(self._subscribers):
            callback(event)
