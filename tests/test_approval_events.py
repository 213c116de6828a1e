"""Approvals from Python (issue 41): a ``FlowRun``'s ``ApprovalRequested`` event carries the
request, and ``steerflow.approve`` / ``steerflow.deny`` decide it through the state DB, as an
application's own button would. The model is ``script:`` with ``steps``; the tool is
``tests/tool_fns.py``'s ``post`` (which logs each call to ``$TOOL_LEDGER``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import steerflow
from steerflow.orchestrate import ApprovalRequested, FlowOptions, FlowRun
from steerflow.plan import Op, Plan
from steerflow.views import list_approvals

HOLD_S = 60.0


@pytest.fixture(autouse=True)
def _tool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_LEDGER", str(tmp_path / "ledger.jsonl"))


def _run(tmp_path: Path, **plan: Any) -> FlowRun:
    steps = [
        {"tool_calls": [{"name": "post", "args": {"message": "hello"}}]},
        {"response": "done"},
    ]
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"a": {"steps": steps}}), encoding="utf-8")
    ops = [Op("a", "say hello", tools=["python:tool_fns:post"])]
    options = FlowOptions(plan=Plan(ops, **plan), model=f"script:{script}", allow_python=True)
    return FlowRun(options, home=tmp_path / "home")


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def _decide_on_request(run: FlowRun, home: Path, decide: Any) -> ApprovalRequested:
    async for event in run.events():
        if isinstance(event, ApprovalRequested):
            await asyncio.to_thread(decide, home, event)
            return event
    raise AssertionError("no ApprovalRequested event")


async def test_approval_requested_then_steerflow_approve_runs_the_call(tmp_path: Path) -> None:
    run = _run(tmp_path, tool_options={"post": {"approval": "required"}})
    home = tmp_path / "home"

    def approve(home: Path, event: ApprovalRequested) -> None:
        [waiting] = list_approvals(home)
        assert waiting.request_id == event.request_id
        control = steerflow.approve(home, str(waiting.run_id), event.request_id)
        assert len(control) == 32

    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        event = await _decide_on_request(run, home, approve)
    assert (event.key, event.tool, event.args) == ("a", "post", {"message": "hello"})
    assert event.request_id.startswith("apr_")
    assert result.result().status == "completed"
    assert _ledger(tmp_path) == [{"tool": "post", "message": "hello"}]


async def test_steerflow_deny_keeps_the_call_from_running(tmp_path: Path) -> None:
    run = _run(tmp_path, tool_options={"post": {"approval": "required"}})
    home = tmp_path / "home"

    def deny(home: Path, event: ApprovalRequested) -> None:
        [waiting] = list_approvals(home)
        steerflow.deny(home, str(waiting.run_id), event.request_id, reason="not today")

    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        await _decide_on_request(run, home, deny)
    assert result.result().status == "completed"
    assert _ledger(tmp_path) == []


def test_op_and_role_approval_fields_round_trip_through_a_plan_file(tmp_path: Path) -> None:
    from steerflow.plan import Role

    plan = Plan(
        [Op("a", "publish", approval="required", approve=["post"], assignee="w")],
        roles={"w": Role(approve=["git_*"])},
        approval_timeout_s=90,
    )
    path = tmp_path / "p.yaml"
    path.write_text(plan.to_yaml(), encoding="utf-8")
    assert Plan.from_file(path) == plan
    data = plan.to_data()
    assert data["plan"][0]["approval"] == "required" and data["roles"]["w"]["approve"] == ["git_*"]
    assert data["approval_timeout_s"] == 90


async def test_an_op_with_approval_required_waits_and_a_denial_fails_it(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"a": {"response": "published"}}), encoding="utf-8")
    plan = Plan([Op("a", "publish the post", approval="required")])
    run = FlowRun(FlowOptions(plan=plan, model=f"script:{script}"), home=tmp_path / "home")
    home = tmp_path / "home"

    def deny(home: Path, event: ApprovalRequested) -> None:
        assert (event.tool, event.args) == (None, {"instruction": "publish the post"})
        [waiting] = list_approvals(home)
        steerflow.deny(home, str(waiting.run_id), event.request_id, reason="legal said no")

    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        await _decide_on_request(run, home, deny)
    done = result.result()
    assert done.status == "failed"
    assert not (home / "script-invocations.jsonl").exists()  # the model was never called
