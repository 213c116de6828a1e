"""The run's side of a tool node's loop: the gate, messages, budget and intent per step.

``tools.ToolLoop`` asks these hooks before each model request and each tool call
(issue 39 item 4): a pause holds the loop at its next step; ``ctl stop``, the deadline,
a closed budget or a lost lease end it between steps (the node stays pending and a
resume continues from its recorded steps); operator messages reach the next model
request, at most once; every request gets its write-ahead intent like a node's call.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from steerflow._usage import Usage
from steerflow.errors import ProviderError
from steerflow.executor._approvals import ApprovalDesk, ApprovalHeld
from steerflow.executor._budget import BUDGET_REASON, Meter
from steerflow.executor._fence import AdmissionFence
from steerflow.executor._graph import Operation
from steerflow.executor._intent import CallIntent, IntentHook, StepRecorder
from steerflow.executor._steer import PauseGate, SharedContext, render_steer
from steerflow.tools._loop import OP_APPROVAL, Admitted, LoopHeld, denied_text, new_request_id

__all__ = ["NodeSteps"]


class _Run(Protocol):
    """What the hooks read of the executor (``FlowExecutor``)."""

    admission_open: bool
    admission_reason: str | None
    gate: PauseGate
    context: SharedContext
    meter: Meter | None
    fence: AdmissionFence | None
    before_call: IntentHook | None
    on_step: StepRecorder | None
    approvals: ApprovalDesk

    def close_admission(self, reason: str) -> None: ...

    def emit_paused(self, op: Operation) -> None: ...

    def emit_step(self, op: Operation, entry: dict[str, Any]) -> None: ...

    def emit_approval(self, op: Operation, kind: str, data: Mapping[str, Any]) -> None: ...


class NodeSteps:
    """:class:`tools.StepHooks` for one operation of one executor."""

    def __init__(self, executor: _Run, op: Operation) -> None:
        self.executor, self.op = executor, op
        self._claimed: dict[str, list[dict[str, Any]]] = {}
        self._first = True  # the node's admission already reserved its first request

    def _held(self) -> LoopHeld | None:
        ex = self.executor
        if not ex.admission_open:
            return LoopHeld(ex.admission_reason or "admission closed")
        return None

    def check_between(self) -> None:
        """Raise :class:`LoopHeld` once admission closed (stop, deadline, budget, lease)."""
        held = self._held()
        if held is not None:
            raise held

    async def admit_request(self, step: int) -> Admitted:
        """Pause gate, stop and budget checks, then the write-ahead intent; the messages."""
        ex, op = self.executor, self.op
        await ex.gate.wait_open(lambda: ex.emit_paused(op))
        self.check_between()
        meter = ex.meter
        if meter is not None and not self._first:
            if not meter.room():
                ex.close_admission(BUDGET_REASON)
                self.check_between()
            meter.reserve(op.node_id)
        self._first = False
        call_id = CallIntent.of(op, step).call_id
        if ex.before_call is not None:
            reservation = meter.reservation() if meter is not None else (None, None)
            intent = CallIntent.of(op, step, reservation)
            call_id = intent.call_id
            fence = ex.fence
            if fence is not None and not fence.fresh() and not await fence.hold():
                raise LoopHeld("lease")
            if not await ex.before_call(op, intent):
                raise LoopHeld("lease")
        steers = ex.context.take_unrendered(op.key)
        self._claimed[call_id] = steers
        messages: tuple[dict[str, str], ...] = ()
        if steers:
            ids = ",".join(str(m.get("control_id")) for m in steers)
            messages = ({"control_id": ids, "text": render_steer(steers, "").strip()},)
        return Admitted(call_id, messages)

    def delivered(self, admitted: Admitted) -> None:
        """The request left with its messages: they count as delivered (at most once)."""
        self.executor.context.mark_delivered(self._claimed.pop(admitted.call_id, []))

    def charge(self, usage: Usage | None) -> Usage | None:
        """Price the reply and count it (its reservation ends here)."""
        meter, op = self.executor.meter, self.op
        if meter is None:
            return usage
        return meter.charge(op.model, usage, op.node_id)

    async def record(self, entry: dict[str, Any]) -> None:
        """Journal the step (acknowledged) before the loop goes on."""
        record = self.executor.on_step
        if record is not None and not await record(self.op, entry):
            raise LoopHeld("checkpoint")
        self.executor.emit_step(self.op, entry)
        if entry["type"] == "approval" and entry["status"] != "awaiting":
            data = entry["data"]
            await self.executor.approvals.journaled(str(data["request_id"]), data.get("control_id"))
            self.executor.emit_approval(self.op, "approval_decided", data)

    async def await_approval(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Wait for the operator's decision on a journaled request (issue 41)."""
        ex, op = self.executor, self.op
        await ex.approvals.register(request, op.key)
        ex.emit_approval(op, "approval_requested", request)
        try:
            decision = await ex.approvals.wait(request, op.key)
        except ApprovalHeld as held:
            raise LoopHeld(held.reason) from None
        return decision.to_json()

    async def approve_instruction(
        self, prior: Sequence[Mapping[str, Any]], record: str, key: str
    ) -> tuple[dict[str, Any], ...]:
        """An op's own approval (``approval: required``) before its call; its steps.

        Raises:
            LoopHeld: admission closed while it waited (the node stays pending).
            ProviderError: the operator denied it (the node fails with the reason).
        """
        done = [dict(s) for s in prior if s["type"] == "approval" and s["call_id"] == OP_APPROVAL]
        last = done[-1] if done else None
        if last is None or last["status"] == "awaiting":
            op = self.op
            request = dict(last["data"]) if last is not None else _op_request(op)
            entry = {"node": op.key, "record": record, "key": key, "index": 1,
                     "type": "approval", "call_id": OP_APPROVAL}  # fmt: skip
            if last is None:
                await self.record({**entry, "status": "awaiting", "data": request})
            decision = await self.await_approval(request)
            data = {**request, **decision, "decided_at": time.time()}
            last = {**entry, "status": str(decision["verdict"]), "data": data}
            await self.record(last)
        if last["status"] == "denied":
            raise ProviderError(denied_text(last["data"]).replace("call", "node's call", 1))
        return (last,)


def _op_request(op: Operation) -> dict[str, Any]:
    """A node's own approval request: its rendered instruction is what is approved."""
    instruction = op.rendered_instruction or op.instruction
    return {"request_id": new_request_id(), "tool": None, "args": {"instruction": instruction},
            "text": "", "requested_at": time.time()}  # fmt: skip
