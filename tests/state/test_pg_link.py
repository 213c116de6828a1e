"""One PostgreSQL connection per process (decision 360): every handle shares it, its LISTEN
rides it, and a notification sent while it is busy, or idle, still reaches the subscriber.

Against the real server of tests/conftest.py; the connections are counted in
``pg_stat_activity`` by this process's ``application_name`` (``steerflow:<pid>``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pg_support import PgRaw, PgServer
from steerflow.state import STATE_DB_URL_ENV, StateDB
from waiting import wait_until


@pytest.fixture
def url(pg: PgServer, monkeypatch: pytest.MonkeyPatch) -> str:
    fresh = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, fresh)
    return fresh


def _mine(raw: PgRaw) -> int:
    row = raw.execute(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = ?",
        (f"steerflow:{os.getpid()}",),
    ).fetchone()
    return int(row[0])


def test_every_handle_of_a_process_shares_one_connection(url: str, tmp_path: Path) -> None:
    raw = PgRaw(url)
    try:
        # Earlier tests of this worker process may have left handles open on their own
        # databases: count from what is there now. A closed connection's server process
        # leaves pg_stat_activity a moment after the close: waited for, bounded.
        base = _mine(raw)

        def settles(n: int, what: str) -> None:
            wait_until(lambda: _mine(raw) == base + n, timeout=10, what=what)

        first = StateDB.open(tmp_path / "home")
        others = [StateDB.open(tmp_path / "home", create=False) for _ in range(3)]
        sid = first.create_session(kind="flow").id
        unwatch = others[0].watch_controls(sid, lambda: None)  # the LISTEN rides it too
        assert unwatch is not None
        others[1].data_version()
        assert _mine(raw) == base + 1
        own = StateDB.open(tmp_path / "home", create=False, own_connection=True)
        assert _mine(raw) == base + 2  # a test's second "process"
        own.close()
        for db in others:
            db.close()
        settles(1, "the own connection's close")
        assert first.get_session(sid) is not None  # closing a handle left the connection
        assert _mine(raw) == base + 1
        first.close()
        settles(0, "the last handle's close")
    finally:
        raw.close()


def test_a_notification_sent_while_the_connection_is_busy_is_delivered(
    url: str, tmp_path: Path
) -> None:
    db = StateDB.open(tmp_path / "home")
    writer = StateDB.open(tmp_path / "home", own_connection=True)  # another process's
    try:
        sid = writer.create_session(kind="flow").id
        woken = threading.Event()
        unwatch = db.watch_controls(sid, woken.set)
        assert unwatch is not None
        before = db.data_version()
        # A statement holds the shared connection while the insert's NOTIFY arrives.
        busy = threading.Thread(target=db.backend.query, args=("SELECT pg_sleep(1)",))
        busy.start()
        wait_until(
            lambda: writer.backend.query(
                "SELECT COUNT(*) AS n FROM pg_stat_activity"
                " WHERE wait_event = 'PgSleep' AND query LIKE 'SELECT pg_sleep%'"
            )[0]["n"],
            timeout=10,
            what="the shared connection busy",
        )
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        busy.join(timeout=10)
        assert woken.wait(10), "the notification was lost to the busy connection"
        assert db.data_version() > before
    finally:
        db.close()
        writer.close()


def test_an_idle_connection_hands_on_a_notification_without_a_statement(
    url: str, tmp_path: Path
) -> None:
    db = StateDB.open(tmp_path / "home")
    writer = StateDB.open(tmp_path / "home", own_connection=True)
    try:
        sid = writer.create_session(kind="flow").id
        other = writer.create_session(kind="flow").id
        woken: list[str] = []
        assert db.watch_controls(sid, lambda: woken.append(sid)) is not None
        assert db.watch_controls(other, lambda: woken.append(other)) is not None
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        # Nothing else runs on the shared connection: only its idle reader can wake us.
        wait_until(lambda: woken, timeout=10, what="the idle notification")
        assert woken == [sid]  # dispatched by session id
    finally:
        db.close()
        writer.close()
