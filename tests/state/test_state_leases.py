"""Leases with fencing in the state DB (issue 27, decision 120), on both backends.

An owner on another host is judged by ``lease_expires`` against the database's own clock,
never by the caller's: the tests age the lease (or the heartbeat) in the row, as the
two-host tests do, rather than wait. A takeover raises the old session's epoch in the
resume's own transaction; every write the old owner fences at its epoch is then refused.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pg_support import PgRaw, PgServer
from steerflow.errors import LeaseLostError, ResumeClaimedError, StateDBLostError
from steerflow.state import (
    HEARTBEAT_STALE_S,
    LEASE_ENV,
    STATE_DB_URL_ENV,
    NodeUpdate,
    Owner,
    ResumeClaim,
    SessionRow,
    StateDB,
    lease_seconds,
)
from waiting import wait_until

SOURCE = "20260101T000000-aaaaaa"
ELSEWHERE = Owner(host="host-elsewhere", pid=4242, started_at=None)


def _claim(*, fork: bool = False) -> ResumeClaim:
    return ResumeClaim(SOURCE, fork=fork, has_checkpoint=lambda _run: False)


def _db_now(db: StateDB) -> float:
    return float(db.backend.query(f"SELECT {db.backend.clock_sql} AS now")[0]["now"])


def _source(db: StateDB, owner: Owner = ELSEWHERE, lease_s: float = 30.0) -> SessionRow:
    return db.create_session(kind="flow", run_id=SOURCE, owner=owner, lease_s=lease_s)


def _set(raw: Any, sid: str, **columns: float | None) -> None:
    assignments = ", ".join(f"{name} = ?" for name in columns)
    raw.execute(f"UPDATE sessions SET {assignments} WHERE id = ?", (*columns.values(), sid))


def _row(db: StateDB, sid: str) -> SessionRow:
    row = db.get_session(sid)
    assert row is not None
    return row


def _count(db: StateDB) -> int:
    return int(db.backend.query("SELECT COUNT(*) AS n FROM sessions")[0]["n"])


def test_a_new_session_holds_a_lease_by_the_db_clock(db: StateDB) -> None:
    before = _db_now(db)
    row = _source(db, lease_s=7.5)
    assert row.lease_epoch == 1 and row.lease_taken_by is None
    assert row.lease_expires is not None
    assert before + 7.5 <= row.lease_expires <= _db_now(db) + 7.5
    assert _row(db, row.id) == row
    # the DB's clock moves on before the renewal, so its heartbeat is later
    wait_until(lambda: _db_now(db) > (row.heartbeat_at or 0), timeout=10, what="the DB clock")
    db.renew_lease(row.id, 1, 20.0)
    renewed = _row(db, row.id)
    assert renewed.lease_expires is not None and renewed.lease_expires >= before + 20.0
    assert renewed.heartbeat_at is not None and row.heartbeat_at is not None
    assert renewed.heartbeat_at > row.heartbeat_at  # the renewal is the heartbeat


def test_a_fresh_lease_elsewhere_refuses_the_takeover_whatever_the_heartbeat(
    db: StateDB, raw: Any
) -> None:
    source = _source(db)
    # The caller's clock (heartbeat_at) says stale; the database's lease says held.
    _set(raw, source.id, heartbeat_at=time.time() - 10 * HEARTBEAT_STALE_S)
    with pytest.raises(ResumeClaimedError) as refused:
        db.create_session(kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim())
    text = str(refused.value)
    assert f"run {SOURCE} is still running (session {source.id}" in text
    assert "host-elsewhere" in text and "lease runs" in text, text
    before = _row(db, source.id)
    for fork in (False, True):
        with pytest.raises(ResumeClaimedError):
            db.check_resume(_claim(fork=fork))
        with pytest.raises(ResumeClaimedError):
            db.create_session(
                kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim(fork=fork)
            )
    assert _count(db) == 1 and _row(db, source.id) == before
    assert before.lease_epoch == 1 and before.status == "running"


def test_an_expired_lease_is_taken_over_and_fences_its_old_owner(db: StateDB, raw: Any) -> None:
    source = _source(db)
    db.upsert_nodes(source.id, [NodeUpdate("a", "planned", "running")], epoch=1)
    # Expired by the database's clock, although the caller's heartbeat looks fresh.
    _set(raw, source.id, lease_expires=_db_now(db) - 1.0, heartbeat_at=time.time() + 3600)
    resumed = db.create_session(kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim())
    assert resumed.lease_epoch == 2
    taken = _row(db, source.id)
    assert (taken.status, taken.lease_epoch, taken.lease_taken_by) == (
        "interrupted", 2, resumed.id
    )  # fmt: skip
    # Every fenced write of the old owner is refused, and writes nothing.
    fenced: list[Any] = [
        lambda: db.renew_lease(source.id, 1, 30.0),
        lambda: db.upsert_nodes(source.id, [NodeUpdate("a", "planned", "completed")], epoch=1),
        lambda: db.set_session_status(source.id, "completed", epoch=1),
        lambda: db.update_node_metadata(source.id, {"finished_at": 1.0}, epoch=1),
    ]
    for write in fenced:
        with pytest.raises(LeaseLostError) as lost:
            write()
        assert lost.value.exit_code == 3
        assert "taken over" in str(lost.value) and resumed.id in str(lost.value)
        assert lost.value.new_session_id == resumed.id
        assert lost.value.new_host == resumed.owner_host
    assert [n.status for n in db.list_nodes(source.id)] == ["running"]
    after = _row(db, source.id)
    assert after.status == "interrupted" and "finished_at" not in after.node_metadata
    # The new owner's own writes go through at its epoch.
    db.renew_lease(resumed.id, 2, 30.0)
    db.set_session_status(resumed.id, "completed", epoch=2)


def test_a_row_from_before_leases_is_judged_by_its_heartbeat(db: StateDB, raw: Any) -> None:
    source = _source(db)
    _set(raw, source.id, lease_expires=None, heartbeat_at=_db_now(db) - 1.0)
    with pytest.raises(ResumeClaimedError):
        db.check_resume(_claim())
    _set(raw, source.id, heartbeat_at=_db_now(db) - HEARTBEAT_STALE_S - 1.0)
    resumed = db.create_session(kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim())
    assert _row(db, source.id).lease_taken_by == resumed.id


def test_on_this_host_the_process_table_decides(db: StateDB, raw: Any) -> None:
    live = _source(db, owner=Owner.current())  # this process: alive, whatever its lease
    _set(raw, live.id, lease_expires=_db_now(db) - 100.0)
    with pytest.raises(ResumeClaimedError, match="is still running"):
        db.check_resume(_claim())
    _set(raw, live.id, owner_pid=_reaped_pid(), lease_expires=_db_now(db) + 100.0)
    # Dead on this host: taken over at once, although its lease has not run out.
    resumed = db.create_session(kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim())
    assert _row(db, live.id).lease_taken_by == resumed.id


def _reaped_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_a_stale_resume_holder_dropped_by_a_fork_is_fenced(db: StateDB, raw: Any) -> None:
    holder = db.create_session(
        kind="flow", run_id="20260101T000001-bbbbbb", owner=ELSEWHERE, resume=_claim()
    )
    _set(raw, holder.id, lease_expires=_db_now(db) - 1.0)
    fork = db.create_session(kind="flow", run_id="20260101T000002-cccccc", resume=_claim(fork=True))
    # Its claim is dropped (no checkpoint): it must not wake up and run the source again.
    assert _row(db, holder.id).lease_taken_by == fork.id
    with pytest.raises(LeaseLostError):
        db.renew_lease(holder.id, holder.lease_epoch, 30.0)


def test_a_missing_row_is_a_lost_database(db: StateDB, raw: Any) -> None:
    source = _source(db)
    raw.execute("DELETE FROM sessions WHERE id = ?", (source.id,))
    with pytest.raises(StateDBLostError, match="no longer has session"):
        db.renew_lease(source.id, 1, 30.0)
    with pytest.raises(StateDBLostError):
        db.upsert_nodes(source.id, [NodeUpdate("a", "planned", "running")], epoch=1)


def test_the_takeover_rechecks_a_lease_renewed_meanwhile(
    pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL runs writers side by side: the owner renews while the resume checks.

    (On SQLite ``BEGIN IMMEDIATE`` serializes the renewal and the takeover whole.)
    """
    url = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, url)
    # Two processes: the owner's connection is its own (decision 360).
    db, owner = StateDB.open_url(url), StateDB.open_url(url, own_connection=True)
    raw = PgRaw(url)
    outcome: dict[str, object] = {}
    try:
        source = _source(db)
        _set(raw, source.id, lease_expires=_db_now(db) - 1.0)
        with owner.backend.transaction(write=True) as tx:  # the owner's renewal, not committed
            tx.execute(
                f"UPDATE sessions SET lease_expires = {owner.backend.clock_sql} + 30"
                " WHERE id = ? AND lease_epoch = 1",
                (source.id,),
            )

            def resume() -> None:
                try:
                    outcome["r"] = db.create_session(
                        kind="flow", run_id="20260101T000001-bbbbbb", resume=_claim()
                    )
                except BaseException as exc:
                    outcome["r"] = exc

            racer = threading.Thread(target=resume)
            racer.start()
            # The resume read the expired lease and now waits for the row's lock.
            wait_until(lambda: _waiting_for_lock(raw), timeout=10, what="the resume blocked")
        racer.join(timeout=30)
        assert isinstance(outcome["r"], ResumeClaimedError), outcome
        assert "renewed its lease" in str(outcome["r"])
        assert _count(db) == 1 and _row(db, source.id).lease_epoch == 1
    finally:
        for closing in (db, owner, raw):
            closing.close()


