"""``ctl approve`` / ``ctl deny``: queue an operator's decision on an approval request.

A decision goes through ``session_controls`` like every verb (issue 41): one consumer, at
most once, its sender recorded, stamped ``applied`` once the run journaled it or
``rejected:<reason>``. Unlike the other verbs it may be queued while nothing runs the
session (a process killed while it waited): the resume of that run reads it from the
chain and applies it. What can be refused before the insert is: a request id no run
published, one of another run, and a run already continued by a resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from steerflow.errors import RefusedError, UnknownIdError, UsageError, quote_input
from steerflow.state import SessionRow, StateDB

from ._queue import (
    DB_BUSY_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    FrontEnd,
    Queued,
    open_existing_db,
    sender_id,
    session_target,
)

__all__ = ["APPROVALS_KEY", "DecisionVerb", "parse_args_json", "send_decision"]

#: ``sessions.node_metadata`` member a run keeps its waiting requests in, by request id.
APPROVALS_KEY = "approvals"

DecisionVerb = Literal["approve", "deny"]


def parse_args_json(text: str, *, where: str = "--args") -> dict[str, Any]:
    """``--args JSON``: a JSON object of the call's arguments (exit 2 otherwise)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UsageError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a JSON object of the tool's arguments, not {text!r}")
    return value


def _check_payload(verb: str, request_id: str, args: object, reason: str | None) -> dict[str, Any]:
    if verb not in ("approve", "deny"):
        raise UsageError(f"unknown decision {verb!r}: expected approve or deny")
    if not isinstance(request_id, str) or not request_id.strip():
        raise UsageError("a decision needs the REQUEST_ID `steerflow approvals` lists")
    if verb == "approve":
        if args is not None and not isinstance(args, dict):
            raise UsageError("approve args must be a JSON object of the tool's arguments")
        try:
            text = json.dumps(args, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"approve args are not JSON: {exc}") from None
        size = len(text.encode("utf-8", "surrogatepass"))
        if args is not None and size > MAX_MESSAGE_BYTES:
            raise UsageError(f"approve args are {size} bytes; the limit is 64 KiB")
        return {"request_id": request_id, "args": args}
    if reason is not None and len(reason.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES:
        raise UsageError(f"deny --reason is over {MAX_MESSAGE_BYTES} bytes (64 KiB)")
    return {"request_id": request_id, "reason": reason}


def _pending_of(session: SessionRow) -> dict[str, Any]:
    found = session.node_metadata.get(APPROVALS_KEY)
    return found if isinstance(found, dict) else {}


def _refuse_unknown(db: StateDB, session: SessionRow, request_id: str) -> None:
    """Name the run a request belongs to, or say no run published it."""
    for control in db.list_controls(session.id):
        payload = control.payload if isinstance(control.payload, dict) else {}
        ours = control.verb in ("approve", "deny") and payload.get("request_id") == request_id
        # The run drops the request from its published list before it stamps the
        # decision it took: a row not yet stamped (pending or ``applying:``) is that one.
        taking = control.result is None or control.result.startswith("applying:")
        if ours and (control.result == "applied" or taking):
            raise RefusedError(
                f"approval request {quote_input(request_id)} was already decided: "
                f"{control.verb} {control.id} from {control.sender or 'unknown'}"
            )
    for other in db.list_sessions(limit=None):
        if other.id != session.id and request_id in _pending_of(other):
            raise RefusedError(
                f"approval request {quote_input(request_id)} belongs to run {other.run_id}, "
                f"not to run {session.run_id}"
            )
    raise UnknownIdError(
        f"unknown approval request {quote_input(request_id)} for run {session.run_id}: "
        "`steerflow approvals` lists the requests that wait"
    )


def send_decision(
    home: Path | str,
    target: str,
    verb: DecisionVerb,
    request_id: str,
    *,
    args: dict[str, Any] | None = None,
    reason: str | None = None,
    via: FrontEnd = "api",
    state_db: str | None = None,
    busy_timeout_s: float = DB_BUSY_TIMEOUT_S,
) -> Queued:
    """Queue ``approve`` (with edited ``args``) or ``deny`` (with ``reason``) for a request.

    ``target``: the run (or session, or a prefix) whose request it is.

    Raises:
        UsageError: No request id, ``args`` not an object, a reason over 64 KiB.
        UnknownIdError: No such request in that run (nor in any other).
        RefusedError: The request is another run's, already decided, or the run was
            continued by a resume (decide there).
        DatabaseBusyError: A lock wait ran past ``busy_timeout_s``.
    """
    payload = _check_payload(verb, request_id, args, reason)
    sender = sender_id(via)
    with open_existing_db(Path(home), busy_timeout_s=busy_timeout_s, state_db=state_db) as db:
        resolved = db.resolve_target(session_target(db, target))
        session = db.get_session(resolved.session_id)
        if session is None:
            raise RefusedError(f"target {quote_input(target)} points at a missing session")
        if request_id not in _pending_of(session):
            _refuse_unknown(db, session, request_id)
        claims = db.resumed_by([session.run_id]).get(session.run_id, []) if session.run_id else []
        later = [c for c in claims if not c.fork and c.run_id]
        if later and db.effective_status(session) != "running":
            raise RefusedError(
                f"run {session.run_id} was resumed as run {later[-1].run_id}: send the "
                "decision to that run"
            )
        # Not require_running: a decision sent while nothing runs waits for the resume.
        row = db.insert_control(session_id=session.id, verb=verb, payload=payload,
                                sender=sender)  # fmt: skip
        return Queued(control_id=row.id, session_id=session.id, verb=verb, sender=row.sender)
