"""``StateDB.redeliver_control``: a stranded message re-queued in one transaction (issue 26).

Run on both backends (``state_backend``): SQLite in the home, and a real PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from steerflow.state import StateDB


@pytest.fixture
def db(tmp_path: Path, state_backend: str) -> Iterator[StateDB]:
    opened = StateDB.open(tmp_path / "home")
    try:
        yield opened
    finally:
        opened.close()


def _sessions(db: StateDB) -> tuple[str, str]:
    return db.create_session(kind="agent").id, db.create_session(kind="agent").id


def test_a_pending_message_moves_to_the_new_session(db: StateDB) -> None:
    old_sid, new_sid = _sessions(db)
    earlier = db.insert_control(session_id=new_sid, verb="message", payload={"text": "first"})
    old = db.insert_control(session_id=old_sid, verb="message", payload={"text": "hello"})
    row = db.redeliver_control(old.id, seen=None, to_session=new_sid)
    assert row is not None and row.session_id == new_sid and row.id != old.id
    assert row.payload == {"text": "hello", "redelivered_from": old.id}
    assert row.result is None and row.applied_at is None
    assert row.created_at > earlier.created_at  # ordered after the session's newest row
    stamped = db.get_control(old.id)
    assert stamped is not None and stamped.applied_at is not None
    assert stamped.result == f"abandoned:redelivered:{row.id}"
    assert [c.id for c in db.list_pending_controls(new_sid)] == [earlier.id, row.id]
    # Done once: the old row no longer reads as seen.
    assert db.redeliver_control(old.id, seen=None, to_session=new_sid) is None


def test_a_claimed_message_moves_only_as_it_was_seen(db: StateDB) -> None:
    old_sid, new_sid = _sessions(db)
    old = db.insert_control(session_id=old_sid, verb="message", payload={"text": "x"})
    assert db.claim_control(old.id, "host:1:agent-executor:abc")
    # Seen pending, or under another claim: nothing written.
    assert db.redeliver_control(old.id, seen=None, to_session=new_sid) is None
    other = "applying:host:2:agent-executor:abc"
    assert db.redeliver_control(old.id, seen=other, to_session=new_sid) is None
    assert db.list_controls(new_sid) == []
    row = db.redeliver_control(
        old.id, seen="applying:host:1:agent-executor:abc", to_session=new_sid
    )
    assert row is not None
    stamped = db.get_control(old.id)
    assert stamped is not None and stamped.result == f"abandoned:redelivered:{row.id}"


def test_terminal_rows_other_verbs_and_unknown_ids_are_left_alone(db: StateDB) -> None:
    old_sid, new_sid = _sessions(db)
    done = db.insert_control(session_id=old_sid, verb="message", payload={"text": "x"})
    assert db.finalize_control(done.id, "applied")
    stop = db.insert_control(session_id=old_sid, verb="stop", payload=None)
    assert db.redeliver_control(done.id, seen=None, to_session=new_sid) is None
    assert db.redeliver_control(done.id, seen="applied", to_session=new_sid) is None
    assert db.redeliver_control(stop.id, seen=None, to_session=new_sid) is None
    assert db.redeliver_control("0" * 32, seen=None, to_session=new_sid) is None
    assert db.list_controls(new_sid) == []
    current = db.get_control(stop.id)
    assert current is not None and current.result is None
