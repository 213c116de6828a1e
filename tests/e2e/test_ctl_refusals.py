"""``ctl`` writers refuse before inserting anything (ADR-0069 D1, CONTRACT §3).

Sessions, invocations and plays with chosen ids are written straight into a
real state DB; each refusal must exit 3 and leave ``session_controls`` as it was.
"""

from __future__ import annotations

import functools
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctl_support import count_controls, ctl, ctl_ok, state_db

from steerflow.cli import main as cli_main
from steerflow.control import enqueue_control
from steerflow.errors import DatabaseBusyError
from steerflow.state import Owner, StateDB

PREFIX = "abcd" * 7 + "012"  # 31 characters shared by two sessions
SESSION_A = PREFIX + "a"
SESSION_B = PREFIX + "b"
INVOCATION_ONLY = "e1" * 16  # an invocation id no session id shares a prefix with
PLAY_ONLY = "f2" * 16


def _insert_session(conn: sqlite3.Connection, sid: str, kind: str, status: str = "running") -> None:
    me = Owner.current()
    now = time.time()
    conn.execute(
        "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at, node_metadata,"
        " owner_host, owner_pid, owner_started, heartbeat_at)"
        " VALUES (?, ?, ?, 'executing', ?, ?, '{}', ?, ?, ?, ?)",
        (sid, kind, status, now, now, me.host, me.pid, me.started_at, now),
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    with StateDB.open(home) as db:
        assert db.path is not None
        conn = sqlite3.connect(db.path, isolation_level=None)
        try:
            _insert_session(conn, SESSION_A, "flow")
            _insert_session(conn, SESSION_B, "flow")
            _insert_session(conn, "c0" * 16, "flow", status="completed")
            _insert_session(conn, "d0" * 16, "agent")
            _insert_session(conn, "9a" * 16, "play")
            conn.execute(
                "INSERT INTO invocations (id, session_id, kind, status, created_at, updated_at)"
                " VALUES (?, ?, 'agent', 'running', 1.0, 1.0)",
                (INVOCATION_ONLY, SESSION_A),
            )
            conn.execute(
                "INSERT INTO plays (id, session_id, invocation_id, playbook, created_at)"
                " VALUES (?, ?, NULL, 'demo', 1.0)",
                (PLAY_ONLY, "9a" * 16),
            )
        finally:
            conn.close()
    return home


def _refused(home: Path, *args: str, expect: str) -> None:
    before = count_controls(home)
    proc = ctl(home, *args)
    assert proc.returncode == 3, (args, proc.returncode, proc.stdout, proc.stderr)
    assert expect in proc.stderr, (args, proc.stderr)
    assert proc.stdout == ""
    assert count_controls(home) == before


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_refusals_insert_nothing(home: Path) -> None:
    _refused(home, "pause", "0123", expect="unknown id")
    _refused(home, "msg", "ffffffff", "hello", expect="unknown id")
    _refused(home, "pause", "NOT-HEX", expect="unknown id")
    _refused(home, "pause", "abcd", expect="ambiguous id")
    _refused(home, "resume", PREFIX, expect="ambiguous id")  # 31 of 32 characters
    _refused(home, "pause", "c0c0", expect="not running")
    _refused(home, "msg", "c0" * 16, "hello", expect="not running")
    not_for_agents = "not accepted by an invocation of kind 'agent'"
    _refused(home, "pause", "d0d0", expect=not_for_agents)
    _refused(home, "resume", "d0" * 16, expect=not_for_agents)
    # Kind comes from the matched invocation, not from its session (a flow).
    _refused(home, "pause", INVOCATION_ONLY[:6], expect=not_for_agents)
    assert count_controls(home) == 0


def test_dead_owner_reads_not_running(home: Path) -> None:
    with state_db(home) as db:
        assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None)
    try:
        conn.execute("UPDATE sessions SET owner_pid = ? WHERE id = ?", (_dead_pid(), SESSION_A))
    finally:
        conn.close()
    _refused(home, "pause", SESSION_A, expect="interrupted, not running")


def test_accepted_targets(home: Path) -> None:
    # A full-length id skips the ambiguity check its 31-character prefix fails.
    cid = ctl_ok(home, "pause", SESSION_A)
    # Messages are accepted by the agent kind too (ADR-0108).
    mid = ctl_ok(home, "msg", "d0d0", "for the agent")
    # A play id (prefix) resolves to its session.
    pid = ctl_ok(home, "resume", PLAY_ONLY[:5])
    with state_db(home) as db:
        rows = {c.id: c for s in (SESSION_A, "d0" * 16, "9a" * 16) for c in db.list_controls(s)}
    assert rows[cid].session_id == SESSION_A and rows[cid].verb == "pause"
    assert rows[cid].payload is None and rows[cid].is_pending
    assert rows[mid].session_id == "d0" * 16 and rows[mid].payload == {"text": "for the agent"}
    assert rows[pid].session_id == "9a" * 16 and rows[pid].verb == "resume"
    assert count_controls(home) == 3


def test_sessions_are_searched_before_invocations(home: Path) -> None:
    # "e1" matches the invocation only; once a session shares the prefix, it wins.
    with state_db(home) as db:
        assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None)
    try:
        _insert_session(conn, "e1" + "0" * 30, "flow")
    finally:
        conn.close()
    cid = ctl_ok(home, "pause", "e1")
    with state_db(home) as db:
        row = db.get_control(cid)
    assert row is not None and row.session_id == "e1" + "0" * 30


def test_missing_state_db_is_refused_and_not_created(tmp_path: Path) -> None:
    empty = tmp_path / "nothing-here"
    for args in (("pause", "abcd"), ("msg", "abcd", "x"), ("status", "abcd"),
                 ("resolve", "a" * 32, "--as", "applied")):  # fmt: skip
        proc = ctl(empty, *args)
        assert proc.returncode == 3, (args, proc.stderr)
        assert "no state database" in proc.stderr
    assert not (empty / "state.db").exists()


def test_busy_database_is_refused_quickly_at_library_level(home: Path) -> None:
    with state_db(home) as db:
        assert db.path is not None
    holder = sqlite3.connect(db.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(DatabaseBusyError, match="database busy"):
            enqueue_control(home, SESSION_A, "pause", busy_timeout_s=0.2)
        assert time.monotonic() - started < 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert count_controls(home) == 0


def test_busy_database_exits_3_database_busy_with_a_short_bound(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's answer to a lock wait past its bound: exit 3, "database busy", nothing
    queued. The real ``enqueue_control`` on a real lock, with the bound cut to 0.2 s; the
    same through a subprocess and the full 10 s bound is the ``slow`` test below."""
    import steerflow.control

    short = functools.partial(enqueue_control, busy_timeout_s=0.2)
    monkeypatch.setattr(steerflow.control, "enqueue_control", short)
    with state_db(home) as db:
        assert db.path is not None
    holder = sqlite3.connect(db.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        code = cli_main(["--home", str(home), "ctl", "pause", SESSION_A])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 3
    assert "database busy" in capsys.readouterr().err
    assert count_controls(home) == 0


@pytest.mark.slow
def test_busy_database_exits_3_database_busy(home: Path) -> None:
    """The real CLI waits its full 10 s bound, then reports a busy database."""
    with state_db(home) as db:
        assert db.path is not None
    holder = sqlite3.connect(db.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        proc = ctl(home, "pause", SESSION_A, timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 3
    assert "database busy" in proc.stderr
    assert count_controls(home) == 0
