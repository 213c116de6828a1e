"""A tool node's loop outside the executor, for the provider step tests.

``run_loop`` runs :class:`steerflow.tools._loop.ToolLoop` over a provider with an
in-memory toolset (each tool answers from a function) and hooks that admit every request,
price nothing and keep the journal in a list, so a test sees the real conversation the
loop builds reach the provider, and what the loop records of the replies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from steerflow._usage import Usage
from steerflow.providers._base import Provider, ProviderRequest, ProviderResponse, ToolSpec
from steerflow.tools._loop import Admitted, ToolLoop
from steerflow.tools._toolset import Tool, ToolOutput, Toolset

Answer = Callable[[Mapping[str, Any]], ToolOutput]


class FnTool(Tool):
    """A tool that answers from a function (and remembers its calls)."""

    def __init__(self, name: str, answer: Answer, schema: dict[str, Any] | None = None) -> None:
        self.spec = ToolSpec(
            name, f"the {name} tool", schema or {"type": "object", "properties": {}}
        )
        self.source = f"test:{name}"
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    async def call(self, args: Mapping[str, Any]) -> ToolOutput:
        self.calls.append(dict(args))
        return self.answer(args)


class FnToolset(Toolset):
    """Tools by name; an unknown name is an error output, as a real toolset's is."""

    def __init__(self, *tools: FnTool) -> None:
        self._tools = {t.spec.name: t for t in tools}

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self._tools

    async def call(self, name: str, args: Mapping[str, Any]) -> ToolOutput:
        tool = self._tools.get(name)
        if tool is None:
            return ToolOutput(f"no tool named {name!r}", is_error=True)
        return await tool.call(args)


@dataclass
class ListHooks:
    """Admit every request, charge usage as reported, journal into ``records``."""

    records: list[dict[str, Any]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    async def admit_request(self, step: int) -> Admitted:
        self.steps.append(step)
        return Admitted(call_id=f"intent-{step}")

    def delivered(self, admitted: Admitted) -> None:
        pass

    def charge(self, usage: Usage | None) -> Usage | None:
        return usage

    def check_between(self) -> None:
        pass

    async def record(self, entry: dict[str, Any]) -> None:
        self.records.append(entry)


async def run_loop(
    provider: Provider, request: ProviderRequest, *tools: FnTool, max_steps: int = 5
) -> tuple[ProviderResponse, ListHooks]:
    """Run one tool node's loop to its final reply; the reply and the hooks it used."""
    hooks = ListHooks()
    loop = ToolLoop(
        provider,
        FnToolset(*tools),
        hooks,
        node=request.node_key,
        record="node",
        key=request.node_key,
        max_steps=max_steps,
    )
    return await loop.run(request), hooks
