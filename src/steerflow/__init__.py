"""steerflow: steerable, resumable LLM-agent flows.

What a library user needs, in one place::

    import asyncio
    from pathlib import Path

    import steerflow

    home = steerflow.resolve_home()  # --home, else STEERFLOW_HOME, else the default
    options = steerflow.FlowOptions(plan_path=Path("plan.yaml"), model="echo")
    result = asyncio.run(steerflow.run_flow(options, home=home))
    state, report = steerflow.load_checkpoint(result.run_dir)  # the run dir or its file

    seed = steerflow.prepare_resume(home, result.run_id)  # or FlowResumeError
    again = steerflow.FlowOptions(resume=seed)
    fork = asyncio.run(steerflow.resume_run(home, result.run_id, from_node="b",
                                            instruction="Then b, briefly."))  # rerun from b

    plan = steerflow.Plan(ops=[steerflow.Op("a", "Do a."), steerflow.Op("b", "Then b.",
                                                                       depends_on=["a"])])
    run = steerflow.FlowRun(steerflow.FlowOptions(plan=plan), home=home)
    events = run.events()  # typed, frozen events; the iteration ends with the run
    steerflow.pause(home, run_id)  # from anywhere: the control id (also resume/message/stop/budget)

Every error steerflow raises on purpose is a :class:`SteerflowError`; its
``exit_code`` is the CLI's (CONTRACT §3).

Only the error tree is imported eagerly. The run and checkpoint names are
imported on first access, so ``import steerflow.state`` (what ``steerflow ctl``
and the crash-test children load) does not pull in the whole orchestrator, and
no package below may import from this one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from steerflow.errors import (
    AmbiguousIdError,
    ArtifactContractError,
    ArtifactsUnsettledError,
    CheckpointRecoveryError,
    ControlNotApplyingError,
    DatabaseBusyError,
    ExitCode,
    FlowResumeError,
    FunctionNodeError,
    HomeRefusedError,
    InvalidValueError,
    KindNotAllowedError,
    LeaseLostError,
    NoResponseError,
    NotRunningError,
    PersistenceError,
    PlanValidationError,
    ProviderError,
    RefusedError,
    ResumeClaimedError,
    StateDBLostError,
    SteerflowError,
    UnknownIdError,
    UnsafePathError,
    UsageError,
)

if TYPE_CHECKING:
    from steerflow.checkpoint import CheckpointWriter, load_checkpoint
    from steerflow.executor import EventBus, FlowEvent
    from steerflow.home import resolve_home
    from steerflow.orchestrate import (
        AdmissionClosed,
        ApprovalRequested,
        CheckpointFailed,
        CheckpointReconciled,
        CheckpointSaved,
        ControlApplied,
        EventsDropped,
        EventStream,
        FlowOptions,
        FlowResult,
        FlowRun,
        ModelStep,
        NodeCompleted,
        NodeFailed,
        NodeOutcome,
        NodePaused,
        NodeReplayed,
        NodeSkipped,
        NodeStarted,
        NodeWithheld,
        PlanReady,
        PlanWarning,
        ResumeSeed,
        RunEvent,
        SpawnAccepted,
        SpawnRejected,
        ToolCallEnded,
        ToolCallStarted,
        prepare_resume,
        resume_run,
        run_flow,
    )
    from steerflow.plan import Edge, Loop, Op, Plan, Role, Synthesis
    from steerflow.providers import DependencyResult, NodeCall, Price
    from steerflow.views import approve, budget, deny, message, pause, resume, stop

__all__ = [
    "AdmissionClosed",
    "AmbiguousIdError",
    "ApprovalRequested",
    "ArtifactContractError",
    "ArtifactsUnsettledError",
    "CheckpointFailed",
    "CheckpointReconciled",
    "CheckpointRecoveryError",
    "CheckpointSaved",
    "CheckpointWriter",
    "ControlApplied",
    "ControlNotApplyingError",
    "DatabaseBusyError",
    "DependencyResult",
    "Edge",
    "EventBus",
    "EventStream",
    "EventsDropped",
    "ExitCode",
    "FlowEvent",
    "FlowOptions",
    "FlowResult",
    "FlowResumeError",
    "FlowRun",
    "FunctionNodeError",
    "HomeRefusedError",
    "InvalidValueError",
    "KindNotAllowedError",
    "LeaseLostError",
    "Loop",
    "ModelStep",
    "NoResponseError",
    "NodeCall",
    "NodeCompleted",
    "NodeFailed",
    "NodeOutcome",
    "NodePaused",
    "NodeReplayed",
    "NodeSkipped",
    "NodeStarted",
    "NodeWithheld",
    "NotRunningError",
    "Op",
    "PersistenceError",
    "Plan",
    "PlanReady",
    "PlanValidationError",
    "PlanWarning",
    "Price",
    "ProviderError",
    "RefusedError",
    "ResumeClaimedError",
    "ResumeSeed",
    "Role",
    "RunEvent",
    "SpawnAccepted",
    "SpawnRejected",
    "StateDBLostError",
    "SteerflowError",
    "Synthesis",
    "ToolCallEnded",
    "ToolCallStarted",
    "UnknownIdError",
    "UnsafePathError",
    "UsageError",
    "__version__",
    "approve",
    "budget",
    "deny",
    "load_checkpoint",
    "message",
    "pause",
    "prepare_resume",
    "resolve_home",
    "resume",
    "resume_run",
    "run_flow",
    "stop",
]

__version__ = "0.1.0"

# Where each lazily imported name lives (its public package, never a private module).
_LAZY = {
    "CheckpointWriter": "steerflow.checkpoint",
    "load_checkpoint": "steerflow.checkpoint",
    "EventBus": "steerflow.executor",
    "FlowEvent": "steerflow.executor",
    "resolve_home": "steerflow.home",
    "Edge": "steerflow.plan",
    "Loop": "steerflow.plan",
    "Op": "steerflow.plan",
    "Plan": "steerflow.plan",
    "Role": "steerflow.plan",
    "Synthesis": "steerflow.plan",
    "FlowOptions": "steerflow.orchestrate",
    "FlowResult": "steerflow.orchestrate",
    "FlowRun": "steerflow.orchestrate",
    "ResumeSeed": "steerflow.orchestrate",
    "prepare_resume": "steerflow.orchestrate",
    "resume_run": "steerflow.orchestrate",
    "run_flow": "steerflow.orchestrate",
    "DependencyResult": "steerflow.providers",
    "NodeCall": "steerflow.providers",
    "Price": "steerflow.providers",
    "AdmissionClosed": "steerflow.orchestrate",
    "CheckpointFailed": "steerflow.orchestrate",
    "CheckpointReconciled": "steerflow.orchestrate",
    "CheckpointSaved": "steerflow.orchestrate",
    "ControlApplied": "steerflow.orchestrate",
    "EventStream": "steerflow.orchestrate",
    "EventsDropped": "steerflow.orchestrate",
    "NodeOutcome": "steerflow.orchestrate",
    "NodeCompleted": "steerflow.orchestrate",
    "NodeFailed": "steerflow.orchestrate",
    "NodePaused": "steerflow.orchestrate",
    "NodeReplayed": "steerflow.orchestrate",
    "NodeSkipped": "steerflow.orchestrate",
    "NodeStarted": "steerflow.orchestrate",
    "NodeWithheld": "steerflow.orchestrate",
    "PlanReady": "steerflow.orchestrate",
    "PlanWarning": "steerflow.orchestrate",
    "RunEvent": "steerflow.orchestrate",
    "SpawnAccepted": "steerflow.orchestrate",
    "SpawnRejected": "steerflow.orchestrate",
    "ModelStep": "steerflow.orchestrate",
    "ToolCallEnded": "steerflow.orchestrate",
    "ToolCallStarted": "steerflow.orchestrate",
    "message": "steerflow.views",
    "pause": "steerflow.views",
    "resume": "steerflow.views",
    "stop": "steerflow.views",
    "budget": "steerflow.views",
    "approve": "steerflow.views",
    "deny": "steerflow.views",
    "ApprovalRequested": "steerflow.orchestrate",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'steerflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
