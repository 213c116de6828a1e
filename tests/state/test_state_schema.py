"""The D1 contract of ``session_controls``: columns, CHECK, cascade and partial index."""

from __future__ import annotations

import re
import sqlite3

import pytest
from state_support import insert_session

from steerflow.errors import UsageError
from steerflow.state import StateDB
from steerflow.state._db import PENDING_CONTROLS_SQL

# D1's table, with the verb CONTRACT §11 adds (``budget``, schema migration 6) and the
# nullable sender column of schema migration 7 (decision 205), appended by ALTER TABLE.
D1_TABLE = """
CREATE TABLE session_controls (
  id          TEXT PRIMARY KEY,
  session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  verb        TEXT NOT NULL CHECK(verb IN ('pause', 'resume', 'message', 'stop', 'budget',
                                 'approve', 'deny')),
  payload     JSON,
  created_at  REAL NOT NULL,
  applied_at  REAL,
  result      TEXT
, sender TEXT)
"""

D1_INDEX = """
CREATE INDEX idx_session_controls_pending
  ON session_controls(session_id, applied_at) WHERE applied_at IS NULL
"""

SID = "a" * 32


@pytest.fixture
def state_backend() -> str:
    """SQLite's own catalog is read here; the PostgreSQL twin is test_state_postgres.py."""
    return "sqlite"


def _norm(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip().rstrip(";")


def test_session_controls_ddl_is_exactly_d1(raw: sqlite3.Connection) -> None:
    (table_sql,) = raw.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'session_controls'"
    ).fetchone()
    assert _norm(table_sql) == _norm(D1_TABLE)
    columns = [
        (r[1], r[2], r[3], r[5])
        for r in raw.execute("PRAGMA table_info(session_controls)").fetchall()
    ]
    assert columns == [
        ("id", "TEXT", 0, 1),
        ("session_id", "TEXT", 1, 0),
        ("verb", "TEXT", 1, 0),
        ("payload", "JSON", 0, 0),
        ("created_at", "REAL", 1, 0),
        ("applied_at", "REAL", 0, 0),
        ("result", "TEXT", 0, 0),
        ("sender", "TEXT", 0, 0),
    ]
    fks = raw.execute("PRAGMA foreign_key_list(session_controls)").fetchall()
    assert [(fk[2], fk[3], fk[4], fk[6]) for fk in fks] == [
        ("sessions", "session_id", "id", "CASCADE")
    ]


def test_partial_index_is_exactly_d1(raw: sqlite3.Connection) -> None:
    (index_sql,) = raw.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index'"
        " AND name = 'idx_session_controls_pending'"
    ).fetchone()
    assert _norm(index_sql) == _norm(D1_INDEX)
    (partial,) = [
        r[4]
        for r in raw.execute("PRAGMA index_list(session_controls)").fetchall()
        if r[1] == "idx_session_controls_pending"
    ]
    assert partial == 1
    cols = [r[2] for r in raw.execute("PRAGMA index_info(idx_session_controls_pending)")]
    assert cols == ["session_id", "applied_at"]


def test_other_tables_exist(raw: sqlite3.Connection) -> None:
    names = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "sessions", "invocations", "plays", "session_controls",
            "session_nodes"} <= names  # fmt: skip
    cols = {r[1] for r in raw.execute("PRAGMA table_info(sessions)")}
    assert {"id", "kind", "status", "phase", "created_at", "updated_at", "node_metadata",
            "artifact_contract_json", "prompt", "run_id", "owner_host", "owner_pid",
            "owner_started", "heartbeat_at"} <= cols  # fmt: skip


def test_check_refuses_bogus_verb(db: StateDB, raw: sqlite3.Connection) -> None:
    insert_session(raw, SID)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        raw.execute(
            "INSERT INTO session_controls (id, session_id, verb, created_at)"
            " VALUES ('c1', ?, 'bogus', 1.0)",
            (SID,),
        )
    with pytest.raises(UsageError, match="bogus"):
        db.insert_control(session_id=SID, verb="bogus", payload=None)  # type: ignore[arg-type]
    # 'stop' is reserved by the schema and may be inserted.
    db.insert_control(session_id=SID, verb="stop", payload=None)
    assert db.count_controls() == 1


def test_delete_session_cascades(db: StateDB, raw: sqlite3.Connection) -> None:
    insert_session(raw, SID)
    db.insert_control(session_id=SID, verb="pause", payload=None)
    raw.execute("DELETE FROM sessions WHERE id = ?", (SID,))
    assert db.count_controls() == 0


def test_control_for_unknown_session_is_refused_by_fk(db: StateDB) -> None:
    with pytest.raises(Exception, match="FOREIGN KEY"):
        db.insert_control(session_id="f" * 32, verb="pause", payload=None)
    assert db.count_controls() == 0


def test_pending_query_uses_partial_index(db: StateDB, raw: sqlite3.Connection) -> None:
    insert_session(raw, SID)
    for _ in range(5):
        db.insert_control(session_id=SID, verb="pause", payload=None)
    plan = raw.execute("EXPLAIN QUERY PLAN " + PENDING_CONTROLS_SQL, (SID,)).fetchall()
    details = " | ".join(str(r[3]) for r in plan)
    assert "idx_session_controls_pending" in details, details
