"""A cancelled worker leaves its node pending and the files it produced are noted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from steerflow.executor import Edge, FlowExecutor, Graph, Operation
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse
from waiting import wait_until_async


class _SlowWriter(Provider):
    spec = "slow-writer"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        # off the loop, as a real provider must (the blockbuster fixture checks it)
        await asyncio.to_thread((request.artifact_dir / "partial.txt").write_text, "half done")
        self.started.set()
        await asyncio.Event().wait()  # until cancelled
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
    assert op.cancelled == "SIGINT"
    assert [e.type for e in executor.events.history].count("node_withheld") == 1


class _Worker(_SlowWriter):
    """An agent-worker-like provider: a deadline cancels it."""

    cancel_at_deadline = True


class _ModelCall(Provider):
    """A model call already invoked at the deadline: it finishes (Amendment 3)."""

    spec = "model-call"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.started.set()
        await self.release.wait()
        return ProviderResponse(text="model answer")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


async def test_deadline_cancels_only_long_running_workers(tmp_path: Path) -> None:
    graph = Graph()
    build = Operation(key="build", instruction="build it", assignee="coder")
    think = Operation(key="think", instruction="think", assignee="analyst")
    after = Operation(key="after", instruction="later", edges=[Edge(think.node_id)])
    for op in (build, think, after):
        graph.add(op)
    worker, model = _Worker(), _ModelCall()
    executor = FlowExecutor(
        graph,
        provider_for=lambda op: worker if op.assignee == "coder" else model,
        run_id="run",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
    )
    task = asyncio.ensure_future(executor.run())
    await asyncio.wait_for(asyncio.gather(worker.started.wait(), model.started.wait()), 10)
    executor.close_admission("deadline", cancel_long_running=True)
    await wait_until_async(lambda: build.status == "pending", timeout=10, what="build withheld")
    assert build.status == "pending" and build.cancelled == "deadline"
    assert build.artifacts == ["partial.txt"]
    assert think.status == "running"  # the model call is still allowed to finish
    model.release.set()
    await asyncio.wait_for(task, timeout=10)
    assert think.status == "completed" and think.response == "model answer"
    assert after.status == "pending"  # admission is closed: never invoked
