"""Helpers for the state-database tests: rows with chosen ids, written with plain sqlite3."""

from __future__ import annotations

import sqlite3


def insert_session(
    conn: sqlite3.Connection, sid: str, *, kind: str = "flow", created_at: float = 1000.0
) -> None:
    """Insert a session row with a chosen id."""
    conn.execute(
        "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at)"
        " VALUES (?, ?, 'running', 'planning', ?, ?)",
        (sid, kind, created_at, created_at),
    )


def insert_invocation(conn: sqlite3.Connection, iid: str, sid: str, *, kind: str = "flow") -> None:
    """Insert an invocation row with a chosen id."""
    conn.execute(
        "INSERT INTO invocations (id, session_id, kind, status, created_at, updated_at)"
        " VALUES (?, ?, ?, 'running', 1000.0, 1000.0)",
        (iid, sid, kind),
    )


def insert_play(conn: sqlite3.Connection, pid: str, sid: str, iid: str | None = None) -> None:
    """Insert a play row with a chosen id."""
    conn.execute(
        "INSERT INTO plays (id, session_id, invocation_id, playbook, created_at)"
        " VALUES (?, ?, ?, 'demo', 1000.0)",
        (pid, sid, iid),
    )
