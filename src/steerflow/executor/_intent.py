"""A call about to leave the process: what its write-ahead intent records (decision 217)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from steerflow.executor._graph import Operation

__all__ = ["CallIntent", "IntentHook", "StepRecorder"]


@dataclass(frozen=True)
class CallIntent:
    """One call's intent: the node, which attempt, its model and its reservation.

    ``record``/``key`` name the checkpoint entry whose outcome closes it (``op`` and the
    agent id for a planned node, ``spawn`` and the node id for a spawned one).
    """

    node: str
    record: str
    key: str
    attempt: int
    model: str | None
    reserved_cost_usd: float | None
    reserved_tokens: int | None
    started_at: float = field(default_factory=time.time)
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def of(
        cls,
        op: Operation,
        attempt: int,
        reservation: tuple[float | None, int | None] = (None, None),
    ) -> CallIntent:
        """The intent of ``op``'s next call (its model already resolved)."""
        planned = op.kind == "planned"
        return cls(
            node=op.key,
            record="op" if planned else "spawn",
            key=op.key if planned else op.node_id,
            attempt=attempt,
            model=op.model,
            reserved_cost_usd=reservation[0],
            reserved_tokens=reservation[1],
        )


#: Records an intent durably before its call is sent; False: the call must not be sent
#: (the run's lease is gone, or the checkpoint could not hold the intent).
IntentHook = Callable[[Operation, CallIntent], Awaitable[bool]]

#: Journals one step of a tool node's loop and waits for its acknowledgement (issue 39);
#: False: nothing more can be recorded, so the loop stops before its next step.
StepRecorder = Callable[[Operation, dict[str, Any]], Awaitable[bool]]
