"""Approval requests that wait, across runs, and the writers of a decision (issue 41).

A run publishes its waiting requests in its session's ``node_metadata["approvals"]``
(the control poller writes it when a node starts or stops waiting); ``approvals`` reads
them back for every session whose run was not continued by a resume (the resume
publishes them again under its own run). The writers queue ``approve``/``deny`` rows,
exactly what ``steerflow ctl approve|deny`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.control import open_existing_db
from steerflow.control._decide import APPROVALS_KEY, send_decision
from steerflow.state import db_exists

__all__ = ["ApprovalRequest", "approve", "deny", "list_approvals"]


@dataclass(frozen=True)
class ApprovalRequest:
    """One request that waits for an operator's decision."""

    request_id: str
    run_id: str | None
    session_id: str
    node: str
    #: The tool asked about; None for a node's own approval (``approval: required``).
    tool: str | None
    args: dict[str, Any]
    #: The model's text before the call (empty for a node's own approval).
    text: str
    #: When it was recorded (epoch seconds).
    requested_at: float | None
    #: The session's effective status: ``running``, or ``interrupted``/``stopped`` (a
    #: decision sent now is applied by ``steerflow resume``).
    status: str

    def to_json(self) -> dict[str, Any]:
        """One ``approvals --json`` entry."""
        return {
            "request_id": self.request_id,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "node": self.node,
            "tool": self.tool,
            "args": self.args,
            "text": self.text,
            "requested_at": self.requested_at,
            "status": self.status,
        }


def _request(rid: str, raw: object, session: Any, status: str) -> ApprovalRequest | None:
    if not isinstance(raw, dict):
        return None
    args, since = raw.get("args"), raw.get("requested_at")
    return ApprovalRequest(
        request_id=rid,
        run_id=session.run_id,
        session_id=session.id,
        node=str(raw.get("node", "")),
        tool=raw.get("tool") if isinstance(raw.get("tool"), str) else None,
        args=args if isinstance(args, dict) else {},
        text=str(raw.get("text") or ""),
        requested_at=float(since) if isinstance(since, int | float) else None,
        status=status,
    )


def list_approvals(home: Path | str, *, state_db: str | None = None) -> list[ApprovalRequest]:
    """Every request that waits, oldest first (none without a state DB)."""
    home = Path(home)
    if state_db is None and not db_exists(home):
        return []
    out: list[ApprovalRequest] = []
    with open_existing_db(home, state_db=state_db) as db:
        sessions = [s for s in db.list_sessions(limit=None) if s.node_metadata.get(APPROVALS_KEY)]
        resumed = db.resumed_by([s.run_id for s in sessions if s.run_id])
        for session in sessions:
            later = [c for c in resumed.get(session.run_id or "", []) if not c.fork and c.run_id]
            status = db.effective_status(session)
            if later and status != "running":
                continue  # its resume waits on them now, under its own run
            for rid, raw in dict(session.node_metadata[APPROVALS_KEY]).items():
                found = _request(str(rid), raw, session, status)
                if found is not None:
                    out.append(found)
    return sorted(out, key=lambda r: (r.requested_at or 0.0, r.request_id))


def approve(
    home: Path | str,
    target: str,
    request_id: str,
    args: dict[str, Any] | None = None,
    *,
    state_db: str | None = None,
) -> str:
    """Queue ``ctl approve TARGET REQUEST_ID``: run the call (with ``args`` if given).

    ``target`` is the run (or session) whose request it is; ``args`` replaces the call's
    arguments (recorded as edited). Returns the control id; the run stamps it ``applied``
    once the decision is journaled, or ``rejected:<reason>`` (a second decision names the
    first). Queued even while nothing runs: ``steerflow resume`` applies it.

    Raises:
        UnknownIdError: No such request in that run.
        RefusedError: The request is another run's, already decided, or its run was
            continued by a resume.
        UsageError: ``args`` is not a dict.
    """
    return send_decision(
        home, target, "approve", request_id, args=args, state_db=state_db
    ).control_id


def deny(
    home: Path | str,
    target: str,
    request_id: str,
    reason: str | None = None,
    *,
    state_db: str | None = None,
) -> str:
    """Queue ``ctl deny TARGET REQUEST_ID``: the model gets ``reason`` as the tool's result.

    For a node's own approval the node fails with the reason. Arguments, result and
    errors as :func:`approve`.
    """
    return send_decision(
        home, target, "deny", request_id, reason=reason, state_db=state_db
    ).control_id
