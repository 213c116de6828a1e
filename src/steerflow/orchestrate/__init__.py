"""Running a flow end to end: the library API behind ``flow``, ``play`` and ``resume``."""

from __future__ import annotations

from steerflow.orchestrate._graphview import graph_text, mermaid
from steerflow.orchestrate._options import FlowOptions, FlowResult, ResumeSeed
from steerflow.orchestrate._plan_codec import plan_from_checkpoint, plan_to_checkpoint
from steerflow.orchestrate._run import FlowRun, node_summaries, run_flow

__all__ = [
    "FlowOptions",
    "FlowResult",
    "FlowRun",
    "ResumeSeed",
    "graph_text",
    "mermaid",
    "node_summaries",
    "plan_from_checkpoint",
    "plan_to_checkpoint",
    "run_flow",
]
