"""The MCP server: one tool per view, each answering the JSON the matching command prints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Strict

from steerflow import views
from steerflow.control import Queued, enqueue_control
from steerflow.control._decide import send_decision
from steerflow.errors import SteerflowError, UsageError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = ["CONTROL_TOOLS", "INSTALL_HINT", "READ_TOOLS", "build_server", "serve"]

#: Tools every server offers: they only read.
READ_TOOLS = (
    "list_runs",
    "show_run",
    "node_detail",
    "checkpoint_report",
    "resume_preflight",
    "list_approvals",
)
#: Tools offered only with ``--allow-control``: they steer running flows.
CONTROL_TOOLS = ("pause", "resume", "message", "stop", "budget", "approve", "deny")
INSTALL_HINT = "pip install 'steerflow[mcp]'"

T = TypeVar("T")
#: A JSON boolean only: pydantic's lax mode would read "yes" or 1 as true.
Flag = Annotated[bool, Strict()]

_INSTRUCTIONS = (
    "Read steerflow runs: list_runs (newest first), show_run (status, phase, every node), "
    "node_detail (one node: the instruction as the provider received it, the response), "
    "checkpoint_report (how the checkpoint loads) and resume_preflight (what `steerflow "
    "resume --dry-run` would replay and run, or why it refuses). TARGET is a run id or "
    "unambiguous prefix, a run directory, or a session/invocation/play id."
)


def _sdk() -> type[MCPServer[Any]]:
    """The SDK's server class, or a usage error naming the extra to install."""
    try:
        from mcp.server.mcpserver import MCPServer
    except ImportError as exc:
        raise UsageError(
            f"steerflow mcp needs the optional MCP SDK ({exc.name or 'mcp'} is not "
            f"installed): {INSTALL_HINT}"
        ) from None
    return MCPServer


def _answer(read: Callable[[], T]) -> T:
    """Run a view; a refusal reaches the client as a tool error with its code and message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return read()
    except SteerflowError as exc:
        raise ToolError(f"{exc.code} (exit {int(exc.exit_code)}): {exc}") from None


def _queued(queued: Queued) -> dict[str, Any]:
    return {
        "control_id": queued.control_id,
        "session_id": queued.session_id,
        "verb": queued.verb,
        "sender": queued.sender,
        "queued": True,
        "note": "queued, not yet applied: the flow's poller applies it and stamps its "
        "result (show_run's phase; `steerflow ctl status`)",
    }


def build_server(home: Path, *, allow_control: bool = False) -> MCPServer[Any]:
    """An MCP server reading ``home``; the control tools only with ``allow_control``.

    Raises:
        UsageError: The ``mcp`` SDK is not installed.
    """
    server = _sdk()(
        name="steerflow", version=_version(), instructions=_INSTRUCTIONS, log_level="WARNING"
    )

    def list_runs(limit: int = 20, status: str | None = None) -> dict[str, Any]:
        """Runs, newest first: at most `limit` (0: all), only those with `status` if given.

        The status filter applies before the limit; an unknown status or a negative limit
        is an error.
        """
        runs = _answer(lambda: views.list_runs(home, limit=limit or None, status=status))
        return {"runs": [r.to_json() for r in runs]}

    def show_run(target: str) -> dict[str, Any]:
        """One run: status, phase, every node's live status, checkpoint and its report."""
        return _answer(lambda: views.show_run(home, target)).to_json()

    def node_detail(target: str, node: str) -> dict[str, Any]:
        """One node of a run in full: instruction as sent, response, error, usage, artifacts."""
        return _answer(lambda: views.node_detail(home, target, node)).to_json()

    def checkpoint_report(target: str) -> dict[str, Any]:
        """How the run's checkpoint loads: clean, recovered_prefix, refused or missing."""
        return _answer(lambda: views.checkpoint_report(home, target)).to_json()

    def resume_preflight(
        target: str,
        retry_failed: Flag = False,
        allow_degraded_context: Flag = False,
        fork: Flag = False,
        rerun_unsettled: Flag = False,
        redeliver_claimed: Flag = False,
        from_node: str | None = None,
        instruction: str | None = None,
    ) -> dict[str, Any]:
        """What `steerflow resume TARGET --dry-run` would replay and run, or why it refuses.

        Lists the operator messages a dead process left behind (`stranded_messages`),
        and the calls that were in flight when it died and may have been paid
        (`in_flight_calls`: node, attempt, model, started_at, reserved_cost_usd).
        `from_node` (and `instruction`): `resume --from NODE [--instruction TEXT]`, a fork
        rerunning NODE and what is downstream of it; `rerun_from.rerun` lists what it pays.
        """
        return _answer(
            lambda: views.resume_preflight(
                home,
                target,
                retry_failed=retry_failed,
                allow_degraded_context=allow_degraded_context,
                fork=fork,
                rerun_unsettled=rerun_unsettled,
                redeliver_claimed=redeliver_claimed,
                from_node=from_node,
                instruction=instruction,
            )
        ).to_json()

    def list_approvals() -> dict[str, Any]:
        """Tool calls and nodes that wait for an operator's approval, across runs.

        Each: request_id, run_id, node, tool (null for a node's own call), args, the
        model's text before the call, requested_at, and the run's status.
        """
        found = _answer(lambda: views.list_approvals(home))
        return {"approvals": [r.to_json() for r in found]}

    reads = (list_runs, show_run, node_detail, checkpoint_report, resume_preflight)
    for tool in (*reads, list_approvals):
        server.add_tool(tool, name=tool.__name__, annotations=_read_only())
    if allow_control:
        _add_control_tools(server, home)
    return server


