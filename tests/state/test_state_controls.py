"""Queue semantics of ``session_controls``: ordering, claim, finalize, resolve."""

from __future__ import annotations

import sqlite3

import pytest
from state_support import insert_session

from steerflow.errors import ControlNotApplyingError, UnknownIdError
from steerflow.state import ControlRow, StateDB

SID = "5" * 32
OTHER = "6" * 32


@pytest.fixture
def sid(raw: sqlite3.Connection) -> str:
    insert_session(raw, SID)
    insert_session(raw, OTHER)
    return SID


def _raw_control(conn: sqlite3.Connection, cid: str, created_at: float, *,
                 sid: str = SID, result: str | None = None,
                 applied_at: float | None = None) -> None:  # fmt: skip
    conn.execute(
        "INSERT INTO session_controls (id, session_id, verb, payload, created_at, applied_at,"
        " result) VALUES (?, ?, 'message', ?, ?, ?, ?)",
        (cid, sid, f'{{"text":"{cid}"}}', created_at, applied_at, result),
    )


def test_insert_shape(db: StateDB, sid: str) -> None:
    row = db.insert_control(session_id=sid, verb="message", payload={"text": "hello"})
    assert len(row.id) == 32 and int(row.id, 16) >= 0 and row.id == row.id.lower()
    assert (row.session_id, row.verb, row.payload) == (sid, "message", {"text": "hello"})
    assert row.applied_at is None and row.result is None and row.is_pending
    assert db.get_control(row.id) == row
    paused = db.insert_control(session_id=sid, verb="pause", payload=None)
    assert db.get_control(paused.id) == paused and paused.payload is None
    assert db.get_control(row.id[:8]) is None  # exact ids only
    assert db.count_controls() == 2


def test_ordering_by_created_at_then_id_with_ties(
    db: StateDB, raw: sqlite3.Connection, sid: str
) -> None:
    _raw_control(raw, "c" * 32, 5.0)
    _raw_control(raw, "b" * 32, 5.0)
    _raw_control(raw, "d" * 32, 1.0)
    _raw_control(raw, "a" * 32, 9.0)
    _raw_control(raw, "0" * 32, 5.0, sid=OTHER)
    expected = ["d" * 32, "b" * 32, "c" * 32, "a" * 32]
    assert [c.id for c in db.list_pending_controls(sid)] == expected
    assert [c.id for c in db.list_controls(sid)] == expected
    assert db.list_pending_controls(sid)[0].payload == {"text": "d" * 32}


def test_rapid_inserts_keep_insert_order(db: StateDB, sid: str) -> None:
    made = [db.insert_control(session_id=sid, verb="message", payload={"text": str(i)})
            for i in range(20)]  # fmt: skip
    listed = db.list_pending_controls(sid)
    assert [c.id for c in listed] == [
        c.id for c in sorted(made, key=lambda c: (c.created_at, c.id))
    ]


def test_pending_excludes_claimed_and_stamped(db: StateDB, sid: str) -> None:
    a, b, c = (db.insert_control(session_id=sid, verb="pause", payload=None) for _ in range(3))
    assert db.claim_control(a.id, "host:1:exec")
    assert db.finalize_control(b.id, "rejected:no-pending-ops")
    assert [x.id for x in db.list_pending_controls(sid)] == [c.id]
    assert len(db.list_controls(sid)) == 3


def test_claim_twice_second_loses(db: StateDB, sid: str) -> None:
    row = db.insert_control(session_id=sid, verb="resume", payload=None)
    assert db.claim_control(row.id, "h:1:a") is True
    assert db.claim_control(row.id, "h:2:b") is False
    got = db.get_control(row.id)
    assert got is not None and got.result == "applying:h:1:a" and got.is_applying
    assert db.claim_control("f" * 32, "h:1:a") is False


def test_finalize(db: StateDB, sid: str) -> None:
    row = db.insert_control(session_id=sid, verb="pause", payload=None)
    assert db.claim_control(row.id, "h:1:a")
    assert db.finalize_control(row.id, "applied", claimant="h:1:a") is True
    got = db.get_control(row.id)
    assert got is not None and got.result == "applied" and got.applied_at is not None
    assert db.finalize_control(row.id, "rejected:error:late") is False
    assert db.claim_control(row.id, "h:2:b") is False
    again = db.get_control(row.id)
    assert again == got


@pytest.mark.parametrize(
    ("result", "applied_at"),
    [(None, None), ("applied", 3.0), ("rejected:no-pending-ops", 3.0), ("abandoned", 3.0)],
)
def test_resolve_refuses_rows_not_applying(
    db: StateDB, raw: sqlite3.Connection, sid: str, result: str | None, applied_at: float | None
) -> None:
    _raw_control(raw, "e" * 32, 1.0, result=result, applied_at=applied_at)
    before = db.get_control("e" * 32)
    with pytest.raises(ControlNotApplyingError):
        db.resolve_control("e" * 32, outcome="abandoned", by="ops")
    with pytest.raises(ControlNotApplyingError):
        db.resolve_control("e" * 32, outcome="applied")
    assert db.get_control("e" * 32) == before


def test_resolve_unknown_id(db: StateDB) -> None:
    with pytest.raises(UnknownIdError):
        db.resolve_control("9" * 32, outcome="applied")


@pytest.mark.parametrize(
    ("outcome", "by", "stored"),
    [("applied", None, "applied"), ("abandoned", None, "abandoned"),
     ("abandoned", "alice", "abandoned:alice"), ("applied", "alice", "applied")],
)  # fmt: skip
def test_resolve_applying_row(
    db: StateDB, sid: str, outcome: str, by: str | None, stored: str
) -> None:
    row = db.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    assert db.claim_control(row.id, "host:42:executor")
    resolved = db.resolve_control(row.id, outcome=outcome, by=by)  # type: ignore[arg-type]
    assert isinstance(resolved, ControlRow)
    assert resolved.result == stored and resolved.applied_at is not None
    assert db.get_control(row.id) == resolved
    with pytest.raises(ControlNotApplyingError):
        db.resolve_control(row.id, outcome="abandoned")


def test_resolve_matches_applying_by_prefix(db: StateDB, raw: sqlite3.Connection, sid: str) -> None:
    _raw_control(raw, "1" * 32, 1.0, result="applying")
    _raw_control(raw, "2" * 32, 1.0, result="applying:otherhost:7:executor-9")
    assert db.resolve_control("1" * 32, outcome="applied").result == "applied"
    assert db.resolve_control("2" * 32, outcome="abandoned").result == "abandoned"


def test_finalize_never_overwrites_another_consumers_claim(db: StateDB, sid: str) -> None:
    row = db.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    assert db.claim_control(row.id, "host:1:flow-executor")

    assert db.finalize_control(row.id, "applied", claimant="host:2:other") is False
    assert db.finalize_control(row.id, "applied") is False
    stored = db.get_control(row.id)
    assert stored is not None and stored.result == "applying:host:1:flow-executor"

    assert db.finalize_control(row.id, "applied", claimant="host:1:flow-executor") is True
    stored = db.get_control(row.id)
    assert stored is not None and stored.result == "applied"


def test_finalize_without_a_claimant_only_stamps_an_unclaimed_row(db: StateDB, sid: str) -> None:
    # A claimant literally named "None" must not make a claimant-less stamp match its claim.
    row = db.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    assert db.claim_control(row.id, "None")
    assert db.finalize_control(row.id, "applied") is False
    assert db.get_control(row.id).result == "applying:None"  # type: ignore[union-attr]
    assert db.finalize_control(row.id, "applied", claimant="None") is True
