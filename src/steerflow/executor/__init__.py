"""The dependency-aware executor, its graph, event stream and steering state."""

from __future__ import annotations

from steerflow.executor._approvals import ApprovalDesk, Decision
from steerflow.executor._budget import (
    BUDGET_REASON,
    FLAG_NAMES,
    PARAMETER_NAMES,
    CapNames,
    Caps,
    InFlightDoubt,
    Meter,
    enforceable,
    unenforceable,
)
from steerflow.executor._events import EventBus, EventType, FlowEvent, step_event
from steerflow.executor._fence import AdmissionFence
from steerflow.executor._graph import (
    TERMINAL,
    Edge,
    Graph,
    NodeKind,
    NodeStatus,
    Operation,
    build_graph,
)
from steerflow.executor._intent import CallIntent, IntentHook
from steerflow.executor._loops import LOOP_MEMBER, LoopRunner, import_until
from steerflow.executor._scheduler import (
    CLI_DEFAULT_MAX_SPAWN,
    LIBRARY_DEFAULT_MAX_SPAWN,
    FlowExecutor,
    SpawnRejection,
)
from steerflow.executor._scope import CallScope
from steerflow.executor._steer import (
    STEER_CLOSE,
    STEER_OPEN,
    PauseGate,
    SharedContext,
    Steering,
    render_steer,
)

__all__ = [
    "BUDGET_REASON",
    "CLI_DEFAULT_MAX_SPAWN",
    "FLAG_NAMES",
    "LIBRARY_DEFAULT_MAX_SPAWN",
    "LOOP_MEMBER",
    "PARAMETER_NAMES",
    "STEER_CLOSE",
    "STEER_OPEN",
    "TERMINAL",
    "AdmissionFence",
    "ApprovalDesk",
    "CallIntent",
    "CallScope",
    "CapNames",
    "Caps",
    "Decision",
    "Edge",
    "EventBus",
    "EventType",
    "FlowEvent",
    "FlowExecutor",
    "Graph",
    "InFlightDoubt",
    "IntentHook",
    "LoopRunner",
    "Meter",
    "NodeKind",
    "NodeStatus",
    "Operation",
    "PauseGate",
    "SharedContext",
    "SpawnRejection",
    "Steering",
    "build_graph",
    "enforceable",
    "import_until",
    "render_steer",
    "step_event",
    "unenforceable",
]
