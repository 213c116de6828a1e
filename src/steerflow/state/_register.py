"""Registering a run again from its files (``steerflow db rebuild``): one insert per run.

A rebuilt session is written with the ids its checkpoint records, never over a row the
database already has: a session id or a run id the database knows leaves it untouched,
so rebuilding twice changes nothing. The session, its published node statuses and the
resume claim it held (when its checkpoint names the run it resumed) go in one write
transaction: a rebuild cut short leaves a run either fully registered or absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from steerflow.state._db import StateDB
from steerflow.state._schema import NodeUpdate, dump_json
from steerflow.state._vocab import InvocationKind, SessionStatus

__all__ = ["RebuiltSession", "register_rebuilt"]


@dataclass(frozen=True)
class RebuiltSession:
    """A session as its run's files describe it.

    Attributes:
        id: The session id the checkpoint records.
        kind: ``flow``, ``play`` or ``agent``.
        status: The status registered (``interrupted`` unless the files prove more).
        run_id: Its run directory's name.
        prompt: The run's prompt.
        created_at: When the run started (its run id's UTC time).
        updated_at: When its checkpoint last changed.
        node_metadata: ``run_id``, ``rebuilt``, and the ``resumed_from*`` links.
        nodes: The node statuses its checkpoint records.
        resumed: ``(source run id, fork)`` when the run was a resume of another run.
        name: The run's name as its files give it (``sessions.name``).
    """

    id: str
    kind: InvocationKind
    status: SessionStatus
    run_id: str
    prompt: str | None
    created_at: float
    updated_at: float
    node_metadata: Mapping[str, Any]
    nodes: Sequence[NodeUpdate] = field(default_factory=tuple)
    resumed: tuple[str, bool] | None = None
    name: str | None = None


def register_rebuilt(db: StateDB, session: RebuiltSession) -> str | None:
    """Insert ``session`` unless the database already knows it; why it was not, else None.

    Raises:
        DatabaseBusyError: The write lock wait ran past the busy timeout.
        RefusedError: The database is read-only.
    """
    backend = db.backend
    with backend.transaction(write=True) as tx:
        # Two rebuilds at once (PostgreSQL runs writers side by side): one checks after
        # the other has inserted.
        backend.lock(tx, "rebuild", session.run_id)
        known = tx.query(
            "SELECT id, run_id FROM sessions WHERE id = ? OR run_id = ? ORDER BY id LIMIT 1",
            (session.id, session.run_id),
        )
        if known:
            row = known[0]
            return f"the state DB already has session {row['id']} for run {row['run_id']}"
        tx.execute(
            "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at,"
            " node_metadata, prompt, run_id, name)"
            " VALUES (?, ?, ?, 'executing', ?, ?, ?, ?, ?, ?)",
            (session.id, session.kind, session.status, session.created_at, session.updated_at,
             dump_json(dict(session.node_metadata)), session.prompt, session.run_id,
             session.name),
        )  # fmt: skip
        for node in session.nodes:
            tx.execute(
                "INSERT INTO session_nodes (session_id, node_key, kind, node_id, assignee,"
                " status, updated_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (session.id, node.node_key, node.kind, node.node_id, node.assignee,
                 node.status, session.updated_at),
            )  # fmt: skip
        if session.resumed is not None:
            source, fork = session.resumed
            tx.execute(
                "INSERT INTO resume_claims (session_id, source_run_id, fork, created_at)"
                " VALUES (?, ?, ?, ?)",
                (session.id, source, int(fork), session.created_at),
            )
    return None
