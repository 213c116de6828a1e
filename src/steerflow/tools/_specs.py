"""A tool SPEC as the plan writes it: ``python:MODULE:FUNCTION``, ``mcp:SERVER[/TOOL]``.

Parsed once, before anything is imported or started, so a typo is one line naming the
spec and the forms it may take (CONTRACT §12), not an import error deep in a run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from steerflow.errors import PlanValidationError

__all__ = [
    "SPEC_FORMS",
    "McpSource",
    "PythonSource",
    "ToolSource",
    "check_server_name",
    "parse_tool_spec",
]

#: What the error of a malformed spec lists.
SPEC_FORMS = "python:MODULE:FUNCTION, mcp:SERVER or mcp:SERVER/TOOL"

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# A server's name is also its stderr file's name (``<NAME>.stderr``): no separators.
_SERVER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# MCP tool names are free-form strings on the wire; only the separators are refused.
_TOOL = re.compile(r"[^/\s:]+")


@dataclass(frozen=True)
class PythonSource:
    """``python:MODULE:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``)."""

    spec: str
    module: str
    function: str


@dataclass(frozen=True)
class McpSource:
    """``mcp:SERVER`` (every tool of the server, ``tool`` None) or ``mcp:SERVER/TOOL``."""

    spec: str
    server: str
    tool: str | None = None


ToolSource = PythonSource | McpSource


def _malformed(spec: str, why: str) -> PlanValidationError:
    return PlanValidationError(f"tool spec {spec!r}: {why}; a tool spec is {SPEC_FORMS}")


def check_server_name(name: str, where: str) -> None:
    """Refuse an MCP server name that could not be a file name or a spec part."""
    if not _SERVER.fullmatch(name):
        raise PlanValidationError(
            f"{where}: MCP server name {name!r} must be letters, digits, '_', '.' or '-' "
            "(it names the server's stderr file)"
        )


def parse_tool_spec(spec: str) -> ToolSource:
    """The source a SPEC names.

    Raises:
        PlanValidationError: not one of :data:`SPEC_FORMS`; the message names the spec.
    """
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("python", "mcp"):
        raise _malformed(spec, "unknown kind (want 'python:' or 'mcp:')")
    if kind == "python":
        module, sep, function = rest.partition(":")
        if not sep or not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(function):
            raise _malformed(spec, "want python:MODULE:FUNCTION with dotted Python names")
        return PythonSource(spec, module, function)
    server, sep, tool = rest.partition("/")
    if not _SERVER.fullmatch(server):
        raise _malformed(spec, "the server name must be letters, digits, '_', '.' or '-'")
    if not sep:
        return McpSource(spec, server)
    if not _TOOL.fullmatch(tool):
        raise _malformed(spec, "want mcp:SERVER/TOOL with one tool name after the '/'")
    return McpSource(spec, server, tool)
