"""MCP servers as tools (tools._mcp, tools._build): a real stdio server written with the
SDK's server API, and the same server over streamable HTTP on loopback (issue 39 items
1 and 5). Its stderr is kept in the run directory; a server that dies is restarted once,
then its tools fail with the last lines of its stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from steerflow.errors import PlanValidationError
from steerflow.tools import ToolOptions
from steerflow.tools._build import build_toolset
from steerflow.tools._mcp import McpServers, parse_mcp_servers
from waiting import wait_until, wait_until_async

SERVER = Path(__file__).resolve().with_name("mcp_fixture_server.py")

pytestmark = pytest.mark.timeout(60)


def _stdio(tmp_path: Path) -> dict[str, dict[str, object]]:
    env = {"MCP_LEDGER": str(tmp_path / "ledger.txt")}
    return {"fx": {"command": [sys.executable, str(SERVER), "stdio"], "env": env}}


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[McpServers]:
    async with McpServers(parse_mcp_servers(_stdio(tmp_path)), tmp_path / "mcp") as running:
        yield running


async def test_a_stdio_servers_tools_are_listed_called_and_its_stderr_kept(
    servers: McpServers, tmp_path: Path
) -> None:
    options = {"post": ToolOptions(timeout_s=5)}
    toolset = await build_toolset(["mcp:fx"], servers=servers, options=options)
    assert sorted(toolset.tools) == ["add", "die", "fail", "peek", "pid", "post"]
    assert toolset.tools["peek"].idempotent is True  # readOnlyHint alone
    add = toolset.tools["add"]
    assert add.idempotent is True and add.source == "mcp:fx/add"  # its idempotentHint
    assert toolset.tools["post"].idempotent is False and toolset.tools["post"].timeout_s == 5
    assert add.spec.parameters["properties"].keys() == {"a", "b"}

    out = await toolset.call("add", {"a": 2, "b": 3})
    assert (out.content, out.is_error) == ("5", False)
    bad = await toolset.call("add", {"a": "x"})
    assert bad.is_error  # the server checked the arguments: the model hears why
    failed = await toolset.call("fail", {"reason": "no such file"})
    assert failed.is_error and "no such file" in failed.content
    await toolset.call("post", {"message": "hi"})
    assert (tmp_path / "ledger.txt").read_text() == "hi\n"

    stderr = tmp_path / "mcp" / "fx.stderr"
    assert "fixture server: started" in stderr.read_text()
    assert stderr.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "mcp").stat().st_mode & 0o777 == 0o700


async def test_one_tool_of_a_server_and_the_refusals(servers: McpServers) -> None:
    toolset = await build_toolset(["mcp:fx/add"], servers=servers)
    assert list(toolset.tools) == ["add"]
    with pytest.raises(PlanValidationError, match="offers no tool 'nope'"):
        await build_toolset(["mcp:fx/nope"], servers=servers)
    with pytest.raises(PlanValidationError, match="no MCP server 'other'"):
        await build_toolset(["mcp:other"], servers=servers)
    unknown = await toolset.call("post", {"message": "x"})
    assert unknown.is_error and "the tools are: add" in unknown.content


async def test_a_server_that_dies_is_restarted_once_then_fails_with_its_stderr(
    servers: McpServers, tmp_path: Path
) -> None:
    toolset = await build_toolset(["mcp:fx"], servers=servers)
    died = await toolset.call("die", {})
    assert died.is_error and "dying on purpose" in died.content
    again = await toolset.call("add", {"a": 1, "b": 1})
    assert (again.content, again.is_error) == ("2", False)  # restarted
    assert (await toolset.call("die", {})).is_error
    gone = await toolset.call("add", {"a": 1, "b": 1})
    assert gone.is_error and "after its restart" in gone.content
    assert "dying on purpose" in gone.content
    # A failed server stays failed: its tools keep answering with why.
    assert "after its restart" in (await toolset.call("add", {"a": 0, "b": 0})).content


async def test_a_server_that_died_while_idle_is_started_again_before_the_next_call(
    servers: McpServers, tmp_path: Path
) -> None:
    toolset = await build_toolset(["mcp:fx"], servers=servers)
    pid = int((await toolset.call("pid", {})).content)
    os.kill(pid, signal.SIGKILL)
    # Its output ends with it: the session is known dead before any call meets it.
    await wait_until_async(lambda: not servers.running("fx"), timeout=10, what="server gone")
    posted = await toolset.call("post", {"message": "after"})
    assert (posted.content, posted.is_error) == ("posted after", False)
    assert (tmp_path / "ledger.txt").read_text() == "after\n"  # sent once, to the new server
    assert int((await toolset.call("pid", {})).content) != pid
    assert servers.running("fx")


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port_file = tmp_path / "port"
    env = {"MCP_LEDGER": str(tmp_path / "ledger.txt"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port_file)], env=env)
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, timeout=30,
                   what="the HTTP MCP server to listen")  # fmt: skip
        assert proc.poll() is None, "the HTTP MCP server exited"
        yield f"http://127.0.0.1:{port_file.read_text()}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_a_server_over_streamable_http_on_loopback(http_server: str, tmp_path: Path) -> None:
    configs = parse_mcp_servers({"web": {"url": http_server}})
    async with McpServers(configs, tmp_path / "mcp") as servers:
        toolset = await build_toolset(["mcp:web"], servers=servers)
        assert "post" in toolset.tools
        out = await toolset.call("post", {"message": "over http"})
        assert (out.content, out.is_error) == ("posted over http", False)
    assert (tmp_path / "ledger.txt").read_text() == "over http\n"


def test_a_malformed_server_is_refused_naming_it() -> None:
    with pytest.raises(PlanValidationError, match=r"mcp_servers\.x: give exactly one"):
        parse_mcp_servers({"x": {"command": ["a"], "url": "http://127.0.0.1/"}})
    with pytest.raises(PlanValidationError, match="letters, digits"):
        parse_mcp_servers({"a/b": {"url": "http://127.0.0.1/"}})
