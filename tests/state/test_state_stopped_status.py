"""Migration 3: ``sessions.status`` accepts ``stopped`` (``ctl stop``), losing no row."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from steerflow.errors import SteerflowError
from steerflow.state import SCHEMA_VERSION, StateDB
from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL


def _version_2_db(home: Path) -> None:
    home.mkdir(mode=0o700)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(SCHEMA_VERSION_DDL)
    for step in MIGRATIONS[:2]:
        for statement in step.statements:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, 0, ?)", (step.version, "old"))
    conn.execute(
        "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at)"
        " VALUES ('s1', 'flow', 'running', 'executing', 1, 1)"
    )
    conn.execute(
        "INSERT INTO session_controls (id, session_id, verb, created_at) VALUES"
        " ('c1', 's1', 'pause', 1)"
    )
    conn.execute(
        "INSERT INTO session_nodes (session_id, node_key, kind, status, updated_at) VALUES"
        " ('s1', 'a', 'planned', 'completed', 1)"
    )
    conn.close()


def test_an_old_database_migrates_keeping_child_rows_and_accepts_stopped(home: Path) -> None:
    _version_2_db(home)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    try:
        with pytest.raises(sqlite3.IntegrityError):  # the old CHECK refuses it
            conn.execute("UPDATE sessions SET status = 'stopped'")
    finally:
        conn.close()
    with StateDB.open(home) as db:
        assert SCHEMA_VERSION >= 3 and db.backend.schema_version() == SCHEMA_VERSION
        # the migrating connection itself sees the widened CHECK
        db.set_session_status("s1", "stopped")
        assert db.get_session("s1").status == "stopped"  # type: ignore[union-attr]
        assert [c.id for c in db.list_controls("s1")] == ["c1"]  # no cascade
        assert db.backend.query("SELECT node_key FROM session_nodes") == [{"node_key": "a"}]
        assert db.backend.query("PRAGMA integrity_check") == [{"integrity_check": "ok"}]
        assert db.backend.query("PRAGMA foreign_key_check") == []
        with pytest.raises(SteerflowError, match="CHECK constraint failed"):
            db.backend.query("UPDATE sessions SET status = 'bogus' WHERE id = 's1'")
    with StateDB.open(home) as db:  # a fresh connection reads the new DDL too
        assert db.get_session("s1").status == "stopped"  # type: ignore[union-attr]


def test_a_new_database_accepts_stopped(home: Path) -> None:
    with StateDB.open(home) as db:
        session = db.create_session(kind="play")
        db.set_session_status(session.id, "stopped")
        assert db.get_session(session.id).status == "stopped"  # type: ignore[union-attr]


def test_a_hand_edited_sessions_definition_is_refused_and_left_at_version_2(home: Path) -> None:
    _version_2_db(home)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = replace(sql, \"'timed_out', 'interrupted')\","
        " \"'interrupted', 'timed_out')\") WHERE name = 'sessions'"
    )
    conn.execute(f"PRAGMA schema_version = {version + 1}")
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()
    with pytest.raises(SteerflowError, match=r"unexpected definition.*migration 3"):
        StateDB.open(home)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    try:  # rolled back: still version 2, and its rows are all there
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 2
        assert conn.execute("SELECT COUNT(*) FROM session_controls").fetchone()[0] == 1
    finally:
        conn.close()
