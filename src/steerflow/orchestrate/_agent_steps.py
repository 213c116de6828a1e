"""An ``agent --tool`` turn's side of the tool loop: stop, budget and intent per step.

An agent takes operator messages between turns (they start the next one), so a turn's
loop gets none mid-turn; what it does share with a flow's tool node (issue 39 item 4):
``ctl stop``, a signal, the deadline or a lost lease end it between steps (the turn
reruns from its recorded steps on resume), the budget is checked before every model
request after the first, and each request's write-ahead intent is durable before it
leaves (decision 217).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from steerflow.tools._loop import Admitted, LoopHeld

if TYPE_CHECKING:
    from steerflow._usage import Usage
    from steerflow.checkpoint import CheckpointWriter
    from steerflow.executor import Meter
    from steerflow.orchestrate._lease import LeaseLoss

__all__ = ["AgentSteps"]


class _Agent(Protocol):
    """What the hooks read of the agent run (``AgentRun``)."""

    model: str
    meter: Meter
    budget_hit: bool
    stopped_by: dict[str, Any] | None
    stop_signal: int | None
    deadline_hit: bool
    lease_loss: LeaseLoss | None

    def trace_request(self, key: str, call_id: str, step: int, started_at: float) -> None:
        """A model request of the turn's loop leaves (its traces, issue 45)."""

    def trace_step(self, key: str, entry: Mapping[str, Any]) -> None:
        """One step of the turn's loop is on record (its traces, issue 45)."""


class AgentSteps:
    """:class:`tools.StepHooks` for one turn of an :class:`AgentRun`."""

    def __init__(self, run: _Agent, writer: CheckpointWriter, key: str) -> None:
        self.run, self.writer, self.key = run, writer, key

    def check_between(self) -> None:
        """Raise :class:`LoopHeld` once the agent is ending (stop, signal, deadline, lease)."""
        run = self.run
        if run.stopped_by is not None:
            raise LoopHeld("stop")
        if run.stop_signal is not None:
            raise LoopHeld("signal")
        if run.deadline_hit:
            raise LoopHeld("deadline")
        if run.lease_loss is not None:
            raise LoopHeld(run.lease_loss.reason)

    async def admit_request(self, step: int) -> Admitted:
        """The stop and budget checks, then the request's write-ahead intent."""
        self.check_between()
        meter = self.run.meter
        if step > 1 and not meter.room():
            self.run.budget_hit = True
            raise LoopHeld("budget")
        call_id, started = uuid.uuid4().hex, time.time()
        cost, tokens = meter.reservation()
        await self.writer.record_call(
            call_id, node=self.key, record="op", key=self.key, attempt=step,
            model=self.run.model, started_at=started, reserved_cost_usd=cost,
            reserved_tokens=tokens,
        )  # fmt: skip
        self.run.trace_request(self.key, call_id, step, started)
        return Admitted(call_id)

    def delivered(self, admitted: Admitted) -> None:
        """Nothing to mark: an agent's messages start its next turn, not a step."""

    def charge(self, usage: Usage | None) -> Usage | None:
        """Price one reply and count it in the chain's spend."""
        return self.run.meter.charge(self.run.model, usage)

    async def record(self, entry: dict[str, Any]) -> None:
        """Journal the step (acknowledged) before the loop goes on."""
        if not await self.writer.record_step(entry):
            raise LoopHeld("checkpoint")
        self.run.trace_step(self.key, entry)

    async def await_approval(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Never asked: an agent's tools need no approval (approvals are flow nodes')."""
        raise LoopHeld("approvals are not supported in an agent's loop")
