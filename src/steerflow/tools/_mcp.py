"""MCP servers as tool sources: ``mcp_servers: {NAME: {command, env} | {url}}`` (issue 39).

Each server a run uses is started once, when a node first needs its tools, through the
official ``mcp`` SDK (stdio or streamable HTTP), and ended with the run. A stdio server's
stderr goes to ``<run_dir>/mcp/<NAME>.stderr`` (0600), so what it said is kept.

The SDK's transports are anyio context managers that must be entered and left by one
task, while a run's nodes call tools from their own tasks and the run ends the servers
from yet another. So each server has an owner task that enters its contexts, publishes
the session, and leaves them when told to; callers use the session directly (decision
261). A server that dies is restarted once; after a second death its tools answer with
the last lines of its stderr (decision 262). The SDK is imported only here, and only
when a plan declares servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from steerflow.errors import PlanValidationError, ProviderError
from steerflow.home import make_private_dirs
from steerflow.providers._base import ToolSpec
from steerflow.tools._specs import check_server_name
from steerflow.tools._toolset import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolOptions, ToolOutput

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

__all__ = ["McpServerConfig", "McpServers", "McpTool", "parse_mcp_servers"]

#: Lines of a dead server's stderr its tools answer with.
STDERR_TAIL_LINES = 20
#: How long a server may take to start and answer ``initialize``.
START_TIMEOUT_S = 30.0
#: How long a server whose call failed has to answer a ping before it counts as dead.
PING_TIMEOUT_S = 5.0
#: Restarts after the first start: one (issue 39 item 5).
MAX_RESTARTS = 1


@dataclass(frozen=True)
class McpServerConfig:
    """One ``mcp_servers`` entry: a stdio command with its environment, or a URL."""

    name: str
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None


def parse_mcp_servers(data: Mapping[str, Mapping[str, Any]]) -> dict[str, McpServerConfig]:
    """The servers of a plan's (stored) ``mcp_servers``.

    Raises:
        PlanValidationError: a server with a bad name, or not exactly one of command/url.
    """
    out: dict[str, McpServerConfig] = {}
    for name, spec in data.items():
        where = f"mcp_servers.{name}"
        check_server_name(name, where)
        command, url = spec.get("command"), spec.get("url")
        if (command is None) == (url is None):
            raise PlanValidationError(
                f"{where}: give exactly one of command (stdio) and url (streamable HTTP)"
            )
        if command is not None and (
            not isinstance(command, list | tuple) or not command
            or not all(isinstance(a, str) for a in command)
        ):  # fmt: skip
            raise PlanValidationError(f"{where}.command: a non-empty list of strings")
        env = dict(spec.get("env") or {})
        out[name] = McpServerConfig(
            name, tuple(command) if command else None, env, str(url) if url else None
        )
    return out


def _text(result: Any) -> str:
    """A ``CallToolResult``'s content as the text the model gets."""
    parts: list[str] = []
    for block in result.content or ():
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json")))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    return "\n".join(parts)


class _Server:
    """One server's session and the task that owns its SDK contexts."""

    def __init__(self, config: McpServerConfig, stderr_dir: Path) -> None:
        self.config = config
        self.stderr_path = stderr_dir / f"{config.name}.stderr"
        self.starts = 0
        self.session: ClientSession | None = None
        self.failure: str | None = None  # set once it may not be started again
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        #: Set when the server's output ended (it exited or closed stdout) while its
        #: session was open: the session can carry no call, so the next one starts it again.
        self.gone = asyncio.Event()
        self._lock = asyncio.Lock()

    async def ready(self) -> ClientSession:
        """The live session, (re)started if it is not running and may be."""
        async with self._lock:
            owner = self._owner
            live = owner is not None and not owner.done() and not self.gone.is_set()
            if self.session is not None and live:
                return self.session
            if self.failure is not None:
                raise ProviderError(self.failure)
            if self.starts > MAX_RESTARTS:
                self.failure = await self.said("stopped again after its restart")
                raise ProviderError(self.failure)
            await self._start()
            assert self.session is not None
            return self.session

    async def _start(self) -> None:
        await self._end_owner()
        self.starts += 1
        self._stop = asyncio.Event()
        self.gone = asyncio.Event()
        started: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        # Not the run's TaskGroup: the session outlives any one node, and this object
        # cancels and awaits its owner task itself (aclose, or a restart).
        self._owner = asyncio.get_running_loop().create_task(
            self._own(started), name=f"mcp-{self.config.name}"
        )
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                self.session = await asyncio.shield(started)
        except Exception as exc:  # a timeout too: like any failed start, retried once
            await self._end_owner()
            late = isinstance(exc, TimeoutError)
            what = f"did not start within {START_TIMEOUT_S:g} s" if late else _cause(exc)
            why = await self.said(f"could not start ({what})")
            if self.starts > MAX_RESTARTS:
                self.failure = why
            raise ProviderError(why) from None

    async def _own(self, started: asyncio.Future[ClientSession]) -> None:
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                read = _EndWatch(read, self.gone)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                started.set_result(session)
                await self._stop.wait()
        except BaseException as exc:  # a dead server ends here; its callers see it
            if not started.done():
                started.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    async def _transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        config = self.config
        if config.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            streams = await stack.enter_async_context(streamable_http_client(config.url))
            return streams[0], streams[1]
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert config.command is not None
        errlog = await asyncio.to_thread(_open_stderr, self.stderr_path)
        stack.callback(errlog.close)
        params = StdioServerParameters(
            command=config.command[0], args=list(config.command[1:]), env=dict(config.env)
        )
        streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        return streams[0], streams[1]

    async def said(self, what: str) -> str:
        """``what`` happened to the server, with the last lines of its stderr."""
        tail = await asyncio.to_thread(_tail, self.stderr_path)
        said = f"; its stderr ended with:\n{tail}" if tail else ""
        return f"MCP server {self.config.name!r} {what}{said}"

    async def answers(self, session: ClientSession) -> bool:
        """Whether the server still answers (a ping, bounded), after a call failed."""
        if self._owner is None or self._owner.done():
            return False
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await session.send_ping()
        except Exception:
            return False
        return True

    async def _end_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._stop.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(owner)
        except (TimeoutError, Exception):
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner

    async def aclose(self) -> None:
        await self._end_owner()


