"""Library readers for what the CLI shows: the views a Studio page or an MCP client uses.

Each returns a typed, frozen object whose ``to_json()`` is the JSON the matching command
prints (``runs``, ``show``, ``show RUN NODE``, ``result``, ``ctl status``), read through
the same state DB rows and the same checkpoint loader (``checkpoint.load_state``). The
control writers queue the same rows as ``steerflow ctl``. Nothing here prints.
"""

from __future__ import annotations

from steerflow.control import Queued
from steerflow.views._artifacts import OpenedArtifact, open_artifact
from steerflow.views._control import (
    ControlEntry,
    ControlStatus,
    budget,
    control_status,
    message,
    pause,
    resume,
    stop,
)
from steerflow.views._graph import GraphNode, RunGraph, run_graph
from steerflow.views._node import NodeDetail, RunResult, node_detail, run_result
from steerflow.views._progress import RunProgress, run_progress
from steerflow.views._recovery import (
    CheckpointReport,
    PreflightRefusal,
    ResumePreflight,
    checkpoint_report,
    resume_preflight,
)
from steerflow.views._runs import NodeState, RunListing, RunView, list_runs, show_run

__all__ = [
    "CheckpointReport",
    "ControlEntry",
    "ControlStatus",
    "GraphNode",
    "NodeDetail",
    "NodeState",
    "OpenedArtifact",
    "PreflightRefusal",
    "Queued",
    "ResumePreflight",
    "RunGraph",
    "RunListing",
    "RunProgress",
    "RunResult",
    "RunView",
    "budget",
    "checkpoint_report",
    "control_status",
    "list_runs",
    "message",
    "node_detail",
    "open_artifact",
    "pause",
    "resume",
    "resume_preflight",
    "run_graph",
    "run_progress",
    "run_result",
    "show_run",
    "stop",
]
