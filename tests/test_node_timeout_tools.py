"""``timeout_s`` on a tool node bounds its whole loop (issue 40 item 1, decision 279).

In process, real parts: a ``script:`` model whose first step calls a ``python:`` tool
that holds until released (never, here); the node fails naming its limit while another
node, at its own entry model, completes: the run goes on.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

import steerflow
from steerflow.plan import Op, Plan
from steerflow.views import node_detail


@pytest.fixture(autouse=True)
def _tool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("TOOL_RELEASE", str(tmp_path / "release"))


async def test_a_tool_node_longer_than_timeout_s_fails_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.yaml"
    steps = [{"tool_calls": [{"name": "wait_for_release", "args": {"tag": "t"}}]},
             {"response": "never"}]  # fmt: skip
    script.write_text(yaml.safe_dump({"a": {"steps": steps}}), encoding="utf-8")
    plan = Plan(
        [
            Op("a", "hold", tools=["python:tool_fns:wait_for_release"], timeout_s=0.5),
            Op("b", "quick", model="echo"),
        ]
    )
    options = steerflow.FlowOptions(plan=plan, model=f"script:{script}", allow_python=True)
    started = time.monotonic()
    async with asyncio.timeout(60):
        result = await steerflow.run_flow(options, home=tmp_path / "home")
    nodes = {node["id"]: node for node in result.nodes}
    assert nodes["a"]["status"] == "failed"
    assert nodes["b"]["status"] == "completed"
    detail = await asyncio.to_thread(node_detail, tmp_path / "home", result.run_id, "a")
    assert detail.error == (
        "node 'a': the call took longer than its timeout_s of 0.5 s and was stopped"
    )
    assert result.status == "failed"
    assert time.monotonic() - started < 30
