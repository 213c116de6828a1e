"""The PostgreSQL backend's own contract: D1 in PostgreSQL's catalog, migrations under an
advisory lock, bounded lock waits, commit-order ``created_at``, NOTIFY, the missing extra.

The behaviour both backends share runs on both through ``state_backend``; these tests read
what only PostgreSQL has, against the real server of tests/conftest.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from state_support import insert_session

from pg_support import PgRaw, PgServer
from steerflow.errors import DatabaseBusyError, ExitCode
from steerflow.state import SCHEMA_VERSION, STATE_DB_URL_ENV, StateDB, db_exists
from steerflow.state._db import PENDING_CONTROLS_SQL
from steerflow.state._postgres import _key
from waiting import wait_until

SID = "a" * 32


@pytest.fixture
def url(pg: PgServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty PostgreSQL database selected for this test."""
    fresh = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, fresh)
    return fresh


@pytest.fixture
def pgdb(url: str, tmp_path: Path) -> Iterator[StateDB]:
    with StateDB.open(tmp_path / "home") as opened:
        yield opened


@pytest.fixture
def raw(pgdb: StateDB, url: str) -> Iterator[PgRaw]:
    conn = PgRaw(url)
    try:
        yield conn
    finally:
        conn.close()


def test_session_controls_columns_check_and_index_are_d1(raw: PgRaw) -> None:
    columns = raw.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
        " WHERE table_name = 'session_controls' AND table_schema = current_schema()"
        " ORDER BY ordinal_position"
    ).fetchall()
    assert columns == [
        ("id", "text", "NO"),
        ("session_id", "text", "NO"),
        ("verb", "text", "NO"),
        ("payload", "json", "YES"),
        ("created_at", "double precision", "NO"),  # REAL would be 4 bytes here
        ("applied_at", "double precision", "YES"),
        ("result", "text", "YES"),
        ("sender", "text", "YES"),  # schema migration 7: who queued it
    ]
    (fk,) = raw.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'session_controls'::regclass AND contype = 'f'"
    ).fetchone()
    assert fk == "FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE"
    (check,) = raw.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'session_controls'::regclass AND contype = 'c'"
    ).fetchone()
    for verb in ("pause", "resume", "message", "stop"):
        assert f"'{verb}'::text" in check
    (index,) = raw.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_session_controls_pending'"
        " AND schemaname = current_schema()"
    ).fetchone()
    assert index.startswith("CREATE INDEX idx_session_controls_pending ON ")
    assert index.endswith(
        ".session_controls USING btree (session_id, applied_at) WHERE (applied_at IS NULL)"
    )


def test_check_refuses_a_bogus_verb_and_accepts_stop(pgdb: StateDB, raw: PgRaw) -> None:
    insert_session(raw, SID)
    with pytest.raises(psycopg.errors.CheckViolation):
        raw.execute(
            "INSERT INTO session_controls (id, session_id, verb, created_at)"
            " VALUES (?, ?, 'bogus', 1.0)",
            ("b" * 32, SID),
        )
    pgdb.insert_control(session_id=SID, verb="stop", payload=None)
    assert pgdb.set_session_status(SID, "stopped")  # migration 3 widened the status CHECK
    assert pgdb.count_controls() == 1


def test_pending_query_can_use_the_partial_index(pgdb: StateDB, raw: PgRaw) -> None:
    insert_session(raw, SID)
    for _ in range(5):
        pgdb.insert_control(session_id=SID, verb="pause", payload=None)
    raw.execute("SET enable_seqscan = off")
    plan = raw.execute("EXPLAIN " + PENDING_CONTROLS_SQL.replace("?", "'" + SID + "'")).fetchall()
    assert "idx_session_controls_pending" in " ".join(r[0] for r in plan)


def test_first_opens_from_many_processes_migrate_once(url: str, tmp_path: Path) -> None:
    assert not db_exists(tmp_path)
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            StateDB.open(tmp_path / "home").close()
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    conn = PgRaw(url)
    try:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    finally:
        conn.close()
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert db_exists(tmp_path)


def test_a_reader_never_creates_the_tables(url: str, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no state database at postgresql://"):
        StateDB.open(tmp_path / "home", create=False)
    assert not db_exists(tmp_path)


def test_a_lock_wait_past_the_bound_is_database_busy(url: str, tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "home") as db:
        sid = db.create_session(kind="flow").id
    holder = psycopg.connect(url)  # a writer of this session that does not commit
    holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_key("session"), _key(sid)))
    try:
        with StateDB.open(tmp_path / "home", busy_timeout_s=0.2) as db:
            with pytest.raises(DatabaseBusyError, match="database busy") as caught:
                db.insert_control(session_id=sid, verb="pause", payload=None)
            assert caught.value.exit_code == ExitCode.REFUSED
            assert db.count_controls() == 0
    finally:
        holder.rollback()
        holder.close()


def test_created_at_follows_commit_order_under_concurrent_writers(pgdb: StateDB) -> None:
    """A consumer stamping rows as they become visible never meets one that sorts
    before a row it already stamped (what the per-session lock guarantees)."""
    sid = pgdb.create_session(kind="flow").id
    writers, per_writer = 4, 25
    done = threading.Event()
    late: list[str] = []

    def consume() -> None:
        with StateDB.open(Path("unused")) as mine:
            last: tuple[float, str] = (float("-inf"), "")
            while True:
                finished = done.is_set()
                for row in mine.list_pending_controls(sid):
                    if (row.created_at, row.id) < last:
                        late.append(row.id)
                    last = max(last, (row.created_at, row.id))
                    mine.finalize_control(row.id, "applied")
                if finished:
                    return

    def write() -> None:
        with StateDB.open(Path("unused")) as mine:
            for _ in range(per_writer):
                mine.insert_control(session_id=sid, verb="pause", payload=None)

    consumer = threading.Thread(target=consume)
    consumer.start()
    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    consumer.join()
    assert late == []
    assert len(pgdb.list_controls(sid)) == writers * per_writer


def test_an_insert_notifies_the_watchers_of_its_session(pgdb: StateDB) -> None:
    sid = pgdb.create_session(kind="flow").id
    other = pgdb.create_session(kind="flow").id
    seen: list[str] = []
    stop = pgdb.watch_controls(sid, lambda: seen.append("ours"))
    assert stop is not None
    before = pgdb.data_version()
    with StateDB.open(Path("unused")) as writer:
        writer.insert_control(session_id=other, verb="pause", payload=None)
        writer.insert_control(session_id=sid, verb="pause", payload=None)
    wait_until(lambda: seen == ["ours"], timeout=10, what="one notification for our session")
    wait_until(lambda: pgdb.data_version() == before + 2, timeout=10, what="both counted")
    stop()
    with StateDB.open(Path("unused")) as writer:
        writer.insert_control(session_id=sid, verb="resume", payload=None)
    wait_until(lambda: pgdb.data_version() == before + 3, timeout=10, what="third counted")
    assert seen == ["ours"]


def test_without_the_extra_a_postgresql_url_is_one_line_naming_it(url: str, tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from steerflow.cli import main\n"
        f"sys.exit(main(['--home', {str(tmp_path / 'home')!r}, 'runs']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "steerflow[postgres]" in lines[0], proc.stderr
