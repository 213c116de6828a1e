"""A real MCP server for the tests, written with the SDK's server API (``MCPServer``).

    python mcp_fixture_server.py stdio           # over stdin/stdout
    python mcp_fixture_server.py http PORTFILE   # streamable HTTP on 127.0.0.1, a free port
                                                 # (written to PORTFILE once it listens)

Every ``post`` call appends a line to ``$MCP_LEDGER`` (so a test counts side effects
across processes); ``die`` ends the process mid-call, after a line on stderr.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("steerflow-test")


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def peek() -> str:
    """Read-only: changes nothing."""
    return "nothing changed"


@server.tool()
def post(message: str) -> str:
    """Post a message (a side effect)."""
    with open(os.environ["MCP_LEDGER"], "a", encoding="utf-8") as out:
        out.write(message + "\n")
    return f"posted {message}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason (a ToolError's text reaches the client)."""
    raise ToolError(reason)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> int:
    """This server's process id (a test kills it while it is idle)."""
    return os.getpid()


@server.tool()
def die() -> str:
    """End the server process in the middle of the call."""
    print("fixture server: dying on purpose", file=sys.stderr, flush=True)
    os._exit(3)


def _serve_http(port_file: Path) -> None:
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    # Listening before the port is told: a client that connects while uvicorn still
    # starts waits in the backlog instead of being refused.
    listener.listen(128)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    port = listener.getsockname()[1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(port_file)  # the test waits for this file: the socket is bound already
    uv.run(sockets=[listener])


if __name__ == "__main__":
    print("fixture server: started", file=sys.stderr, flush=True)
    if sys.argv[1] == "http":
        _serve_http(Path(sys.argv[2]))
    else:
        server.run("stdio")
