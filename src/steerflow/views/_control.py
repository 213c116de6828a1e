"""Steering from a view: the ``ctl`` writers and the ``ctl status`` reader.

The writers are ``control.enqueue_control``, exactly what ``steerflow ctl`` calls: a
row is queued, and applied (or refused) by the flow's poller, which stamps its result.
Each returns the control id (``ctl status`` lists it with its result); a run id stands
for the session that ran it, as it does for ``ctl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow._usage import Usage
from steerflow.control import open_existing_db, send_control, session_target
from steerflow.state import ControlRow, NodeRow

__all__ = [
    "ControlEntry",
    "ControlStatus",
    "budget",
    "control_status",
    "message",
    "pause",
    "resume",
    "stop",
]


def pause(home: Path | str, target: str, *, state_db: str | None = None) -> str:
    """Queue ``ctl pause TARGET``: hold every operation that has not started yet.

    ``target`` is what ``steerflow ctl`` takes: a session, invocation or play id, a
    prefix of one, or a run id; ``state_db`` a state DB URL (``--state-db``) instead of
    ``STEERFLOW_STATE_DB_URL`` or ``<home>/state.db``. Returns the control id: the row is
    queued, and the flow's poller applies it and stamps its result (``control_status``).

    Raises:
        RefusedError: No state DB, or the target's session is missing.
        UnknownIdError, AmbiguousIdError: ``target`` names no session or several.
        KindNotAllowedError: The session's kind takes no such control (an ``agent``).
        NotRunningError: The session is not running.
        UsageError: A bad ``state_db`` URL (``message``: an empty or oversized text;
            ``budget``: no cap, or a bad one, ``InvalidValueError`` naming ``max_cost`` or
            ``max_tokens``).
    """
    return send_control(home, target, "pause", state_db=state_db)


def resume(home: Path | str, target: str, *, state_db: str | None = None) -> str:
    """Queue ``ctl resume TARGET``: release a paused flow (not a resume from checkpoint).

    Arguments, result and errors as :func:`pause`.
    """
    return send_control(home, target, "resume", state_db=state_db)


def message(home: Path | str, target: str, text: str, *, state_db: str | None = None) -> str:
    """Queue ``ctl msg TARGET TEXT``: a correction rendered into the next operation once.

    Arguments, result and errors as :func:`pause`; ``text`` must not be blank and is at
    most 64 KiB.
    """
    return send_control(home, target, "message", text, state_db=state_db)


def stop(
    home: Path | str,
    target: str,
    *,
    now: bool = False,
    reason: str | None = None,
    state_db: str | None = None,
) -> str:
    """Queue ``ctl stop TARGET``: admit nothing new, persist, exit 75 (resumable).

    ``now`` also cancels the calls in flight; ``reason`` is kept with the run. Arguments,
    result and errors otherwise as :func:`pause`.
    """
    return send_control(home, target, "stop", reason, now=now, state_db=state_db)


def budget(
    home: Path | str,
    target: str,
    *,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    state_db: str | None = None,
) -> str:
    """Queue ``ctl budget TARGET``: new caps for the whole resume chain.

    The caps are checked at the run's next admission; one below what the chain has
    spent closes admission. At least one of ``max_cost`` (USD) and ``max_tokens`` is
    given, each positive and finite. Arguments, result and errors otherwise as
    :func:`pause` (``UsageError`` for no cap or a bad one; ``RefusedError`` for a cap the
    run recorded it cannot enforce: ``max_cost`` when some model of it has no price).
    """
    return send_control(
        home,
        target,
        "budget",
        state_db=state_db,
        budget={"max_cost": max_cost, "max_tokens": max_tokens},
    )


@dataclass(frozen=True)
class ControlEntry:
    """One ``session_controls`` row: ``result`` is None while it is pending."""

    id: str
    verb: str
    payload: Any
    created_at: float
    applied_at: float | None
    result: str | None
    #: Who queued it (``<front end>:<user>@<host>:<pid>``); None for a row from before
    #: senders were stored (pages show it as "unknown").
    sender: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``ctl status --json`` control object."""
        return {
            "id": self.id,
            "verb": self.verb,
            "payload": self.payload,
            "created_at": self.created_at,
            "applied_at": self.applied_at,
            "result": self.result,
            "sender": self.sender,
        }


