"""``steerflow mcp`` and ``steerflow studio``: the servers over ``steerflow.views``.

Their extras (the MCP SDK, Starlette, uvicorn) are imported only when one of them serves.
"""

from __future__ import annotations

import click

from steerflow.cli._common import UNEXPECTED, home_of
from steerflow.cli._output import emit_text

__all__ = ["mcp_command", "studio_command"]


MCP_EPILOG = (
    "\b\nExit codes:\n  0    the client closed the connection\n"
    + UNEXPECTED
    + "  2    usage error (bad flags, or the mcp extra is not installed)\n"
)


@click.command("mcp", epilog=MCP_EPILOG)
@click.option(
    "--allow-control",
    is_flag=True,
    help="Also offer the tools pause, resume, message and stop, which steer running flows "
    "as `steerflow ctl` does; without it the server only reads.",
)
@click.pass_context
def mcp_command(ctx: click.Context, allow_control: bool) -> int:
    """Serve runs to an agent: an MCP server on stdin/stdout (needs the extra `mcp`).

    \b
    Tools: list_runs, show_run, node_detail, checkpoint_report, resume_preflight;
    with --allow-control also pause, resume, message, stop.
    """
    from steerflow.mcp import serve

    serve(home_of(ctx, create=False), allow_control=allow_control)
    return 0


STUDIO_EPILOG = (
    "\b\nExit codes:\n  0    stopped (SIGINT/SIGTERM)\n"
    + UNEXPECTED
    + "  2    usage error (bad flags, a non-loopback --host without --allow-remote, an\n"
    "       address that cannot be bound, or the studio extra is not installed)\n"
)


@click.command("studio", epilog=STUDIO_EPILOG)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port; the printed URL names it).",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser.")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a --host other than loopback (anyone who can reach it and has the URL's "
    "token can steer your runs).",
)
@click.pass_context
def studio_command(
    ctx: click.Context, host: str, port: int, open_browser: bool, allow_remote: bool
) -> int:
    """Watch and steer runs in a browser (needs the extra `studio`).

    Prints the URL to open; it carries a one-time access token, which the first page
    load moves into a cookie. Stop with Ctrl-C.
    """
    from steerflow.studio import serve

    serve(
        home_of(ctx),
        host=host,
        port=port,
        allow_remote=allow_remote,
        open_browser=open_browser,
        on_ready=lambda url: emit_text(f"steerflow studio: {url}"),
    )
    return 0
