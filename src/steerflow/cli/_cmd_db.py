"""``steerflow db``: copy the state database, or rebuild it from the run directories."""

from __future__ import annotations

import click

from steerflow.cli._common import UNEXPECTED, USAGE, home_of
from steerflow.cli._output import emit_json, emit_text, printable

__all__ = ["db"]


DB_COPY_EPILOG = (
    "\b\nExit codes:\n  0    copied\n"
    + UNEXPECTED
    + "  2    usage error (bad URL; a postgresql:// URL without the 'postgres' extra)\n"
    + "  3    refused: no state database here, target holds another home's sessions\n"
    + "       (without --merge), source and target the same, database busy\n"
)


@click.group()
def db() -> None:
    """The state database itself."""


@db.command("copy", epilog=DB_COPY_EPILOG)
@click.option(
    "--to",
    "to_url",
    required=True,
    metavar="URL",
    help="Target: postgresql://HOST/DB, sqlite:///REL/PATH or sqlite:////ABS/PATH (tables "
    "created when missing). The source itself, however spelled, is refused.",
)
@click.option(
    "--merge",
    is_flag=True,
    help="Add this home's rows to a target that already holds other sessions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def db_copy(ctx: click.Context, to_url: str, merge: bool, as_json: bool) -> int:
    """Copy this home's state database (sessions, controls, node status...) to URL.

    Idempotent: rows already there are brought up to date, nothing is duplicated.
    Checkpoints stay in the run directories; only the state rows move.
    """
    from steerflow.state import StateDB, copy_state, normalize_state_db_url, open_copy_target

    to_url = normalize_state_db_url(to_url)  # a bad URL: exit 2 before the source is opened
    with (
        StateDB.open(home_of(ctx), create=False, read_only=True) as source,
        open_copy_target(source, to_url) as target,
    ):
        report = copy_state(source, target, merge=merge)
    if as_json:
        emit_json(report.to_json())
        return 0
    total = ", ".join(f"{n} {table}" for table, n in report.rows.items())
    emit_text(f"copied {total}\nfrom {report.source}\nto {report.target}")
    return 0


DB_REBUILD_EPILOG = (
    "\b\nExit codes:\n  0    scanned: every run registered, already known, or skipped (listed)\n"
    + UNEXPECTED
    + USAGE
    + "  3    refused: <home>/runs is a symlink, state DB read-only or busy\n"
)


@db.command("rebuild", epilog=DB_REBUILD_EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def db_rebuild(ctx: click.Context, as_json: bool) -> int:
    """Register again every run found under <home>/runs/ (after losing the state DB).

    Each run whose checkpoint loads gets its session back (its own session id, prompt
    and kind), as completed when its checkpoint records every node completed, else
    interrupted; a resumed run gets its claim on its source back. Runs the state DB
    already knows are left as they are, so running it twice changes nothing. Links,
    names that are not run ids and unreadable checkpoints are listed and skipped;
    nothing under runs/ is written. The artifact contract stays in the checkpoints:
    resume or verify a run that declares artifacts with --accept-checkpoint-contract.
    """
    from steerflow.orchestrate._rebuild import rebuild_state

    report = rebuild_state(home_of(ctx))
    if as_json:
        emit_json(report.to_json())
        return 0
    lines = []
    for run in report.runs:
        if run.outcome == "registered":
            lines.append(f"registered  {run.name}  {run.status:<11}  session {run.session_id}")
        elif run.outcome == "known":
            lines.append(f"known       {printable(run.name)}  ({printable(run.reason or '')})")
        else:
            lines.append(f"skipped     {printable(run.name)}: {printable(run.reason or '')}")
    lines.append(
        f"{report.count('registered')} registered, {report.count('known')} already known, "
        f"{report.count('skipped')} skipped, in {report.state_db}"
    )
    emit_text("\n".join(lines))
    return 0
