"""Lock waits are bounded: a held write lock becomes ``DatabaseBusyError``, never a hang."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from steerflow.errors import DatabaseBusyError, RefusedError
from steerflow.state import StateDB


@contextmanager
def _held_in_thread(path: Path, hold_s: float = 30.0) -> Iterator[threading.Event]:
    """Hold ``BEGIN IMMEDIATE`` on ``path`` from another thread until released."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(hold_s)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(5)
    try:
        yield release
    finally:
        release.set()
        thread.join()


def test_busy_write_raises_within_bound(home: Path) -> None:
    with StateDB.open(home) as setup:
        sid = setup.create_session(kind="flow").id
    with StateDB.open(home, busy_timeout_s=0.2) as db:
        assert db.path is not None
        with _held_in_thread(db.path):
            started = time.monotonic()
            with pytest.raises(DatabaseBusyError) as info:
                db.insert_control(session_id=sid, verb="pause", payload=None)
            assert time.monotonic() - started < 3.0
            assert "database busy" in str(info.value) and str(db.path) in str(info.value)
            assert isinstance(info.value, RefusedError) and info.value.exit_code == 3
            with pytest.raises(DatabaseBusyError):
                db.update_node_metadata(sid, {"a": 1})
            with pytest.raises(DatabaseBusyError):
                db.claim_control("0" * 32, "h:1:x")
            # WAL readers are not blocked by the writer
            assert db.get_session(sid) is not None
            assert db.list_pending_controls(sid) == []
        # the connection is usable once the lock is gone
        db.insert_control(session_id=sid, verb="pause", payload=None)
        assert db.count_controls() == 1


def test_open_of_current_schema_needs_no_write_lock(home: Path) -> None:
    StateDB.open(home).close()
    with _held_in_thread(home / "state.db"), StateDB.open(home, busy_timeout_s=0.2) as db:
        assert db.list_sessions() == []


def test_writer_waits_for_a_short_lock(home: Path) -> None:
    with StateDB.open(home, busy_timeout_s=5.0) as db:
        assert db.path is not None
        with _held_in_thread(db.path) as release:
            threading.Timer(0.3, release.set).start()
            sid = db.create_session(kind="flow").id
        assert db.get_session(sid) is not None


_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
"""


def test_busy_when_another_process_holds_the_lock(home: Path) -> None:
    with StateDB.open(home, busy_timeout_s=0.2) as db:
        sid = db.create_session(kind="flow").id
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(db.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            started = time.monotonic()
            with pytest.raises(DatabaseBusyError):
                db.set_session_status(sid, "completed")
            assert time.monotonic() - started < 3.0
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
        assert db.set_session_status(sid, "completed")
