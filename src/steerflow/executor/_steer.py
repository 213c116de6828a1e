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
    lines = [_bullet(m) for m in messages]
    return "\n".join([STEER_OPEN, _STEER_EXPLAIN, *lines, STEER_CLOSE, "", instruction])


def _bullet(message: dict[str, Any]) -> str:
    """One bullet per message; its further lines are indented under it, so a message can
    neither add a bullet of its own nor close the block early."""
    first, *rest = str(message.get("text", "")).splitlines() or [""]
    head = f"- {_utc(float(message.get('ts', 0.0)))}: {first}"
    return "\n".join([head, *(f"  {line}" for line in rest)])


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
        #: Called with the messages an operation's provider call was just invoked with.
        self.on_delivered: list[Callable[[list[dict[str, Any]]], None]] = []

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
        A dropped message (see :meth:`drop_unrendered`) is never claimed.
        """
        taken = []
        for message in self.content.get("operator_messages", []):
            if message.get("rendered_into_op") is None and "dropped" not in message:
                message["rendered_into_op"] = op_key
                taken.append(message)
        return taken

    def release(self, messages: list[dict[str, Any]]) -> None:
        """Give back messages claimed by an operation that was never invoked with them."""
        for message in messages:
            message["rendered_into_op"] = None

    def mark_delivered(self, messages: list[dict[str, Any]]) -> None:
        """Report that a provider call was invoked with ``messages`` (decision 36)."""
        if messages:
            for callback in list(self.on_delivered):
                callback(messages)

    def drop_unrendered(self, reason: str) -> None:
        """Mark every unclaimed message as never to be rendered (a resume inherits them).

        Their rows belong to the run that received them, which stamped them
        ``rejected:no-pending-ops`` (or left them ``applying`` when it died): rendering
        them here would contradict that stamp.
        """
        for message in self.content.get("operator_messages", []):
            if message.get("rendered_into_op") is None:
                message.setdefault("dropped", reason)
