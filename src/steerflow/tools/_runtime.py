"""One run's tools: each node's toolset built once per distinct set of specs.

The run owns what tools need for its whole life (MCP server sessions, started on first
use and ended with the run); a node asks for its toolset by its specs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from steerflow.tools._toolset import Toolset

__all__ = ["ToolRuntime"]

#: Builds the toolset of one node's specs (``python:``/``mcp:``/code callables).
ToolsetBuilder = Callable[[tuple[str, ...]], Awaitable[Toolset]]


class ToolRuntime:
    """The run's toolsets by spec tuple, and what closes them when the run ends."""

    def __init__(
        self, build: ToolsetBuilder, *, close: Callable[[], Awaitable[None]] | None = None
    ):
        self._build = build
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
