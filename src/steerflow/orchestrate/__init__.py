"""Running a flow end to end: the library API behind ``flow``, ``play`` and ``resume``."""

from __future__ import annotations

from steerflow.orchestrate._detail import node_detail, read_run, result_of, run_result
from steerflow.orchestrate._graphview import graph_text, mermaid
from steerflow.orchestrate._options import (
    FlowOptions,
    FlowResult,
    ResumeSeed,
    node_summaries,
    usage_total,
)
from steerflow.orchestrate._plan_codec import plan_from_checkpoint, plan_to_checkpoint
from steerflow.orchestrate._resume import load_branch, prepare_resume
from steerflow.orchestrate._run import FlowRun, run_flow

__all__ = [
    "FlowOptions",
    "FlowResult",
    "FlowRun",
    "ResumeSeed",
    "graph_text",
    "load_branch",
    "mermaid",
    "node_detail",
    "node_summaries",
    "plan_from_checkpoint",
    "plan_to_checkpoint",
    "prepare_resume",
    "read_run",
    "result_of",
    "run_flow",
    "run_result",
    "usage_total",
]