@dataclass(frozen=True)
class ControlStatus:
    """A session's phase, poller state and controls (``ctl status``)."""

    session_id: str
    status: str
    phase: str | None
    poller: str
    controls: tuple[ControlEntry, ...]
    #: An ``agent`` session's finished turns (issue 19); None for a flow.
    turns: int | None = None
    #: The caps in force (``{max_cost, max_tokens}``, the last applied ``ctl budget``
    #: over the run's own) and what the resume chain has spent so far (CONTRACT §11 usage).
    budget: dict[str, Any] | None = None
    spent: dict[str, Any] | None = None
    #: Approval requests of the run that wait for an operator (issue 41).
    approvals_waiting: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``ctl status --json`` object (CONTRACT §3)."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "status": self.status,
            "phase": self.phase,
            "poller": self.poller,
            "controls": [c.to_json() for c in self.controls],
        }
        if self.turns is not None:
            out["turns"] = self.turns
        out["budget"] = self.budget
        out["spent"] = self.spent
        out["approvals_waiting"] = self.approvals_waiting
        return out


def control_status(home: Path, target: str, *, state_db: str | None = None) -> ControlStatus:
    """Read the session ``target`` resolves to (as ``ctl`` resolves it, or a run id).

    ``state_db``: as for :func:`pause`.

    Raises:
        RefusedError: No state DB.
        UnknownIdError, AmbiguousIdError: ``target`` names no session or several.
    """
    with open_existing_db(Path(home), state_db=state_db) as db:
        resolved = db.resolve_target(session_target(db, target))
        session = db.get_session(resolved.session_id)
        assert session is not None
        controls = db.list_controls(session.id)
        return ControlStatus(
            session_id=session.id,
            status=db.effective_status(session),
            phase=session.phase,
            poller=str(session.node_metadata.get("poller", "pending")),
            controls=tuple(
                ControlEntry(
                    id=c.id,
                    verb=c.verb,
                    payload=c.payload,
                    created_at=c.created_at,
                    applied_at=c.applied_at,
                    result=c.result,
                    sender=c.sender,
                )
                for c in controls
            ),
            turns=_agent_turns(session.kind, session.node_metadata),
            approvals_waiting=len(waiting)
            if isinstance(waiting := session.node_metadata.get("approvals"), dict)
            else 0,
            budget=_caps(session.node_metadata, controls),
            spent=_spent(session.node_metadata, db.list_nodes(session.id)),
        )


def _caps(meta: dict[str, Any], controls: list[ControlRow]) -> dict[str, Any]:
    stored = meta.get("budget")
    caps = {"max_cost": None, "max_tokens": None}
    caps.update(stored if isinstance(stored, dict) else {})
    for row in controls:  # stored in (created_at, id) order: the last applied wins
        if row.verb == "budget" and row.result == "applied" and isinstance(row.payload, dict):
            caps.update({k: v for k, v in row.payload.items() if k in caps and v is not None})
    return caps


def _spent(meta: dict[str, Any], nodes: list[NodeRow]) -> dict[str, Any]:
    """The chain's spend: what the runs before spent, plus this run's (its rows, live)."""
    own = Usage.from_json(meta.get("usage"))
    if own is None:
        own = Usage()
        for node in nodes:
            own = own + (Usage.from_json(node.detail) or Usage())
    return ((Usage.from_json(meta.get("spent_before")) or Usage()) + own).to_json()


def _agent_turns(kind: str, meta: dict[str, Any]) -> int | None:
    """How many turns an ``agent`` session finished (``node_metadata["agent"]``)."""
    if kind != "agent":
        return None
    agent = meta.get("agent")
    turns = agent.get("turns") if isinstance(agent, dict) else None
    return turns if isinstance(turns, int) else 0
