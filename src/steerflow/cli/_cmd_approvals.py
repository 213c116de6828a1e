"""``steerflow approvals``: the approval requests that wait, across runs (issue 41)."""

from __future__ import annotations

import json
import time

import click

from steerflow.cli._common import READ_EPILOG, home_of
from steerflow.cli._output import emit_json, emit_text, printable

__all__ = ["approvals"]

#: Longest argument text shown on one line of the table (``--json`` has it whole).
_ARGS_CHARS = 200


@click.command(epilog=READ_EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def approvals(ctx: click.Context, as_json: bool) -> int:
    """List the tool calls and nodes that wait for an operator's approval.

    Decide with `steerflow ctl approve RUN REQUEST_ID [--args JSON]` or `steerflow ctl deny
    RUN REQUEST_ID [--reason TEXT]`. A request of a run that is not running (killed while
    it waited) is listed too: decide it, then `steerflow resume RUN` applies the decision.
    """
    from steerflow.views import list_approvals

    found = list_approvals(home_of(ctx))
    if as_json:
        emit_json({"approvals": [r.to_json() for r in found]})
        return 0
    if not found:
        emit_text("no approval request waits")
        return 0
    lines = []
    for r in found:
        since = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.requested_at))
            if r.requested_at
            else "?"
        )
        what = f"tool {r.tool}" if r.tool else "node call"
        args = json.dumps(r.args, sort_keys=True, ensure_ascii=False)
        if len(args) > _ARGS_CHARS:
            args = args[: _ARGS_CHARS - 3] + "..."
        lines.append(
            f"{r.request_id}  run {r.run_id}  node {printable(r.node)}  {printable(what)}  "
            f"waiting since {since} ({r.status})\n    args: {printable(args)}"
        )
    emit_text("\n".join(lines))
    return 0
