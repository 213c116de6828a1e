"""The event stream: what the terminal progress, tests and the Studio consume."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["EventBus", "EventType", "FlowEvent"]

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
]


@dataclass(frozen=True)
class FlowEvent:
    """One thing that happened in a flow."""

    type: EventType
    node_key: str | None = None
    node_id: str | None = None
    data: dict[str, object] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)


class EventBus:
    """Synchronous fan-out to subscribers; a subscriber must not block."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[[FlowEvent], None]] = []
        self.history: list[FlowEvent] = []

    def subscribe(self, callback: Callable[[FlowEvent], None]) -> None:
        """Call ``callback`` for every later event."""
        self._subscribers.append(callback)

    def emit(self, event: FlowEvent) -> None:
        """Deliver one event to every subscriber, in subscription order."""
        self.history.append(event)
        for callback in list(self._subscribers):
            callback(event)
