"""The vocabularies of steerflow's live state, defined once for every layer.

The state tables CHECK these values; the executor, the control poller and the
orchestrator import them from here instead of spelling their own Literals.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ControlVerb",
    "InvocationKind",
    "NodeKind",
    "NodeStatus",
    "Phase",
    "SessionStatus",
    "TargetVia",
]

SessionStatus = Literal[
    "running", "completed", "failed", "timed_out", "interrupted", "stopped", "budget_exhausted"
]
"""Stored status of a session (and of an invocation)."""

Phase = Literal["planning", "executing", "paused"]
"""Where a running flow is: still planning, executing nodes, or paused by an operator."""

InvocationKind = Literal["flow", "play", "agent"]
"""Kind of a session or an invocation."""

ControlVerb = Literal["pause", "resume", "message", "stop", "budget", "approve", "deny"]
"""Verbs the ``session_controls`` CHECK accepts."""

NodeKind = Literal["planned", "spawned"]
"""A node from the plan, or one spawned at run time by a reactive node."""

TargetVia = Literal["session", "invocation", "play"]
"""Which table a ``ctl`` target matched."""

NodeStatus = Literal[
    "pending", "running", "paused", "awaiting_approval", "completed", "failed", "skipped"
]
"""Live status of one node as published by the flow process."""
