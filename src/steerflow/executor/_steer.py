"""Live steering state shared by the control poller and the executor (D2, D3, CONTRACT §6).

It exists before the plan does, so controls sent while a flow is still planning
are honoured: a pause holds the first operation, a message reaches it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from steerflow.control import SteeringTarget
from steerflow.executor._approvals import ApprovalDesk

__all__ = [
    "STEER_CLOSE",
    "STEER_OPEN",
    "PauseGate",
    "SharedContext",
    "Steering",
    "render_steer",
]

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
    """One bullet per message, its further lines indented under it.

    So a message can neither add a bullet of its own nor close the block early.
    """
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


class Steering(SteeringTarget):
    """The one owner of a run's live steering state: what the control poller may touch.

    It holds the pause gate and the shared context from before the plan exists, and
    answers whether an operation is still to start: while planning the first one is
    (until the run finishes), and once :meth:`attach` hands it the executor's probe,
    the executor answers. It never writes ``sessions.phase``: the poller alone does.

    Args:
        context: The shared context (a resume seeds it from the checkpoint).
    """

    def __init__(self, context: SharedContext | None = None) -> None:
        self.gate = PauseGate()
        self.context = context if context is not None else SharedContext()
        self.finished = False
        self._pending: Callable[[], bool] | None = None
        #: What ``ctl stop`` does to the run (set by the runner); ``None``: not stoppable.
        self.on_stop: Callable[[bool, str | None, str], None] | None = None
        #: ``(verb, control_id)`` after the poller applied a pause, resume or stop (the
        #: control id is the stop's; the target interface gives pause and resume none).
        self.on_applied: list[Callable[[str, str | None], None]] = []
        #: What ``ctl budget`` does (set by the runner): new caps in, the result out.
        self.on_budget: Callable[[float | None, int | None], str] | None = None
        #: The run's approval requests and decisions (issue 41); the executor shares it.
        self.approvals = ApprovalDesk()

    def attach(self, pending: Callable[[], bool]) -> None:
        """Hand over to the executor: from now on ``pending`` says whether an operation waits."""
        self._pending = pending

    def finish(self) -> None:
        """The run is over: no operation will start any more."""
        self.finished = True

    def pause(self) -> None:
        """Close the pause gate (idempotent)."""
        self.gate.pause()
        self._applied("pause", None)

    def resume(self) -> None:
        """Open the pause gate (idempotent)."""
        self.gate.resume()
        self._applied("resume", None)

    def stop(self, *, now: bool, reason: str | None, control_id: str) -> None:
        """``ctl stop``: the runner closes admission; then the pause (if any) ends."""
        if self.on_stop is None:
            raise NotImplementedError
        # Before the stop acts, so a reader sees the control, then admission closing.
        self._applied("stop", control_id)
        self.on_stop(now, reason, control_id)
        # After admission closed: a waiter the gate releases sees it closed and stays pending.
        self.gate.resume()

    def _applied(self, verb: str, control_id: str | None) -> None:
        for callback in list(self.on_applied):
            callback(verb, control_id)

    def set_budget(self, *, max_cost: float | None, max_tokens: int | None) -> str:
        """``ctl budget``: the runner changes its meter's caps."""
        if self.on_budget is None:
            raise NotImplementedError
        return self.on_budget(max_cost, max_tokens)

    def decide_approval(
        self, verb: str, payload: dict[str, Any], *, control_id: str, sender: str | None
    ) -> str | None:
        """``ctl approve``/``ctl deny``: the desk takes it, or says why not."""
        request_id = payload.get("request_id")
        if not isinstance(request_id, str):
            return "rejected:unknown-request"
        return self.approvals.decide(
            verb, request_id, payload, control_id=control_id, sender=sender
        )

    def has_pending_operation(self) -> bool:
        """True if an operation has not started yet (or the plan is still being made)."""
        if self._pending is not None:
            return self._pending()
        return not self.finished

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        """Append one message to the shared context's operator messages."""
        self.context.add_operator_message(text, ts=ts, control_id=control_id)

    def is_paused(self) -> bool:
        """Whether the gate is closed."""
        return self.gate.paused

    def defers_message_stamp(self) -> bool:
        """Always: ``applied`` once an operation is invoked with the message (decision 36)."""
        return True