def _version() -> str:
    """The installed distribution's version (the facade is not imported from a layer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("steerflow")
    except PackageNotFoundError:  # a source tree without metadata: still not empty
        return "0+unknown"


def _read_only() -> Any:
    from mcp.types import ToolAnnotations

    return ToolAnnotations(read_only_hint=True, open_world_hint=False)


def _add_control_tools(server: MCPServer[Any], home: Path) -> None:
    def pause(target: str) -> dict[str, Any]:
        """Queue `ctl pause`: hold every operation of a running flow that has not started."""
        return _queued(_answer(lambda: _enqueue(home, target, "pause")))

    def resume(target: str) -> dict[str, Any]:
        """Queue `ctl resume`: release a paused flow (not a resume from a checkpoint)."""
        return _queued(_answer(lambda: _enqueue(home, target, "resume")))

    def message(target: str, text: str) -> dict[str, Any]:
        """Queue `ctl msg`: a correction rendered into the flow's next operation, once."""
        return _queued(_answer(lambda: _enqueue(home, target, "message", text)))

    def stop(target: str, now: Flag = False, reason: str | None = None) -> dict[str, Any]:
        """Queue `ctl stop`: admit nothing new, persist, exit 75 (resumable)."""
        return _queued(_answer(lambda: _enqueue(home, target, "stop", reason, now=now)))

    def budget(
        target: str, max_cost: float | None = None, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """Queue `ctl budget`: new spend/token caps for the run's whole resume chain."""
        caps = {"max_cost": max_cost, "max_tokens": max_tokens}
        return _queued(_answer(lambda: _enqueue(home, target, "budget", budget=caps)))

    def approve(target: str, request_id: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue `ctl approve`: the waiting call runs (with `args` instead, if given)."""
        return _queued(
            _answer(
                lambda: send_decision(home, target, "approve", request_id, args=args, via="mcp")
            )
        )

    def deny(target: str, request_id: str, reason: str | None = None) -> dict[str, Any]:
        """Queue `ctl deny`: the model gets `reason` as the tool's result (a node fails)."""
        return _queued(
            _answer(
                lambda: send_decision(home, target, "deny", request_id, reason=reason, via="mcp")
            )
        )

    for tool in (pause, resume, message, stop, budget, approve, deny):
        server.add_tool(tool, name=tool.__name__)


def _enqueue(
    home: Path,
    target: str,
    verb: Any,
    text: str | None = None,
    *,
    now: bool = False,
    budget: dict[str, float | int | None] | None = None,
) -> Queued:
    """``enqueue_control`` (a run id is taken too, as the server's instructions promise)."""
    return enqueue_control(home, target, verb, text, now=now, budget=budget, via="mcp")


def serve(home: Path, *, allow_control: bool = False) -> None:
    """Serve MCP on stdin/stdout until the client closes the connection.

    Raises:
        UsageError: The ``mcp`` SDK is not installed.
    """
    build_server(home, allow_control=allow_control).run("stdio")
