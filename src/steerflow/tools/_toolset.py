"""What the step loop runs: a node's tools by name, each called with checked arguments.

The interface between the loop (``tools._loop``) and the tool sources (``python:``
functions, MCP servers). A tool never raises for a failure the model should hear about:
bad arguments, an exception, a timeout all come back as a :class:`ToolOutput` with
``is_error`` set, so the model can correct itself and the node goes on (issue 39 item 1).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from steerflow.providers._base import ToolSpec

__all__ = ["DEFAULT_TOOL_TIMEOUT_S", "Tool", "ToolOptions", "ToolOutput", "Toolset"]

#: A tool call's bound when ``tool_options.<TOOL>.timeout_s`` does not say (issue 39 item 5).
DEFAULT_TOOL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ToolOptions:
    """``tool_options: {TOOL: {...}}`` (CONTRACT §12); None is "not declared"."""

    idempotent: bool | None = None
    approval: Literal["required", "never"] | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call gave back: the text the model sees, and whether it is an error."""

    content: str
    is_error: bool = False


class Tool(abc.ABC):
    """One callable tool: what the model is told (``spec``) and how it runs."""

    #: The name, description and argument schema the model sees.
    spec: ToolSpec
    #: The plan's SPEC it came from (``python:MOD:FN``, ``mcp:SERVER/TOOL``, ``callable:...``).
    source: str
    #: True if calling it twice with the same arguments does no more than once: an
    #: unfinished call is then simply called again on resume (issue 39 item 3).
    idempotent: bool = False
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S

    @abc.abstractmethod
    async def call(self, args: Mapping[str, Any]) -> ToolOutput:
        """Validate ``args`` against the schema, run the tool, return its output."""


class Toolset(abc.ABC):
    """A node's tools, by the names the model uses."""

    @property
    @abc.abstractmethod
    def tools(self) -> Mapping[str, Tool]:
        """Every tool, by name."""

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told, in a stable order (by name)."""
        return tuple(self.tools[name].spec for name in sorted(self.tools))

    @abc.abstractmethod
    async def call(self, name: str, args: Mapping[str, Any]) -> ToolOutput:
        """Run one call: an unknown name, a timeout or an exception is an error output."""
