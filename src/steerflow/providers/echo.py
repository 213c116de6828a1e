"""The offline, deterministic ``echo`` model (CONTRACT §4)."""

from __future__ import annotations

import asyncio
import re
from typing import ClassVar

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import PlanRequest, Provider, ProviderRequest, ProviderResponse

__all__ = ["EchoProvider", "echo_plan", "echo_text"]


def echo_text(request: ProviderRequest) -> str:
    """The echo response: the node id and the complete rendered instruction, verbatim."""
    return f"[echo {request.node_key}]\n{request.instruction}"


def echo_plan(prompt: str) -> dict[str, object]:
    """A small deterministic plan derived from the prompt: scope, two angles, join, review."""
    topic = re.sub(r"\s+", " ", prompt).strip() or "the task"
    return {
        "name": "echo-plan",
        "plan": [
            {"agent_id": "scope", "assignee": "planner", "instruction": f"Scope: {topic}"},
            {
                "agent_id": "explore-a",
                "assignee": "researcher",
                "instruction": f"Explore the first approach to: {topic}",
                "depends_on": ["scope"],
            },
            {
                "agent_id": "explore-b",
                "assignee": "researcher",
                "instruction": f"Explore an alternative approach to: {topic}",
                "depends_on": ["scope"],
            },
            {
                "agent_id": "synthesize",
                "assignee": "writer",
                "instruction": f"Combine both approaches into one answer for: {topic}",
                "depends_on": ["explore-a", "explore-b"],
            },
        ],
    }


class EchoProvider(Provider):
    """Echoes what it was asked, optionally after ``delay`` seconds."""

    needs_artifact_dir: ClassVar[bool] = False  # it writes nothing
    reports_usage: ClassVar[bool] = False

    def __init__(self, spec: str = "echo") -> None:
        self.spec = spec
        self.delay = 0.0
        _, _, options = spec.partition(":")
        for option in filter(None, options.split(",")):
            key, _, value = option.partition("=")
            if key != "delay":
                raise UsageError(f"--model {spec!r}: unknown echo option {key!r} (known: delay)")
            try:
                self.delay = float(value)
            except ValueError:
                raise UsageError(f"--model {spec!r}: delay must be a number of seconds") from None
            if not self.delay >= 0:
                raise UsageError(f"--model {spec!r}: delay must be >= 0")

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Return the echo text after the configured delay.

        Raises:
            ProviderError: The node has an ``output_schema``: an echo is not a structured
                reply, and asking it again would not make one (decision 285).
        """
        if request.output_schema is not None:
            raise ProviderError(
                f"{self.spec} cannot answer node {request.node_key!r}: it has an output_schema, "
                "and echo only repeats its instruction (use script: to script a JSON reply)"
            )
        if self.delay:
            await asyncio.sleep(self.delay)
        return ProviderResponse(text=echo_text(request))

    async def plan(self, request: PlanRequest) -> object:
        """Return the deterministic echo plan for the prompt."""
        return echo_plan(request.prompt)
