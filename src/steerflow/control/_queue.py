"""The writers: ``ctl pause|resume|msg`` insert rows, ``ctl resolve`` closes one (D1)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from steerflow.errors import KindNotAllowedError, NotRunningError, RefusedError, UsageError
from steerflow.state import ControlRow, StateDB

__all__ = ["ALLOWED_KINDS", "Queued", "enqueue_control", "open_existing_db", "resolve_control"]

CliVerb = Literal["pause", "resume", "message"]

# Which invocation kinds have a consumer for each verb (D1, widened for message by ADR-0108).
ALLOWED_KINDS: dict[str, frozenset[str]] = {
    "pause": frozenset({"flow", "play"}),
    "resume": frozenset({"flow", "play"}),
    "message": frozenset({"flow", "play", "agent"}),
}


@dataclass(frozen=True)
class Queued:
    """A control row that was inserted; it is queued, not applied."""

    control_id: str
    session_id: str
    verb: str


def open_existing_db(home: Path) -> StateDB:
    """Open the state DB without creating one; a missing DB is a refusal."""
    if not (home / "state.db").is_file():
        raise RefusedError(f"no state database at {str(home / 'state.db')!r}: nothing to control")
    return StateDB.open(home, create=False)


def enqueue_control(home: Path, target: str, verb: CliVerb, text: str | None = None) -> Queued:
    """Insert one control row for the running session ``target`` resolves to.

    Every refusal (unknown or ambiguous id, session not running, kind without a
    consumer) happens before the insert, so a refused call leaves no row.
    """
    if verb == "message" and text is None:
        raise UsageError("ctl msg needs a TEXT argument")
    with open_existing_db(home) as db:
        resolved = db.resolve_target(target)
        session = db.get_session(resolved.session_id)
        if session is None:
            raise RefusedError(f"target {target!r} points at a missing session")
        kind = resolved.invocation_kind or session.kind
        if kind not in ALLOWED_KINDS[verb]:
            allowed = ", ".join(sorted(ALLOWED_KINDS[verb]))
            raise KindNotAllowedError(
                f"{verb} is not accepted by a {kind!r} invocation (accepted: {allowed})"
            )
        status = db.effective_status(session)
        if status != "running":
            raise NotRunningError(
                f"session {session.id} is {status}, not running: no consumer would apply the {verb}"
            )
        payload = {"text": text} if verb == "message" else None
        row = db.insert_control(session_id=session.id, verb=verb, payload=payload)
        return Queued(control_id=row.id, session_id=session.id, verb=verb)


def resolve_control(
    home: Path, control_id: str, outcome: Literal["applied", "abandoned"], by: str | None
) -> ControlRow:
    """Close a row left in ``applying`` by a claimant that never came back."""
    with open_existing_db(home) as db:
        return db.resolve_control(control_id, outcome=outcome, by=by)
