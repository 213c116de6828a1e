"""Stopping a run while the planner call runs: the canceller is recorded, not guessed."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import pytest

from steerflow.errors import ExitCode
from steerflow.orchestrate import FlowOptions, FlowRun
from steerflow.providers import echo
from steerflow.state import StateDB


@pytest.fixture
def planning(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The echo planner holds until cancelled; the event says it was called."""
    started = asyncio.Event()

    async def held_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("the planner was not stopped")

    monkeypatch.setattr(echo.EchoProvider, "plan", held_plan)
    return started


def _stored_status(home: Path, session_id: str | None) -> str:
    assert session_id is not None
    db = StateDB.open(home)
    try:
        row = db.get_session(session_id)
        assert row is not None
        return row.status
    finally:
        db.close()


async def test_a_signal_while_planning_interrupts_the_run(
    tmp_path: Path, planning: asyncio.Event
) -> None:
    home = tmp_path / "home"
    run = FlowRun(FlowOptions(prompt="fix it", model="echo"), home=home)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(run.run())
        await asyncio.wait_for(planning.wait(), 10)
        run.request_stop(signal.SIGINT)
    result = task.result()
    assert (result.status, result.exit_code) == ("interrupted", ExitCode.SIGINT)
    assert _stored_status(home, result.session_id) == "interrupted"


async def test_the_deadline_while_planning_times_the_run_out(
    tmp_path: Path, planning: asyncio.Event
) -> None:
    home = tmp_path / "home"
    result = await FlowRun(
        FlowOptions(prompt="fix it", model="echo", timeout_s=0.2), home=home
    ).run()
    assert planning.is_set()
    assert (result.status, result.exit_code) == ("timed_out", ExitCode.DEADLINE)
    assert _stored_status(home, result.session_id) == "timed_out"


async def test_cancelling_the_run_itself_is_not_taken_for_a_stop(
    tmp_path: Path, planning: asyncio.Event
) -> None:
    """The caller cancels the run: that cancellation propagates; no result pretends the
    run was interrupted by a signal."""
    run = FlowRun(FlowOptions(prompt="fix it", model="echo"), home=tmp_path / "home")
    task = asyncio.create_task(run.run())
    await asyncio.wait_for(planning.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_no_planner_retry_after_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planner that swallows the deadline's cancellation and answers badly anyway gets
    no second call: a retry is a new assignment, and admission stays closed (issue 13)."""
    calls: list[str | None] = []

    async def stubborn_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
        calls.append(request.feedback)
        if len(calls) == 1:
            # swallowed: the call "answers" after the deadline cancelled it
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        return {"plan": "not a plan"}

    monkeypatch.setattr(echo.EchoProvider, "plan", stubborn_plan)
    home = tmp_path / "home"
    result = await FlowRun(
        FlowOptions(prompt="fix it", model="echo", timeout_s=0.2), home=home
    ).run()
    assert calls == [None]
    assert (result.status, result.exit_code) == ("timed_out", ExitCode.DEADLINE)
    assert _stored_status(home, result.session_id) == "timed_out"
