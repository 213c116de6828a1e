"""Running a flow end to end: the library API behind ``flow``, ``play`` and ``resume``.

Names are imported on first access: ``show RUN NODE`` and ``result`` import only the
readers (``_detail``), not the runner and the executor behind it, which saves a tenth
of their start-up on every call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steerflow.orchestrate._detail import node_detail, read_run, result_of, run_result
    from steerflow.orchestrate._graphview import graph_text
    from steerflow.orchestrate._options import FlowOptions, FlowResult, ResumeSeed
    from steerflow.orchestrate._outcome import NodeOutcome
    from steerflow.orchestrate._resume import load_branch, prepare_resume
    from steerflow.orchestrate._resume_run import resume_run
    from steerflow.orchestrate._run import FlowRun, run_flow
    from steerflow.orchestrate._stream import (
        AdmissionClosed,
        ApprovalRequested,
        CheckpointFailed,
        CheckpointReconciled,
        CheckpointSaved,
        ControlApplied,
        EventsDropped,
        EventStream,
        ModelStep,
        NodeCompleted,
        NodeFailed,
        NodePaused,
        NodeReplayed,
        NodeSkipped,
        NodeStarted,
        NodeWithheld,
        PlanReady,
        PlanWarning,
        RunEvent,
        SpawnAccepted,
        SpawnRejected,
        ToolCallEnded,
        ToolCallStarted,
    )

__all__ = [
    "AdmissionClosed",
    "ApprovalRequested",
    "CheckpointFailed",
    "CheckpointReconciled",
    "CheckpointSaved",
    "ControlApplied",
    "EventStream",
    "EventsDropped",
    "FlowOptions",
    "FlowResult",
    "FlowRun",
    "ModelStep",
    "NodeCompleted",
    "NodeFailed",
    "NodeOutcome",
    "NodePaused",
    "NodeReplayed",
    "NodeSkipped",
    "NodeStarted",
    "NodeWithheld",
    "PlanReady",
    "PlanWarning",
    "ResumeSeed",
    "RunEvent",
    "SpawnAccepted",
    "SpawnRejected",
    "ToolCallEnded",
    "ToolCallStarted",
    "graph_text",
    "load_branch",
    "node_detail",
    "prepare_resume",
    "read_run",
    "result_of",
    "resume_run",
    "run_flow",
    "run_result",
]

# Where each name lives (a private module of this package).
_LAZY = {
    "FlowOptions": "_options",
    "FlowResult": "_options",
    "FlowRun": "_run",
    "ResumeSeed": "_options",
    "graph_text": "_graphview",
    "load_branch": "_resume",
    "node_detail": "_detail",
    "prepare_resume": "_resume",
    "read_run": "_detail",
    "resume_run": "_resume_run",
    "result_of": "_detail",
    "run_flow": "_run",
    "run_result": "_detail",
    "AdmissionClosed": "_stream",
    "CheckpointFailed": "_stream",
    "CheckpointReconciled": "_stream",
    "CheckpointSaved": "_stream",
    "ControlApplied": "_stream",
    "EventStream": "_stream",
    "EventsDropped": "_stream",
    "NodeOutcome": "_outcome",
    "NodeCompleted": "_stream",
    "NodeFailed": "_stream",
    "NodePaused": "_stream",
    "NodeReplayed": "_stream",
    "NodeSkipped": "_stream",
    "NodeStarted": "_stream",
    "NodeWithheld": "_stream",
    "PlanReady": "_stream",
    "PlanWarning": "_stream",
    "RunEvent": "_stream",
    "SpawnAccepted": "_stream",
    "SpawnRejected": "_stream",
    "ModelStep": "_stream",
    "ToolCallEnded": "_stream",
    "ApprovalRequested": "_stream",
    "ToolCallStarted": "_stream",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'steerflow.orchestrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
