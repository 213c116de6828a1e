"""``steerflow ctl``: queue a control for a running flow, or read its controls.

The hot path of live steering (an operator's ``ctl msg`` from another terminal, a script's
loop of ``ctl status``): it loads the state DB layer and ``control._queue``, nothing of the
flow machinery, the plan models or the servers (``tests/cli/test_cli_imports.py``).
"""

from __future__ import annotations

from pathlib import Path

import click

from steerflow.cli._common import (
    CTL_EPILOG,
    READ_EPILOG,
    RESOLVE_EPILOG,
    USD,
    caps_text,
    home_of,
    whole,
)
from steerflow.cli._output import emit_json, emit_text, printable

__all__ = ["ctl"]


@click.group()
def ctl() -> None:
    """Steer a running flow from another terminal (queued; applied by the flow's poller)."""


def _queued(
    home: Path, target: str, verb: str, text: str | None = None, *, now: bool = False
) -> int:
    from steerflow.control import enqueue_control

    queued = enqueue_control(home, target, verb, text, now=now, via="cli")  # type: ignore[arg-type]
    emit_text(
        f"{queued.control_id}\nqueued {verb} for session {queued.session_id} "
        "(queued, not yet applied: see `steerflow ctl status`)"
    )
    return 0


@ctl.command("pause", epilog=CTL_EPILOG)
@click.argument("target")
@click.pass_context
def ctl_pause(ctx: click.Context, target: str) -> int:
    """Hold every operation that has not started yet."""
    return _queued(home_of(ctx), target, "pause")


@ctl.command("resume", epilog=CTL_EPILOG)
@click.argument("target")
@click.pass_context
def ctl_resume(ctx: click.Context, target: str) -> int:
    """Release a paused flow."""
    return _queued(home_of(ctx), target, "resume")


@ctl.command("msg", epilog=CTL_EPILOG)
@click.argument("target")
@click.argument("text")
@click.pass_context
def ctl_msg(ctx: click.Context, target: str, text: str) -> int:
    """Send a correction into the next operation, or an agent's next turn (at most once)."""
    return _queued(home_of(ctx), target, "message", text)


@ctl.command("stop", epilog=CTL_EPILOG)
@click.argument("target")
@click.option(
    "--now",
    is_flag=True,
    help="Also cancel the operations already running, as SIGINT does (their nodes stay "
    "pending and rerun on resume); a planner call is cancelled too (nothing to resume).",
)
@click.option(
    "--reason",
    metavar="TEXT",
    help="Why (at most 64 KiB); recorded and shown in the run's output.",
)
@click.pass_context
def ctl_stop(ctx: click.Context, target: str, now: bool, reason: str | None) -> int:
    """Stop a flow, or an agent after its current turn; exit 75 (resumable).

    A flow admits nothing new and lets running operations finish; a flow still planning
    lets its planner finish and saves the plan for `resume`.
    """
    return _queued(home_of(ctx), target, "stop", reason, now=now)


@ctl.command("budget", epilog=CTL_EPILOG)
@click.argument("target")
@click.option("--max-cost", type=USD, metavar="USD", help="New spend cap (the whole chain).")
@click.option("--max-tokens", type=whole(1), metavar="N", help="New token cap.")
@click.pass_context
def ctl_budget(ctx: click.Context, target: str, max_cost: float | None,
               max_tokens: int | None) -> int:  # fmt: skip
    """Raise or lower a running flow's or agent's caps, from its next admission on.

    A cap below what the chain has spent closes admission (exit 76 for the run); once
    the budget closed it, a higher cap is for `steerflow resume RUN --max-cost USD`.
    """
    from steerflow.control import enqueue_control

    budget = {"max_cost": max_cost, "max_tokens": max_tokens}
    queued = enqueue_control(home_of(ctx), target, "budget", budget=budget, via="cli")
    emit_text(
        f"{queued.control_id}\nqueued budget for session {queued.session_id} "
        "(queued, not yet applied: see `steerflow ctl status`)"
    )
    return 0