def _waiting_for_lock(raw: Any) -> int:
    row = raw.execute(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    ).fetchone()
    return int(row[0])


def test_lease_seconds_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEASE_ENV, raising=False)
    assert lease_seconds() == 30.0
    monkeypatch.setenv(LEASE_ENV, "2.5")
    assert lease_seconds() == 2.5
    monkeypatch.setenv(LEASE_ENV, "3600")
    assert lease_seconds() == 3600.0
    for bad in ("0", "-1", "nan", "inf", "soon", "0.4", "3600.5", "1e12", "1e300"):
        monkeypatch.setenv(LEASE_ENV, bad)
        with pytest.raises(Exception, match=LEASE_ENV) as refused:
            lease_seconds()
        assert refused.value.exit_code == 2  # type: ignore[attr-defined]
        # The variable, the value and the range; never a 300-digit number (issue 38).
        assert str(refused.value) == (
            f"invalid value for {LEASE_ENV}: {bad!r} is not a number of seconds from 0.5 to 3600"
        )


@pytest.mark.parametrize(
    ("how", "words"),
    [("deleted", "was deleted"), ("replaced", "was replaced"), ("unwritable", "made unwritable")],
)
def test_the_sqlite_file_is_checked_by_identity(
    home: Path, how: str, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    with StateDB.open(home) as db:
        db.check_file()
        path = home / "state.db"
        if how == "deleted":
            path.unlink()
        elif how == "replaced":
            other = tmp_path / "other"
            StateDB.open(other).close()
            os.rename(other / "state.db", path)
        else:
            path.chmod(stat.S_IRUSR)
        with pytest.raises(StateDBLostError, match=words):
            db.check_file()
        with pytest.raises(StateDBLostError, match=words):
            db.renew_lease("0" * 32, 1, 30.0)  # the renewal checks the file first
