"""A cancelled worker leaves its node pending and the files it produced are noted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from steerflow.executor import FlowExecutor, Graph, Operation
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse


class _SlowWriter(Provider):
    spec = "slow-writer"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        (request.artifact_dir / "partial.txt").write_text("half done")
        self.started.set()
        await asyncio.sleep(60)
        return ProviderResponse(text="never")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


async def test_cancelled_call_keeps_node_pending_and_lists_partial_artifacts(
    tmp_path: Path,
) -> None:
    graph = Graph()
    op = Operation(key="build", instruction="build it")
    graph.add(op)
    provider = _SlowWriter()
    executor = FlowExecutor(
        graph,
        provider_for=lambda _: provider,
        run_id="run",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
    )
    task = asyncio.ensure_future(executor.run())
    await asyncio.wait_for(provider.started.wait(), timeout=10)
    executor.close_admission("SIGINT", cancel_inflight=True)
    await asyncio.wait_for(task, timeout=10)

    assert op.status == "pending"
    assert op.artifacts == ["partial.txt"]
    assert op.error is None  # not a failure: the node reruns on resume
    assert op.extra["cancelled"] == "SIGINT"
    assert [e.type for e in executor.events.history].count("node_withheld") == 1
