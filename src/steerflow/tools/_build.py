"""A node's toolset from its specs: ``python:`` functions, ``mcp:`` servers' tools.

Built once per distinct spec list per run (``ToolRuntime``). Two tools under one name
would leave the model no way to say which it means, so that is refused, naming both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from steerflow.errors import PlanValidationError
from steerflow.tools._mcp import McpServers
from steerflow.tools._python import load_python_tool, python_tool
from steerflow.tools._specs import McpSource, parse_tool_spec
from steerflow.tools._toolset import Tool, ToolOptions, ToolOutput, Toolset

__all__ = ["NamedToolset", "build_toolset"]


class NamedToolset(Toolset):
    """Tools by the names the model uses."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self._tools = dict(tools)

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every tool, by name."""
        return self._tools

    async def call(self, name: str, args: Mapping[str, Any]) -> ToolOutput:
        """Run one call; an unknown name is an error output listing the known ones."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return ToolOutput(f"no tool named {name!r}; the tools are: {known}", is_error=True)
        return await tool.call(args)


def _add(found: dict[str, Tool], tool: Tool) -> None:
    name = tool.spec.name
    if name in found:
        raise PlanValidationError(
            f"two tools are named {name!r} ({found[name].source} and {tool.source}); "
            "a model could not tell them apart: give the node only one of them"
        )
    found[name] = tool


async def build_toolset(
    specs: Sequence[str],
    *,
    callables: Sequence[Callable[..., Any]] = (),
    servers: McpServers | None = None,
    options: Mapping[str, ToolOptions] | None = None,
) -> NamedToolset:
    """The toolset of ``specs`` (and ``callables`` given in code), options applied by name.

    Raises:
        PlanValidationError: a malformed spec, a module or function that cannot be loaded,
            an MCP server not declared or a tool it does not offer, two tools of one name.
    """
    opts = dict(options or {})
    found: dict[str, Tool] = {}
    for spec in specs:
        source = parse_tool_spec(spec)
        if isinstance(source, McpSource):
            if servers is None:
                raise PlanValidationError(
                    f"tool spec {spec!r}: the plan declares no mcp_servers to take it from"
                )
            offered = await servers.list_tools(source.server, opts)
            if source.tool is not None:
                offered = [t for t in offered if t.spec.name == source.tool]
                if not offered:
                    raise PlanValidationError(
                        f"tool spec {spec!r}: MCP server {source.server!r} offers no tool "
                        f"{source.tool!r}"
                    )
            for mcp_tool in offered:
                _add(found, mcp_tool)
            continue
        # Importing a module runs its code: off the run's event loop.
        loaded = await asyncio.to_thread(load_python_tool, source.module, source.function)
        _add(found, _configured(loaded, opts.get(loaded.spec.name)))
    for fn in callables:
        given = python_tool(fn)
        _add(found, _configured(given, opts.get(given.spec.name)))
    return NamedToolset(found)


def _configured(tool: Tool, options: ToolOptions | None) -> Tool:
    """A ``python:`` tool with its ``tool_options`` (idempotent, timeout) applied."""
    if options is not None:
        if options.idempotent is not None:
            tool.idempotent = options.idempotent
        if options.timeout_s is not None:
            tool.timeout_s = options.timeout_s
    return tool
