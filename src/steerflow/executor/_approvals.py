"""The run's approval desk: requests that wait, and the operator decisions they get (issue 41).

A tool loop (or an op with ``approval: required``) journals its request, then waits here.
The control poller hands each ``approve``/``deny`` row to :meth:`ApprovalDesk.decide`:
the first decision of a request is taken (its row stamped ``applied`` only once the
decision is journaled, :attr:`ApprovalDesk.on_journaled`), any later one is rejected
naming the first. A decision for a request the run knows from its checkpoint but has not
reached yet (a resume still replaying) is kept until the loop asks for it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TIMEOUT_SENDER", "ApprovalDesk", "ApprovalHeld", "Decision"]

#: ``sender`` of a denial the approval timeout made (no operator decided).
TIMEOUT_SENDER = "timeout"


@dataclass(frozen=True)
class Decision:
    """One operator decision: ``approved`` or ``denied``, by which control and sender."""

    verdict: str
    control_id: str | None
    sender: str | None
    edited_args: dict[str, Any] | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What the approval step's ended record adds to the request."""
        return {
            "verdict": self.verdict,
            "control_id": self.control_id,
            "sender": self.sender,
            "edited_args": self.edited_args,
            "reason": self.reason,
        }


class ApprovalHeld(Exception):  # noqa: N818 - a wait ended by a stop, not an error
    """A wait for a decision ended because admission closed; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ApprovalDesk:
    """Every request of the run that waits, and what was decided (one per request)."""

    #: Requests recorded and not decided, by id: what ``approvals`` lists (published).
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Writes :attr:`pending` where other processes read it (the session's metadata);
    #: awaited before a request is shown waiting, so a reader told of the request can
    #: decide it at once. None: not published (a bare executor).
    publish: Callable[[dict[str, dict[str, Any]]], Awaitable[None]] | None = None
    #: Called with a decision's control id once its journal record is durable.
    on_journaled: list[Callable[[str], None]] = field(default_factory=list)
    #: Seconds an undecided request waits before it is denied (``--approval-timeout``).
    timeout_s: float | None = None
    _decided: dict[str, Decision] = field(default_factory=dict)
    _early: dict[str, Decision] = field(default_factory=dict)
    _waits: dict[str, asyncio.Future[Decision]] = field(default_factory=dict)
    _closed: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def know(self, request: Mapping[str, Any], node: str) -> None:
        """A request the checkpoint holds undecided: decisions for it are kept for the loop."""
        self.pending[str(request["request_id"])] = {**request, "node": node}

    async def register(self, request: Mapping[str, Any], node: str) -> None:
        """``request`` (already journaled) waits from now on: published before it returns."""
        self.know(request, node)
        await self.sync()

    async def sync(self) -> None:
        """Publish what waits now (the latest state, in order, one write at a time)."""
        if self.publish is None:
            return
        async with self._lock:
            await self.publish(dict(self.pending))

    def decide(self, verb: str, request_id: str, payload: Mapping[str, Any], *,
               control_id: str, sender: str | None) -> str | None:  # fmt: skip
        """Apply one ``approve``/``deny`` row; the result to stamp, or None (stamped later).

        ``None``: taken, and stamped ``applied`` once its journal record is durable.
        """
        first = self._decided.get(request_id)
        if first is not None:
            return f"rejected:already-decided:{first.verdict}:{first.control_id or first.sender}"
        if request_id not in self.pending:
            return "rejected:unknown-request"
        edited = payload.get("args") if verb == "approve" else None
        if edited is not None and not isinstance(edited, dict):
            return "rejected:invalid-args"
        reason = payload.get("reason") if verb == "deny" else None
        decision = Decision(
            "approved" if verb == "approve" else "denied",
            control_id,
            sender,
            edited_args=edited,
            reason=str(reason) if reason is not None else None,
        )
        self._decided[request_id] = decision
        wait = self._waits.get(request_id)
        if wait is not None and not wait.done():
            wait.set_result(decision)
        else:
            self._early[request_id] = decision
        return None

    async def wait(self, request: Mapping[str, Any], node: str) -> Decision:
        """Wait for ``request``'s decision (:meth:`register` first); ``ApprovalHeld`` on a stop.

        The approval timeout counts from the request's recorded time, so a resume does
        not start it again.
        """
        request_id = str(request["request_id"])
        early = self._early.pop(request_id, None)
        if early is not None:
            return early
        if self._closed is not None:
            raise ApprovalHeld(self._closed)
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waits[request_id] = future
        try:
            return await asyncio.wait_for(future, self._left(request))
        except TimeoutError:
            return self._timed_out(request_id)
        finally:
            self._waits.pop(request_id, None)

    def waiting(self, request_id: str) -> bool:
        """Whether a :meth:`wait` for ``request_id`` is under way now."""
        return request_id in self._waits

    async def journaled(self, request_id: str, control_id: str | None) -> None:
        """The decision's record is durable: the request no longer waits; stamp its row."""
        self.pending.pop(request_id, None)
        await self.sync()
        if control_id is not None:
            for callback in list(self.on_journaled):
                callback(control_id)

    def close(self, reason: str) -> None:
        """Admission closed (stop, deadline, budget, lease): every wait ends, held."""
        self._closed = reason
        for future in self._waits.values():
            if not future.done():
                future.set_exception(ApprovalHeld(reason))

    def _left(self, request: Mapping[str, Any]) -> float | None:
        if self.timeout_s is None:
            return None
        since = request.get("requested_at")
        start = float(since) if isinstance(since, int | float) else time.time()
        left = start + self.timeout_s - time.time()
        return max(0.0, left) if math.isfinite(left) else None

    def _timed_out(self, request_id: str) -> Decision:
        reason = f"no decision within {self.timeout_s:g} s (approval timeout)"
        decision = Decision("denied", None, TIMEOUT_SENDER, reason=reason)
        self._decided[request_id] = decision
        return decision