def _decided(home: Path, target: str, verb: str, request_id: str, **kw: object) -> int:
    from steerflow.control._decide import send_decision

    queued = send_decision(home, target, verb, request_id, via="cli", **kw)  # type: ignore[arg-type]
    emit_text(
        f"{queued.control_id}\nqueued {verb} of {printable(request_id)} for session "
        f"{queued.session_id} (applied once the run records it: see `steerflow ctl status`)"
    )
    return 0


@ctl.command("approve", epilog=CTL_EPILOG)
@click.argument("target")
@click.argument("request_id")
@click.option(
    "--args",
    "args_json",
    metavar="JSON",
    help="Run the call with these arguments instead (a JSON object; recorded as edited).",
)
@click.pass_context
def ctl_approve(ctx: click.Context, target: str, request_id: str, args_json: str | None) -> int:
    """Approve a tool call (or a node) that waits: it runs.

    REQUEST_ID is one `steerflow approvals` lists. Queued even while nothing runs the
    run (a process killed while it waited): `steerflow resume RUN` applies it.
    """
    from steerflow.control._decide import parse_args_json

    args = parse_args_json(args_json) if args_json is not None else None
    return _decided(home_of(ctx), target, "approve", request_id, args=args)


@ctl.command("deny", epilog=CTL_EPILOG)
@click.argument("target")
@click.argument("request_id")
@click.option("--reason", metavar="TEXT", help="Why; the model gets it as the tool's result.")
@click.pass_context
def ctl_deny(ctx: click.Context, target: str, request_id: str, reason: str | None) -> int:
    """Deny a tool call that waits (the model is told why), or fail a node that waits."""
    return _decided(home_of(ctx), target, "deny", request_id, reason=reason)


@ctl.command("resolve", epilog=RESOLVE_EPILOG)
@click.argument("control_id")
@click.option(
    "--as",
    "outcome",
    type=click.Choice(["applied", "abandoned"]),
    required=True,
    help="The outcome you observed.",
)
@click.option("--by", metavar="WHO", help="Who resolved it (stored as abandoned:WHO).")
@click.pass_context
def ctl_resolve(ctx: click.Context, control_id: str, outcome: str, by: str | None) -> int:
    """Close a control left in 'applying' by a flow that died mid-apply."""
    from steerflow.control import resolve_control

    row = resolve_control(home_of(ctx), control_id, outcome, by)  # type: ignore[arg-type]
    emit_text(f"{row.id} {row.result}")
    return 0


@ctl.command("status", epilog=READ_EPILOG)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def ctl_status(ctx: click.Context, target: str, as_json: bool) -> int:
    """Show a session's phase, poller state and controls."""
    from steerflow.cli._views import ctl_status_view

    view = ctl_status_view(home_of(ctx), target)
    if as_json:
        emit_json(view)
        return 0
    lines = [
        f"session: {view['session_id']}  status: {view['status']}  phase: {view['phase']}  "
        f"poller: {view['poller']}"
        + (f"  turns: {view['turns']}" if view.get("turns") is not None else "")
        + (
            f"  approvals waiting: {view['approvals_waiting']}"
            if view.get("approvals_waiting")
            else ""
        )
    ]
    caps, spent = view.get("budget") or {}, view.get("spent") or {}
    if caps.get("max_cost") is not None or caps.get("max_tokens") is not None:
        from steerflow.cli._reading import fmt_usage

        lines.append(f"budget: {caps_text(caps)}; spent: {fmt_usage(spent)}")
    for c in view["controls"]:
        sender = printable(c.get("sender") or "unknown")
        lines.append(
            f"  {c['id']}  {c['verb']:<8} {printable(c['result'] or 'pending')}  from {sender}"
        )
    emit_text("\n".join(lines))
    return 0
