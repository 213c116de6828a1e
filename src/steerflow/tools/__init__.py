"""Tools and the tool node's step loop (issue 39, decision 253).

Layer 2: tool specs (``python:MODULE:FUNCTION``, ``mcp:SERVER``, ``mcp:SERVER/TOOL``,
callables from code), MCP sessions, and the loop that runs a model and its tools step by
step, each step journaled before the next begins. Imported only by nodes that have tools.
"""

from __future__ import annotations

from steerflow.tools._runtime import ToolRuntime
from steerflow.tools._toolset import (
    DEFAULT_TOOL_TIMEOUT_S,
    Tool,
    ToolOptions,
    ToolOutput,
    Toolset,
)

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "Tool",
    "ToolOptions",
    "ToolOutput",
    "ToolRuntime",
    "Toolset",
]
