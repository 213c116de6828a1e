"""Owner liveness: a ``running`` session whose owner died is reported ``interrupted``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from steerflow.state import HEARTBEAT_STALE_S, Owner, StateDB, effective_status
from steerflow.state._owner import pid_alive, process_start_time

_CHILD = """
import sys
from pathlib import Path
from steerflow.state import StateDB
with StateDB.open(Path(sys.argv[1])) as db:
    print(db.create_session(kind="flow").id)
"""


def test_owner_current() -> None:
    me = Owner.current()
    assert me.pid == os.getpid()
    assert me.host
    if sys.platform.startswith("linux"):
        assert me.started_at is not None
        assert 0 < me.started_at <= time.time() + 1
        assert process_start_time(os.getpid()) == me.started_at
    assert pid_alive(os.getpid())


def test_session_of_an_exited_process_is_interrupted(home: Path) -> None:
    StateDB.open(home).close()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(home)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    sid = done.stdout.strip()
    with StateDB.open(home) as db:
        row = db.get_session(sid)
        assert row is not None and row.status == "running"
        assert row.owner_pid != os.getpid()
        assert effective_status(row) == "interrupted"
        assert db.effective_status(row) == "interrupted"
        assert db.mark_interrupted_if_dead(sid) is True
        stored = db.get_session(sid)
        assert stored is not None and stored.status == "interrupted"
        assert db.mark_interrupted_if_dead(sid) is False


def test_session_of_this_process_is_running(db: StateDB) -> None:
    row = db.create_session(kind="flow")
    assert effective_status(row) == "running"
    assert db.mark_interrupted_if_dead(row.id) is False
    stored = db.get_session(row.id)
    assert stored is not None and stored.status == "running"


def test_reused_pid_is_dead(db: StateDB) -> None:
    me = Owner.current()
    assert me.started_at is not None, "Linux /proc gives every process a start time"
    imposter = Owner(host=me.host, pid=me.pid, started_at=me.started_at - 100.0)
    row = db.create_session(kind="flow", owner=imposter)
    assert effective_status(row) == "interrupted"
    close = Owner(host=me.host, pid=me.pid, started_at=me.started_at + 0.5)
    assert effective_status(db.create_session(kind="flow", owner=close)) == "running"


def test_foreign_host_uses_the_heartbeat(db: StateDB) -> None:
    foreign = Owner(host="some-other-host.invalid", pid=1, started_at=1.0)
    row = db.create_session(kind="flow", owner=foreign)
    assert row.heartbeat_at is not None
    assert effective_status(row) == "running"
    assert effective_status(row, now=row.heartbeat_at + HEARTBEAT_STALE_S - 1) == "running"
    assert effective_status(row, now=row.heartbeat_at + HEARTBEAT_STALE_S + 1) == "interrupted"
    assert db.mark_interrupted_if_dead(row.id) is False  # heartbeat still fresh


def test_foreign_host_with_old_heartbeat_is_interrupted(
    db: StateDB, raw: sqlite3.Connection
) -> None:
    foreign = Owner(host="some-other-host.invalid", pid=1, started_at=1.0)
    sid = db.create_session(kind="agent", owner=foreign).id
    raw.execute("UPDATE sessions SET heartbeat_at = ? WHERE id = ?",
                (time.time() - HEARTBEAT_STALE_S - 5, sid))  # fmt: skip
    row = db.get_session(sid)
    assert row is not None and effective_status(row) == "interrupted"
    assert db.mark_interrupted_if_dead(sid) is True


def test_finished_sessions_are_reported_as_stored(db: StateDB) -> None:
    foreign = Owner(host="some-other-host.invalid", pid=1, started_at=1.0)
    row = db.create_session(kind="flow", owner=foreign)
    db.set_session_status(row.id, "completed")
    stored = db.get_session(row.id)
    assert stored is not None
    assert effective_status(stored, now=time.time() + 10 * HEARTBEAT_STALE_S) == "completed"
    assert db.mark_interrupted_if_dead(row.id) is False
