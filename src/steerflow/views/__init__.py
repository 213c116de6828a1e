"""Library readers for what the CLI shows: the views a Studio page or an MCP client uses.

Each returns a typed, frozen object whose ``to_json()`` is the JSON the matching command
prints (``runs``, ``show``, ``show RUN NODE``, ``result``, ``ctl status``), read through
the same state DB rows and the same checkpoint loader (``checkpoint.load_state``). The
control writers queue the same rows as ``steerflow ctl``. Nothing here prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerflow._lazy import lazy_exports

if TYPE_CHECKING:
    from steerflow.control import Queued
    from steerflow.views._approvals import ApprovalRequest, approve, deny, list_approvals
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
    "ApprovalRequest",
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
    "approve",
    "budget",
    "checkpoint_report",
    "control_status",
    "deny",
    "list_approvals",
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


# Where each name lives (a submodule of this package), imported on first access.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CheckpointReport": "_recovery",
        "ApprovalRequest": "_approvals",
        "approve": "_approvals",
        "deny": "_approvals",
        "list_approvals": "_approvals",
        "Queued": "steerflow.control._queue",
        "ControlEntry": "_control",
        "ControlStatus": "_control",
        "GraphNode": "_graph",
        "NodeDetail": "_node",
        "NodeState": "_runs",
        "OpenedArtifact": "_artifacts",
        "PreflightRefusal": "_recovery",
        "ResumePreflight": "_recovery",
        "RunGraph": "_graph",
        "RunListing": "_runs",
        "RunProgress": "_progress",
        "RunResult": "_node",
        "RunView": "_runs",
        "budget": "_control",
        "checkpoint_report": "_recovery",
        "control_status": "_control",
        "list_runs": "_runs",
        "message": "_control",
        "node_detail": "_node",
        "open_artifact": "_artifacts",
        "pause": "_control",
        "resume": "_control",
        "resume_preflight": "_recovery",
        "run_graph": "_graph",
        "run_progress": "_progress",
        "run_result": "_node",
        "show_run": "_runs",
        "stop": "_control",
    },
)
