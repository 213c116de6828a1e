"""Live steering state shared by the control poller and the executor (D2, D3, CONTRACT §6).

It exists before the plan does, so controls sent while a flow is still planning
are honoured: a pause holds the first operation, a message reaches it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["STEER_CLOSE", "STEER_OPEN", "PauseGate", "SharedContext", "render_steer"]

STEER_OPEN = "[OPERATOR STEER]"
STEER_CLOSE = "[/OPERATOR STEER]"
_STEER_EXPLAIN = (
    "A human operator sent the corrections below while this flow was running. "
    "Take them into account before doing the task that follows; the most recent is last."
)


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def render_steer(messages: list[dict[str, Any]], instruction: str) -> str:
    """Prefix ``instruction`` with one steer block holding ``messages`` in stored order."""
    if not messages:
        return instruction
    lines = [f"- {_utc(float(m.get('ts', 0.0)))}: {m.get('text', '')}" for m in messages]
    return "\n".join([STEER_OPEN, _STEER_EXPLAIN, *lines, STEER_CLOSE, "", instruction])


class PauseGate:
    """An idempotent pause gate checked before an operation takes capacity (D2).

    ``pause`` installs a closed event only if none exists; ``resume`` opens and
    forgets it, so a later ``pause`` installs a fresh one.
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self.on_change: list[Callable[[bool], None]] = []

    @property
    def paused(self) -> bool:
        """True while the gate is closed."""
        return self._event is not None

    def pause(self) -> None:
        """Close the gate (no-op if already closed)."""
        if self._event is None:
            self._event = asyncio.Event()
            for callback in list(self.on_change):
                callback(True)

    def resume(self) -> None:
        """Open the gate (no-op if open)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()
            for callback in list(self.on_change):
                callback(False)

    async def wait_open(self, on_wait: Callable[[], None] | None = None) -> bool:
        """Wait until the gate is open; True if we had to wait."""
        waited = False
        while (event := self._event) is not None:
            if on_wait is not None and not waited:
                on_wait()
            waited = True
            await event.wait()
        return waited


class SharedContext:
    """The flow's shared context; ``content`` is what checkpoints persist as ``flow_context``."""

    def __init__(self, content: dict[str, Any] | None = None) -> None:
        self.content: dict[str, Any] = content if content is not None else {}

    @property
    def operator_messages(self) -> list[dict[str, Any]]:
        """The canonical queue of operator messages (applied, rendered or not)."""
        messages = self.content.setdefault("operator_messages", [])
        assert isinstance(messages, list)
        return messages

    def add_operator_message(self, text: str, *, ts: float, control_id: str | None) -> None:
        """Append one applied message; it waits for the next operation to render it."""
        self.operator_messages.append(
            {"ts": ts, "text": text, "control_id": control_id, "rendered_into_op": None}
        )

    def take_unrendered(self, op_key: str) -> list[dict[str, Any]]:
        """Claim every unrendered message for ``op_key``; each is rendered exactly once.

        Runs synchronously on the event loop, so two operations cannot claim the same entry.
        """
        taken = []
        for message in self.content.get("operator_messages", []):
            if message.get("rendered_into_op") is None:
                message["rendered_into_op"] = op_key
                taken.append(message)
        return taken
