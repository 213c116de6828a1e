"""A provider call's cancellation records who cancelled it (CallScope), never a guess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from steerflow.executor import CallScope, FlowExecutor, Graph, Operation
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse
from waiting import loop_turn, wait_until_async


class _Held(Provider):
    """A call that runs until released (or cancelled)."""

    spec = "held"

    def __init__(self, *, cancel_at_deadline: bool = False) -> None:
        self.cancel_at_deadline = cancel_at_deadline
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.started.set()
        await self.release.wait()
        return ProviderResponse(text="done")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


async def test_a_signal_after_the_deadline_is_recorded_as_the_canceller(tmp_path: Path) -> None:
    """The deadline cancels only the worker; SIGINT later cancels the model call, and that
    node names SIGINT, not the reason admission first closed for."""
    graph = Graph()
    build = Operation(key="build", instruction="build it", assignee="coder")
    think = Operation(key="think", instruction="think", assignee="analyst")
    graph.add(build)
    graph.add(think)
    worker, model = _Held(cancel_at_deadline=True), _Held()
    executor = FlowExecutor(
        graph,
        provider_for=lambda op: worker if op.assignee == "coder" else model,
        run_id="run",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
    )
    async with asyncio.TaskGroup() as tg:
        tg.create_task(executor.run())
        await asyncio.wait_for(asyncio.gather(worker.started.wait(), model.started.wait()), 10)
        executor.close_admission("deadline", cancel_long_running=True)
        await wait_until_async(lambda: build.status == "pending", timeout=10, what="build cut")
        executor.close_admission("SIGINT", cancel_inflight=True)
    assert executor.admission_reason == "deadline"
    assert build.cancelled == "deadline"
    assert think.status == "pending" and think.cancelled == "SIGINT"


async def test_the_scope_swallows_only_its_own_cancellation() -> None:
    scope = CallScope()
    entered = asyncio.Event()

    async def call() -> str:
        with scope:
            entered.set()
            await asyncio.Event().wait()  # until cancelled
        return "after the scope"

    task = asyncio.create_task(call())
    await entered.wait()
    assert scope.cancel("SIGINT") is True
    assert scope.cancel("deadline") is False  # the first canceller is the one recorded
    assert await task == "after the scope"
    assert scope.cancelled_by == "SIGINT"
    assert task.cancelling() == 0


async def test_a_cancellation_from_outside_still_propagates() -> None:
    """The caller cancels the task as well: the scope must not eat that cancellation."""
    scope = CallScope()
    entered = asyncio.Event()

    async def call() -> None:
        with scope:
            entered.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(call())
    await entered.wait()
    scope.cancel("deadline")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scope.cancelled_by == "deadline"


async def test_cancel_outside_the_block_does_nothing() -> None:
    scope = CallScope()
    assert scope.cancel("SIGINT") is False  # not entered yet
    with scope:
        pass
    assert scope.cancel("SIGINT") is False  # already left: the task must not be hit
    await loop_turn()  # a stray cancel would land here
    assert scope.cancelled_by is None
