"""``shout/MODEL``: an example steerflow provider plugin (docs/providers.md)."""

from __future__ import annotations

from typing import ClassVar

from steerflow.errors import ProviderError
from steerflow.providers import (
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    Usage,
)

__all__ = ["ShoutProvider", "make_provider"]


class ShoutProvider(Provider):
    """Answers with the rendered instruction in capitals."""

    # It writes no file: no artifact directory is made for its nodes.
    needs_artifact_dir: ClassVar[bool] = False

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.voice = spec.partition("/")[2]

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """One call: no await needed, so nothing to cancel or clean up."""
        words = len(request.instruction.split())
        return ProviderResponse(
            text=f"[{self.voice} {request.node_key}] {request.instruction.upper()}",
            usage=Usage(input_tokens=words, output_tokens=words),
        )

    async def plan(self, request: PlanRequest) -> object:
        """This example cannot plan: give it a plan file."""
        raise ProviderError(f"{self.spec} cannot plan: give --plan FILE")


def make_provider(spec: str) -> Provider:
    """The entry point's factory: steerflow calls it with the whole ``--model`` spec."""
    return ShoutProvider(spec)
