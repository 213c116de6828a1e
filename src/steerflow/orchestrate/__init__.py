"""Running a flow end to end: the library API behind ``flow``, ``play`` and ``resume``."""

from __future__ import annotations

from steerflow.orchestrate._detail import node_detail, read_run, result_of, run_result
from steerflow.orchestrate._graphview import graph_text
from steerflow.orchestrate._options import FlowOptions, FlowResult, ResumeSeed
from steerflow.orchestrate._resume import load_branch, prepare_resume
from steerflow.orchestrate._run import FlowRun, run_flow

__all__ = [
    "FlowOptions",
    "FlowResult",
    "FlowRun",
    "ResumeSeed",
    "graph_text",
    "load_branch",
    "node_detail",
    "prepare_resume",
    "read_run",
    "result_of",
    "run_flow",
    "run_result",
]
