"""A tool node in a real flow, in process (issue 39 items 4 and 6): its steps are typed
events in order; a pause holds the loop at its next step and a stop ends it between steps,
the node left pending and resumable from the steps on record.

The model is ``script:`` with ``steps``; the tools are ``tests/tool_fns.py`` functions
(``python:tool_fns:...``); ``wait_for_release`` holds a tool until the test creates its file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

import steerflow
from steerflow.orchestrate import (
    FlowOptions,
    FlowRun,
    ModelStep,
    NodeCompleted,
    NodePaused,
    RunEvent,
    ToolCallEnded,
    ToolCallStarted,
)
from steerflow.plan import Op, Plan

HOLD_S = 30.0


@pytest.fixture(autouse=True)
def _tool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("TOOL_RELEASE", str(tmp_path / "release"))


def _model(tmp_path: Path, steps: list[dict[str, Any]]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({"a": {"steps": steps}}), encoding="utf-8")
    return f"script:{path}"


def _calls(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


TOOLS = ["python:tool_fns:wait_for_release", "python:tool_fns:lookup"]


def _label(event: RunEvent) -> tuple[Any, ...] | None:
    match event:
        case ModelStep():
            return ("model", event.index, event.tool_calls)
        case ToolCallStarted():
            return ("start", event.index, event.tool, tuple(sorted(event.args.items())))
        case ToolCallEnded():
            return ("end", event.index, event.tool, event.status)
        case NodeCompleted():
            return ("completed", event.key)
    return None


async def test_each_step_is_a_typed_event_in_order(tmp_path: Path) -> None:
    (tmp_path / "release").touch()
    model = _model(tmp_path, [_calls("lookup", key="k"), {"response": "done"}])
    plan = Plan([Op("a", "look it up", tools=TOOLS)])
    run = FlowRun(FlowOptions(plan=plan, model=model, allow_python=True), home=tmp_path / "h")
    seen: list[tuple[Any, ...]] = []
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        async for event in run.events():
            if (label := _label(event)) is not None:
                seen.append(label)
    assert result.result().status == "completed"
    assert seen == [
        ("model", 1, ("lookup",)),
        ("start", 2, "lookup", (("key", "k"),)),
        ("end", 2, "lookup", "completed"),
        ("model", 3, ()),
        ("completed", "a"),
    ]


async def test_a_pause_holds_the_loop_and_a_stop_ends_it_between_steps(tmp_path: Path) -> None:
    home = tmp_path / "h"
    steps = [_calls("wait_for_release", tag="first"), _calls("lookup", key="k"),
             {"response": "done"}]  # fmt: skip
    model = _model(tmp_path, steps)
    plan = Plan([Op("a", "work", tools=TOOLS)])
    run = FlowRun(FlowOptions(plan=plan, model=model, allow_python=True), home=home)
    seen: list[RunEvent] = []
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        async for event in run.events():
            seen.append(event)
            if isinstance(event, ToolCallStarted) and event.tool == "wait_for_release":
                assert run.session_id is not None
                await asyncio.to_thread(steerflow.pause, home, run.session_id)
            if type(event).__name__ == "ControlApplied" and getattr(event, "verb", "") == "pause":
                (tmp_path / "release").touch()  # the tool returns; the loop meets the gate
            if isinstance(event, NodePaused):
                assert run.session_id is not None
                await asyncio.to_thread(steerflow.stop, home, run.session_id, reason="enough")
    done = result.result()
    assert done.status == "stopped"
    # The tool call ended and is on record; the next model request never left.
    models = [e.index for e in seen if isinstance(e, ModelStep)]
    ended = [(e.index, e.status) for e in seen if isinstance(e, ToolCallEnded)]
    assert (models, ended) == ([1], [(2, "completed")])
    node = await asyncio.to_thread(steerflow.views.node_detail, home, done.run_id or "", "a")
    assert node.status == "pending"
    assert [(s["index"], s["status"]) for s in node.raw["steps"]] == [
        (1, "completed"),
        (2, "completed"),
    ]
