"""Stopping a run while the planner call runs (decision 101).

SIGINT cancels the planner call, and the canceller is recorded, not guessed; SIGTERM and
the deadline let it finish, so the plan it returned is saved for a resume. The
end-to-end tests with real processes are in ``tests/e2e/test_stop_while_planning.py``.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from steerflow.checkpoint import load_checkpoint
from steerflow.errors import ExitCode
from steerflow.orchestrate import FlowOptions, FlowRun
from steerflow.providers import echo
from steerflow.state import StateDB
from waiting import wait_until_async


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


def _stored(home: Path, session_id: str | None) -> tuple[str, dict[str, object]]:
    assert session_id is not None
    db = StateDB.open(home)
    try:
        row = db.get_session(session_id)
        assert row is not None
        return row.status, dict(row.node_metadata)
    finally:
        db.close()


async def test_sigint_while_planning_cancels_the_planner(
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
    status, meta = _stored(home, result.session_id)
    assert status == "interrupted"
    assert meta["nothing_to_resume"] == (
        "the planner call was cancelled (SIGINT) before it returned a plan"
    )


async def test_a_second_signal_cancels_a_planner_the_first_let_run(
    tmp_path: Path, planning: asyncio.Event
) -> None:
    home = tmp_path / "home"
    run = FlowRun(FlowOptions(prompt="fix it", model="echo"), home=home)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(run.run())
        await asyncio.wait_for(planning.wait(), 10)
        run.request_stop(signal.SIGTERM)
        scope = run._planning
        assert scope is not None and scope.cancelled_by is None  # SIGTERM lets it finish
        run.request_stop(signal.SIGTERM)
        assert scope.cancelled_by == "SIGTERM"
    result = task.result()
    assert (result.status, result.exit_code) == ("interrupted", ExitCode.SIGTERM)
    assert result.nodes == [] and not result.checkpoint["persisted"]


def _released_after(run_flag: str, monkeypatch: pytest.MonkeyPatch, run: list[FlowRun]) -> None:
    """The echo planner answers only once ``run[0].<run_flag>`` is set."""
    original = echo.EchoProvider.plan

    async def late_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
        await wait_until_async(lambda: getattr(run[0], run_flag), timeout=10, what=run_flag)
        return await original(self, request)

    monkeypatch.setattr(echo.EchoProvider, "plan", late_plan)


async def test_the_deadline_while_planning_keeps_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    holder: list[FlowRun] = []
    _released_after("deadline_hit", monkeypatch, holder)
    run = FlowRun(FlowOptions(prompt="fix it", model="echo", timeout_s=0.2), home=home)
    holder.append(run)
    result = await run.run()
    assert (result.status, result.exit_code) == ("timed_out", ExitCode.DEADLINE)
    assert {n["status"] for n in result.nodes} == {"pending"} and len(result.nodes) == 4
    assert _stored(home, result.session_id)[0] == "timed_out"
    state, _ = load_checkpoint(Path(str(result.run_dir)))
    assert len(state["plan"]) == 4 and state["ops"] == {}


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
    """A planner that answers badly after the deadline gets no second call: a retry is a
    new assignment, and admission stays closed (issue 13). With no plan there is nothing
    to resume, and the run says why."""
    calls: list[str | None] = []
    holder: list[FlowRun] = []

    async def late_bad_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
        calls.append(request.feedback)
        await wait_until_async(lambda: holder[0].deadline_hit, timeout=10, what="deadline")
        return {"plan": "not a plan"}

    monkeypatch.setattr(echo.EchoProvider, "plan", late_bad_plan)
    home = tmp_path / "home"
    run = FlowRun(FlowOptions(prompt="fix it", model="echo", timeout_s=0.2), home=home)
    holder.append(run)
    result = await run.run()
    assert calls == [None]
    assert (result.status, result.exit_code) == ("timed_out", ExitCode.DEADLINE)
    status, meta = _stored(home, result.session_id)
    assert status == "timed_out"
    assert "no retry is asked for once the run is stopping" in str(meta["nothing_to_resume"])
