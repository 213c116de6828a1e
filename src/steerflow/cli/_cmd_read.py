"""``verify``, ``runs``, ``show`` and ``result``: the commands that read a run.

``runs`` and ``show`` start in a few tens of milliseconds: their readers
(``steerflow.views._runs``) load neither the plan models nor the flow machinery.
"""

from __future__ import annotations

from typing import Any

import click

from steerflow.cli._common import (
    ACCEPT_CONTRACT_HELP,
    READ_EPILOG,
    REFUSED_HOME,
    RESULT_EPILOG,
    RUNS_EPILOG,
    UNEXPECTED,
    USAGE,
    caps_text,
    home_of,
)
from steerflow.cli._output import emit_json, emit_text, printable
from steerflow.errors import UsageError

__all__ = ["result", "runs", "show", "verify"]

VERIFY_EPILOG = (
    "\b\nExit codes:\n  0    settled: every recorded artifact is there as recorded\n"
    + UNEXPECTED
    + USAGE
    + "  3    unsettled (listed), or refused: unknown/ambiguous id, checkpoint missing or\n"
    "       refused, artifact contract missing, unreadable or disagreeing,\n" + REFUSED_HOME
)


@click.command(epilog=VERIFY_EPILOG)
@click.argument("target")
@click.option("--accept-checkpoint-contract", is_flag=True, help=ACCEPT_CONTRACT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def verify(ctx: click.Context, target: str, accept_checkpoint_contract: bool, as_json: bool) -> int:
    """Check a run's recorded artifacts, byte for byte, without resuming it.

    TARGET is as for resume and show. Every completed node that recorded artifacts is
    checked against the artifact contract its run persisted: each file must still be a
    regular file under the run's artifact root with the recorded size and BLAKE2b
    digest. Prints one line per file that does not match (expected vs found).
    """
    from steerflow.cli._reading import show_verify

    return show_verify(
        home_of(ctx), target, as_json=as_json, accept_checkpoint_contract=accept_checkpoint_contract
    )


def _one_line(name: object) -> str:
    """A run's name for a terminal line: control characters shown as ``?``, never raw."""
    if not isinstance(name, str) or not name:
        return "-"
    return "".join(c if c.isprintable() else "?" for c in name)


@click.command(epilog=RUNS_EPILOG)
@click.option("--all", "show_all", is_flag=True, help="List every run, not only the 20 newest.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def runs(ctx: click.Context, show_all: bool, as_json: bool) -> int:
    """List runs, newest first (a dead run shows as interrupted)."""
    from steerflow.cli._views import resume_links, runs_view

    view = runs_view(home_of(ctx), limit=None if show_all else 20)
    if as_json:
        emit_json(view)
    elif not view["runs"]:
        emit_text("no runs yet: try `steerflow play demo`")
    else:
        from steerflow.cli._reading import fmt_duration

        header = f"{'RUN':<24} {'STATUS':<12} {'KIND':<5} {'DURATION':>9}  {'SESSION':<32}  NAME"
        emit_text(
            "\n".join(
                [header]
                + [
                    f"{r['run_id'] or '-':<24} {r['status']:<12} {r['kind']:<5} "
                    f"{fmt_duration(r.get('duration_s')):>9}  {r['session_id']:<32}  "
                    f"{_one_line(r.get('name'))}"
                    + (f"  ({links})" if (links := resume_links(r)) else "")
                    + _waiting_note(r)
                    for r in view["runs"]
                ]
            )
        )
    return 0


def _waiting_note(run: dict[str, Any]) -> str:
    """``  [2 approvals waiting]`` for a run whose nodes wait for an operator (issue 41)."""
    count = run.get("approvals_waiting") or 0
    return f"  [{count} approval{'s' if count != 1 else ''} waiting]" if count else ""


@click.command(epilog=READ_EPILOG)
@click.argument("target")
@click.argument("node", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--raw",
    is_flag=True,
    help="With NODE: print only the node's response, byte for byte (for pipes).",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Print the running node's output so far, then each new chunk until it ends; "
    "without NODE every running node's, each line prefixed with its id.",
)
@click.pass_context
def show(
    ctx: click.Context, target: str, node: str | None, as_json: bool, raw: bool, follow: bool
) -> int:
    """Show a run: status, phase and every node's live status; or one NODE in full.

    NODE is a planned agent_id or a spawned node's spawn_id (or an unambiguous prefix):
    its status, model, times, usage, the instruction exactly as the provider received it,
    the response, error, artifacts and spawn links. Works while the run is still going.
    With --follow: the live output of a run on this host, as it comes (Ctrl-C stops
    only the follower, exit 130).
    """
    if follow:
        if as_json or raw:
            raise UsageError("--follow prints live text: it takes neither --json nor --raw")
        # Only now: the follower's readers must not weigh on plain ``show``.
        from steerflow.cli._follow import follow_node, follow_run

        if node is not None:
            return follow_node(home_of(ctx), target, node)
        return follow_run(home_of(ctx), target)
    if node is not None:
        from steerflow.cli._reading import show_node

        return show_node(home_of(ctx), target, node, as_json=as_json, raw=raw)
    if raw:
        raise UsageError("--raw needs a NODE: steerflow show RUN NODE --raw")
    from steerflow.cli._views import show_view

    view = show_view(home_of(ctx), target)
    if as_json:
        emit_json(view)
        return 0
    emit_text(_show_text(view))
    return 0


def _show_text(view: dict[str, Any]) -> str:
    """``show RUN``'s human form of the ``show --json`` object."""
    from steerflow.cli._views import resume_links

    # A run without a session row or checkpoint says so, never "None" / "(vNone)".
    lines = [
        f"run: {view['run_id']}  session: {view['session_id'] or '(none recorded)'}",
        # An ended run has no phase (null in --json): "-" as in the Studio.
        f"status: {view['status'] or 'unknown'}  "
        f"phase: {view['phase'] or ('unknown' if view['status'] is None else '-')}",
        f"name: {_one_line(view.get('name'))}",
    ]
    if links := resume_links(view):
        lines.append(links)
    ckpt = view.get("checkpoint") or {}
    if not view.get("reachable", True):
        from steerflow.cli._views import unreachable_line

        lines.append(unreachable_line(view))
    elif ckpt.get("path") and not ckpt.get("exists"):
        lines.append("checkpoint: none (the run saved no checkpoint; nothing to resume)")
    elif ckpt.get("path") and ckpt.get("version") is None:
        lines.append(f"checkpoint: {ckpt['path']} (unreadable)")
    elif ckpt.get("path"):
        lines.append(f"checkpoint: {ckpt['path']} (v{ckpt.get('version')})")
    report = view.get("checkpoint_recovery") or {}
    if report and report.get("status") != "clean":
        lines.append(f"checkpoint recovery: {report.get('status')} {report.get('refusal') or ''}")
    from steerflow.cli._reading import fmt_duration, fmt_usage

    lines.append("nodes:")
    lines.append(f"  {'STATUS':<10} {'KIND':<8} {'DURATION':>9}  {'MODEL':<16} ID")
    for item in view["nodes"]:
        who = f" ({printable(item['assignee'])})" if item.get("assignee") else ""
        lines.append(
            f"  {item['status']:<10} {item['kind']:<8} {fmt_duration(item.get('duration_s')):>9}  "
            f"{printable(item.get('model') or '-'):<16} {printable(item['id'])}{who}"
            + (f"  [{fmt_usage(used)}]" if (used := item.get("usage")) else "")
        )
        if item.get("artifacts"):
            from steerflow.cli._reading import artifact_lines

            lines += artifact_lines(item["artifacts"], indent="      artifact ")
    summary = view["summary"]
    lines.append(
        f"summary: {summary['completed']} completed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped, {summary['pending']} pending"
        + (f", {summary['running']} running" if summary["running"] else "")
        + f"; usage: {fmt_usage(summary['usage'])}"
    )
    caps = view.get("budget") or {}
    if caps.get("max_cost") is not None or caps.get("max_tokens") is not None:
        lines.append(f"budget: {caps_text(caps)}")
    return "\n".join(lines)


@click.command(epilog=RESULT_EPILOG)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def result(ctx: click.Context, target: str, as_json: bool) -> int:
    """Print a run's result: the synthesis response, else every sink node's response.

    Sink nodes are the nodes no other node depends on (planned and spawned), in plan
    order, each under its id. Exit 0 for a completed run, 1 otherwise (what exists is
    printed), 3 when the run's checkpoint cannot be read.
    """
    from steerflow.cli._reading import show_result

    return show_result(home_of(ctx), target, as_json=as_json)
