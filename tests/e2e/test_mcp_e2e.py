"""``steerflow mcp``: the SDK's own stdio client drives the server as a real subprocess.

Reads: the tools answer what ``runs``/``show``/``show RUN NODE``/``resume --dry-run``
print. Control: only with ``--allow-control``, and then a live ``steerflow flow``
subprocess holds its next node after ``pause``, renders ``message`` into it after
``resume``, and exits 75 after ``stop``. Waits are on conditions (state DB rows, node
statuses, the script model's invocation log), run in a thread so the client's tasks
keep running.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.client.session as mcp_session
import mcp.client.stdio as mcp_stdio
from ctl_support import (
    clean_env,
    ctl_status,
    invocations,
    live_flow,
    node_statuses,
    run_cli,
    wait_stamped,
    write_yaml,
)

from waiting import holds_for

READ_TOOLS = {
    "list_runs",
    "show_run",
    "node_detail",
    "checkpoint_report",
    "resume_preflight",
    "list_approvals",
}
CONTROL_TOOLS = {"pause", "resume", "message", "stop", "budget", "approve", "deny"}
# Holds a node's `script:` call until the test releases it (see its docstring).
GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")


@asynccontextmanager
async def _client(home: Path, *extra: str) -> AsyncIterator[Any]:
    params = mcp_stdio.StdioServerParameters(
        command=sys.executable,
        args=["-m", "steerflow", "--home", str(home), "mcp", *extra],
        env=clean_env(),
    )
    async with (
        mcp_stdio.stdio_client(params) as (read, write),
        mcp_session.ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _call(session: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    value: dict[str, Any] = result.structured_content
    return value


def _plan(tmp_path: Path, script: dict[str, Any]) -> list[str]:
    write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "mcp",
            "plan": [
                {"agent_id": "a", "instruction": "first"},
                {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
                {"agent_id": "c", "instruction": "third", "depends_on": ["b"]},
            ],
        },
    )
    write_yaml(tmp_path / "script.yaml", script)
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{tmp_path / 'script.yaml'}"]


async def test_reads_runs_and_a_node_without_control_tools(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = run_cli(
        home, "flow", *_plan(tmp_path, {"b": {"response": "<script>beta</script>"}}), "--json"
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]

    async with _client(home) as session:
        tools = {t.name for t in (await session.list_tools()).tools}
        assert tools == READ_TOOLS  # no control without --allow-control

        runs = await _call(session, "list_runs")
        assert runs == json.loads(run_cli(home, "runs", "--json").stdout)
        assert [r["run_id"] for r in runs["runs"]] == [run]

        node = await _call(session, "node_detail", target=run[:15], node="b")
        assert node == json.loads(run_cli(home, "show", run, "b", "--json").stdout)
        assert node["response"] == "<script>beta</script>" and node["status"] == "completed"

        shown = await _call(session, "show_run", target=run)
        assert shown == json.loads(run_cli(home, "show", run, "--json").stdout)
        # An ended run has no phase left (issue 38 item 7: it read `executing`), in the
        # CLI's JSON as here; `ctl status` keeps the stored column.
        assert shown["status"] == "completed" and shown["phase"] is None
        assert runs["runs"][0]["phase"] is None
        assert ctl_status(home, shown["session_id"])["phase"] == "executing"
        report = await _call(session, "checkpoint_report", target=run)
        assert report["status"] == "clean" and report["checkpoint_recovery"]["status"] == "clean"
        preflight = await _call(session, "resume_preflight", target=run)
        assert preflight["allowed"] and preflight["replayed"] == ["a", "b", "c"]

        # A refusal reaches the client as a tool error naming the code and the id.
        missing = await session.call_tool("node_detail", {"target": run, "node": "zz"})
        assert missing.is_error
        assert (
            "unknown-id (exit 3)" in missing.content[0].text and "'zz'" in missing.content[0].text
        )
        # The control tools do not exist here, so they cannot be called either.
        refused = await session.call_tool("pause", {"target": run})
        assert refused.is_error


def _held(home: Path, session_id: str, node: str, window_s: float) -> None:
    """Over ``window_s``, ``node`` stays ``paused`` and its provider is never called."""

    def check() -> None:
        assert node_statuses(home, session_id)[node] == "paused"
        assert node not in [line["node"] for line in invocations(home)]

    holds_for(check, seconds=window_s)


async def test_allow_control_pauses_messages_resumes_and_stops_a_live_flow(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    # a and b are held (gated_cli.py) until the test released them: each control below
    # lands while its node is in flight however slow the machine, no duration guessed.
    home.mkdir(mode=0o700)
    for key in "ab":
        (home / f"gate-{key}").touch()
    args = _plan(tmp_path, {})
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    with live_flow(home, args, argv=argv) as flow:
        sid = flow.session_id
        await asyncio.to_thread(
            flow.wait_nodes, lambda s: s.get("a") == "running", what="a running"
        )
        async with _client(home, "--allow-control") as session:
            tools = {t.name for t in (await session.list_tools()).tools}
            assert tools == READ_TOOLS | CONTROL_TOOLS

            paused = await _call(session, "pause", target=sid[:8])
            assert (paused["session_id"], paused["verb"], paused["queued"]) == (sid, "pause", True)
            row = await asyncio.to_thread(wait_stamped, home, paused["control_id"], alive=flow.proc)
            assert row.result == "applied"
            status = await asyncio.to_thread(ctl_status, home, sid)
            assert status["phase"] == "paused"
            assert [(c["id"], c["result"]) for c in status["controls"]] == [
                (paused["control_id"], "applied")
            ]
            # `a` finishes; `b`, the next node, is held at the gate.
            (home / "release-a").touch()
            await asyncio.to_thread(
                flow.wait_nodes,
                lambda s: s["a"] == "completed" and s["b"] == "paused",
                what="a completed and b held",
            )
            await asyncio.to_thread(_held, home, sid, "b", 0.5)
            shown = await _call(session, "show_run", target=sid)
            assert shown["phase"] == "paused"

            sent = await _call(session, "message", target=sid, text="use the <b>metric</b> units")
            released = await _call(session, "resume", target=sid)
            for control_id in (sent["control_id"], released["control_id"]):
                row = await asyncio.to_thread(wait_stamped, home, control_id, alive=flow.proc)
                assert row.result is not None and row.result.startswith("applied"), row.result
            await asyncio.to_thread(
                flow.wait_nodes, lambda s: s["b"] == "running", what="b released"
            )
            node = await _call(session, "node_detail", target=sid, node="b")
            assert "use the <b>metric</b> units" in (node["instruction"] or "")

            stopped = await _call(session, "stop", target=sid, reason="enough")
            assert stopped["verb"] == "stop"
            stop_id = stopped["control_id"]
            row = await asyncio.to_thread(wait_stamped, home, stop_id, alive=flow.proc)
            assert row.result == "applied"
            (home / "release-b").touch()  # graceful: the in-flight b finishes, c never starts
            assert await asyncio.to_thread(flow.finish) == 75
        statuses = node_statuses(home, sid)
        assert statuses["b"] == "completed" and statuses["c"] == "pending", statuses
        assert "c" not in [line["node"] for line in invocations(home)]


def test_without_the_extra_mcp_names_the_install_and_exits_2(tmp_path: Path) -> None:
    # A package named `mcp` that cannot be imported stands in for a missing SDK.
    shadow = tmp_path / "shadow" / "mcp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mcp'\", name='mcp')\n", encoding="utf-8"
    )
    env = {"PYTHONPATH": str(tmp_path / "shadow")}
    proc = run_cli(tmp_path / "home", "mcp", env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'steerflow[mcp]'" in lines[0], proc.stderr
    assert proc.stdout == ""


async def test_the_server_in_process_answers_every_tool(tmp_path: Path) -> None:
    """The same server object, driven by the SDK's in-process client (no subprocess)."""
    from mcp import Client

    from steerflow.mcp import CONTROL_TOOLS as CONTROL
    from steerflow.mcp import READ_TOOLS as READ
    from steerflow.mcp import build_server

    assert set(READ) == READ_TOOLS and set(CONTROL) == CONTROL_TOOLS
    home = tmp_path / "home"
    done = await asyncio.to_thread(
        run_cli, home, "flow", *_plan(tmp_path, {"b": {"fail": "broken"}}), "--json"
    )
    assert done.returncode == 1, done.stderr
    run, session = json.loads(done.stdout)["run_id"], json.loads(done.stdout)["session_id"]

    async with Client(build_server(home, allow_control=True)) as client:
        assert {t.name for t in (await client.list_tools()).tools} == READ_TOOLS | CONTROL_TOOLS
        runs = await _call(client, "list_runs", limit=0, status="failed")
        assert [r["run_id"] for r in runs["runs"]] == [run]
        refused = await _call(client, "resume_preflight", target=run)
        assert not refused["allowed"] and refused["refusal"]["code"] == "resume-refused"
        allowed = await _call(client, "resume_preflight", target=run, retry_failed=True)
        assert allowed["allowed"] and allowed["to_run"] == ["b", "c"]
        # Rerun from a node (issue 40 item 6): a fork's dry run, b failed or not.
        rerun = await _call(client, "resume_preflight", target=run, from_node="a",
                            instruction="Do a again.")  # fmt: skip
        assert rerun["allowed"] and rerun["rerun_from"]["rerun"] == ["a", "b", "c"]
        assert rerun["rerun_from"]["instruction_edited"]["instruction"] == "Do a again."
        unknown = await _call(client, "resume_preflight", target=run, from_node="zz")
        assert unknown["refusal"]["code"] == "usage" and "'zz'" in unknown["refusal"]["message"]
        report = await _call(client, "checkpoint_report", target=run)
        assert report["status"] == "clean"
        assert (await _call(client, "show_run", target=run))["status"] == "failed"
        node = await _call(client, "node_detail", target=run, node="b")
        assert node["status"] == "failed" and "broken" in node["error"]
        # The writers are ctl's: a finished session refuses every verb, naming why.
        for tool, arguments in (
            ("pause", {}), ("resume", {}), ("message", {"text": "hi"}), ("stop", {"now": True}),
            ("budget", {"max_cost": 1.0}),
        ):  # fmt: skip
            result = await client.call_tool(tool, {"target": session, **arguments})
            assert result.is_error, tool
            assert "not-running (exit 3)" in result.content[0].text, result.content
