"""One run's tools: each node's toolset built once per distinct set of specs.

The run owns what tools need for its whole life (MCP server sessions, started on first
use and ended with the run); a node asks for its toolset by its specs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from steerflow.tools._toolset import ToolOptions, Toolset

__all__ = ["ToolRuntime", "open_runtime"]

#: Builds the toolset of one node's specs (``python:``/``mcp:``/code callables).
ToolsetBuilder = Callable[[tuple[str, ...]], Awaitable[Toolset]]


class ToolRuntime:
    """The run's toolsets by spec tuple, and what closes them when the run ends."""

    def __init__(
        self,
        build: ToolsetBuilder,
        *,
        close: Callable[[], Awaitable[None]] | None = None,
        options: Mapping[str, ToolOptions] | None = None,
    ):
        self._build = build
        #: ``tool_options`` by tool name (``approval`` is read by the executor, issue 41).
        self.options: Mapping[str, ToolOptions] = dict(options or {})
        self._close = close
        self._toolsets: dict[tuple[str, ...], Toolset] = {}

    async def toolset(self, specs: Sequence[str]) -> Toolset:
        """The toolset of ``specs`` (built on first use, then shared)."""
        key = tuple(specs)
        found = self._toolsets.get(key)
        if found is None:
            found = self._toolsets[key] = await self._build(key)
        return found

    async def aclose(self) -> None:
        """End what the run's tools hold (MCP servers)."""
        if self._close is not None:
            await self._close()


def open_runtime(
    *,
    mcp_servers: Mapping[str, Any],
    tool_options: Mapping[str, Mapping[str, Any]],
    stderr_dir: Path,
) -> ToolRuntime:
    """The runtime of one run's tools, from the plan's stored ``mcp_servers``/``tool_options``.

    Nothing starts here: an MCP server starts when a node first needs its tools, so a run
    whose tool nodes never run starts none. The imports stay here too, so a run without
    tools never loads the MCP SDK.
    """
    from steerflow.tools._build import build_toolset
    from steerflow.tools._mcp import McpServers, parse_mcp_servers

    servers = McpServers(parse_mcp_servers(mcp_servers), stderr_dir) if mcp_servers else None
    options = {name: ToolOptions(**dict(opts)) for name, opts in tool_options.items()}

    async def build(specs: tuple[str, ...]) -> Toolset:
        return await build_toolset(specs, servers=servers, options=options)

    return ToolRuntime(
        build, close=servers.aclose if servers is not None else None, options=options
    )
