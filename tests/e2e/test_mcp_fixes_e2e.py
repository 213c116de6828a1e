"""``steerflow mcp`` defects of issue 32, through the SDK's own stdio client.

The sessions are real rows in a real state DB (``StateDB.create_session``): a running
one is owned by this test process, so it reads as live, and the server's writers take
it as a ``ctl`` target.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.client.session as mcp_session
import mcp.client.stdio as mcp_stdio
from ctl_support import clean_env

from steerflow.state import StateDB


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
        yield session, await session.initialize()


def _home_with_runs(tmp_path: Path) -> tuple[Path, list[str]]:
    """Three failed runs, then three newer completed ones; returns the failed sessions."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    failed = []
    with StateDB.open(home) as db:
        for i in range(6):
            row = db.create_session(kind="flow", run_id=f"20260101T00000{i}-00000{i}")
            db.set_session_status(row.id, "failed" if i < 3 else "completed")
            if i < 3:
                failed.append(row.id)
    return home, failed


async def test_list_runs_filters_before_the_limit_and_refuses_bad_arguments(
    tmp_path: Path,
) -> None:
    home, failed = _home_with_runs(tmp_path)
    async with _client(home) as (session, _):
        got = await session.call_tool("list_runs", {"limit": 2, "status": "failed"})
        assert not got.is_error
        rows = got.structured_content["runs"]
        # Newest first: the two newest of the three failed runs.
        assert [r["session_id"] for r in rows] == failed[::-1][:2]
        assert all(r["status"] == "failed" for r in rows)
        for bad in ({"status": "bogus"}, {"limit": -1}):
            refused = await session.call_tool("list_runs", bad)
            assert refused.is_error, bad
            assert "usage" in refused.content[0].text
        # A string is not a boolean: "yes" must not turn a retry on.
        run = "20260101T000000-000000"
        loose = await session.call_tool("resume_preflight", {"target": run, "retry_failed": "yes"})
        assert loose.is_error


async def test_a_run_id_is_a_control_target(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    run = "20260101T000000-abcdef"
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=run, phase="executing")
    async with _client(home, "--allow-control") as (session, _):
        sent = await session.call_tool("message", {"target": run, "text": "use metric units"})
        assert not sent.is_error, sent.content
        assert sent.structured_content["session_id"] == row.id
        stopped = await session.call_tool("stop", {"target": run, "now": True, "reason": "r"})
        assert not stopped.is_error, stopped.content
        assert stopped.structured_content["verb"] == "stop"
    with StateDB.open(home, create=False) as db:
        verbs = [c.verb for c in db.list_controls(row.id)]
    assert verbs == ["message", "stop"]


async def test_read_only_server_leaves_a_missing_home_missing(tmp_path: Path) -> None:
    home = tmp_path / "absent"
    async with _client(home) as (session, init):
        assert init.server_info.version  # not the SDK's empty default
        got = await session.call_tool("list_runs", {})
        assert not got.is_error and got.structured_content == {"runs": []}
    assert not home.exists()