class _EndWatch:
    """The transport's read stream, setting ``gone`` when it ends.

    A server that died while idle is noticed when its output ends, not by the next call:
    a call sent to it would fail without a way to tell whether it left (the SDK answers
    "Connection closed" both before and after sending), so it could not be sent again.
    Knowing first, :meth:`_Server.ready` starts the server again and the call is sent
    once, to a live server (decision 299 replaces the idle case of decision 262).
    """

    def __init__(self, stream: Any, gone: asyncio.Event) -> None:
        self._stream = stream
        self._gone = gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # e.g. the SDK's duck-typed ``last_context``

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._gone.set()
            raise

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _EndWatch:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stream.__aexit__(*exc)

    async def aclose(self) -> None:
        await self._stream.aclose()


def _cause(exc: BaseException) -> str:
    """The first real error inside the SDK's task groups' ``ExceptionGroup`` wrapping."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _open_stderr(path: Path) -> TextIO:
    """The server's stderr file (0600, appended across a restart, no symlink followed)."""
    make_private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


class McpServers:
    """The MCP servers of one run, started on first use, ended by :meth:`aclose`."""

    def __init__(self, configs: Mapping[str, McpServerConfig], stderr_dir: Path) -> None:
        self.configs = dict(configs)
        self._servers = {name: _Server(c, stderr_dir) for name, c in self.configs.items()}

    def _server(self, name: str) -> _Server:
        server = self._servers.get(name)
        if server is None:
            known = ", ".join(sorted(self._servers)) or "none"
            raise PlanValidationError(
                f"mcp:{name}: no MCP server {name!r} is declared in mcp_servers (declared: {known})"
            )
        return server

    def running(self, name: str) -> bool:
        """Whether server ``name`` has a live session now (started, not ended or gone)."""
        server = self._server(name)
        owner = server._owner
        alive = owner is not None and not owner.done() and not server.gone.is_set()
        return alive and server.session is not None

    async def list_tools(
        self, name: str, options: Mapping[str, ToolOptions] | None = None
    ) -> list[McpTool]:
        """Every tool the server offers, as tools of this run."""
        server = self._server(name)
        session = await server.ready()
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            from mcp.types import PaginatedRequestParams

            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        opts = options or {}
        return [McpTool(self, name, t, opts.get(t.name)) for t in tools]

    async def call_tool(
        self, name: str, tool: str, args: Mapping[str, Any], *, timeout_s: float
    ) -> ToolOutput:
        """One call; a dead server, a timeout or an error result is an error output."""
        server = self._server(name)
        try:
            session = await server.ready()
        except ProviderError as exc:
            return ToolOutput(str(exc), is_error=True)
        try:
            async with asyncio.timeout(timeout_s):
                result = await session.call_tool(tool, dict(args))
        except TimeoutError:
            return ToolOutput(f"timed out after {timeout_s:g} s", is_error=True)
        except Exception as exc:
            # The call may have run: it is not sent again. A server that no longer
            # answers is ended here and started again for the next call (once).
            dead = not await server.answers(session)
            if dead:
                await server.aclose()
            state = "died" if dead else "failed"
            why = await server.said(f"{state} during the call ({_cause(exc)})")
            return ToolOutput(why, is_error=True)
        return ToolOutput(_text(result), is_error=bool(result.is_error))

    async def aclose(self) -> None:
        """End every server this run started."""
        for server in self._servers.values():
            await server.aclose()

    async def __aenter__(self) -> McpServers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class McpTool(Tool):
    """One tool of an MCP server; idempotent as ``tool_options`` say, else as it says."""

    def __init__(
        self, servers: McpServers, server: str, tool: Any, options: ToolOptions | None = None
    ) -> None:
        self.servers, self.server, self.name = servers, server, str(tool.name)
        schema = dict(tool.input_schema or {"type": "object", "properties": {}})
        self.spec = ToolSpec(self.name, str(tool.description or ""), schema)
        self.source = f"mcp:{server}/{self.name}"
        notes = tool.annotations
        # A read-only tool changes nothing, so calling it again is harmless too (MCP's
        # idempotentHint is only meaningful for tools that do write).
        hint = notes is not None and bool(notes.idempotent_hint or notes.read_only_hint)
        declared = options.idempotent if options is not None else None
        self.idempotent = bool(hint) if declared is None else declared
        timeout = options.timeout_s if options is not None else None
        self.timeout_s = DEFAULT_TOOL_TIMEOUT_S if timeout is None else timeout

    async def call(self, args: Mapping[str, Any]) -> ToolOutput:
        """Call it on its server (the server checks the arguments against its schema)."""
        return await self.servers.call_tool(self.server, self.name, args, timeout_s=self.timeout_s)
