"""``steerflow db copy --to URL``: a home's SQLite state DB into PostgreSQL (and back).

Idempotent (a second copy changes nothing, a changed source row is brought up to date),
and a target holding another home's sessions is refused unless ``--merge``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from pg_support import PgServer
from steerflow.cli import main
from steerflow.errors import ExitCode
from steerflow.state import STATE_DB_URL_ENV, NodeUpdate, ResumeClaim, StateDB


def _seed(db: StateDB) -> str:
    """A session with one of everything; returns its id."""
    source = db.create_session(kind="flow", run_id="20260101T000000-aaaaaa", prompt="p")
    db.set_session_status(source.id, "interrupted")
    sid = db.create_session(
        kind="flow",
        run_id="20260101T000001-bbbbbb",
        resume=ResumeClaim(source.run_id or "", fork=False, has_checkpoint=lambda _: False),
    ).id
    inv = db.create_invocation(session_id=sid, kind="flow")
    db.create_play(session_id=sid, invocation_id=inv.id, playbook="demo")
    # One row with a sender (schema migration 7), one as an older release left it.
    db.insert_control(
        session_id=sid, verb="message", payload={"text": "héllo"}, sender="cli:alice@h:1"
    )
    db.insert_control(session_id=sid, verb="pause", payload=None)
    db.upsert_nodes(sid, [NodeUpdate("a", "planned", "running", node_id="n1", detail={"k": 1})])
    db.update_node_metadata(sid, {"poller": "active"})
    return sid


def _snapshot(db: StateDB) -> dict[str, object]:
    sessions = db.list_sessions(limit=None)
    return {
        "sessions": sessions,
        "controls": [db.list_controls(s.id) for s in sessions],
        "nodes": [db.list_nodes(s.id) for s in sessions],
        "resumed": db.resumed_by([s.run_id or "" for s in sessions]),
    }


def _copy(
    home: Path, url: str, *flags: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Run ``db copy --json`` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["--home", str(home), "db", "copy", "--to", url, "--json", *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_copy_into_postgresql_is_complete_and_idempotent(
    tmp_path: Path,
    pg: PgServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home, url = tmp_path / "home", pg.new_database()
    with StateDB.open(home) as db:
        sid = _seed(db)
        expected = _snapshot(db)
    code, out, _ = _copy(home, url, capsys=capsys)
    assert code == 0, out
    report = json.loads(out)
    assert report["rows"] == {
        "sessions": 2,
        "invocations": 1,
        "plays": 1,
        "session_controls": 2,
        "session_nodes": 1,
        "resume_claims": 1,
    }
    assert report["target"] == url
    with StateDB.open_url(url, create=False) as target:
        assert _snapshot(target) == expected
        senders = [c.sender for c in target.list_controls(sid)]
        assert senders == ["cli:alice@h:1", None]
    # Again: nothing changes. Then a changed source row is brought up to date.
    assert _copy(home, url, capsys=capsys)[0] == 0
    with StateDB.open(home) as db:
        db.set_session_status(sid, "completed")
        expected = _snapshot(db)
    assert _copy(home, url, capsys=capsys)[0] == 0
    with StateDB.open_url(url, create=False) as target:
        assert _snapshot(target) == expected
        assert target.count_controls() == 2


def test_a_target_with_another_homes_sessions_needs_merge(
    tmp_path: Path,
    pg: PgServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home, url = tmp_path / "home", pg.new_database()
    with StateDB.open_url(url) as target:
        theirs = target.create_session(kind="play").id
    with StateDB.open(home) as db:
        ours = _seed(db)
    code, _, err = _copy(home, url, capsys=capsys)
    assert code == ExitCode.REFUSED
    assert f"holds 1 session(s) this home does not ({theirs})" in err and "--merge" in err
    with StateDB.open_url(url, create=False) as target:
        assert [s.id for s in target.list_sessions(limit=None)] == [theirs]  # nothing written
    code, out, _ = _copy(home, url, "--merge", capsys=capsys)
    assert code == 0, out
    assert json.loads(out)["foreign_sessions"] == 1
    with StateDB.open_url(url, create=False) as target:
        ids = {s.id for s in target.list_sessions(limit=None)}
    assert theirs in ids and ours in ids and len(ids) == 3


def test_postgresql_back_into_sqlite_and_the_same_database_is_refused(
    tmp_path: Path,
    pg: PgServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, url)  # the home's database is PostgreSQL
    home = tmp_path / "home"
    with StateDB.open(home) as db:
        _seed(db)
        expected = _snapshot(db)
    back = f"sqlite:///{tmp_path / 'back' / 'state.db'}"
    assert _copy(home, back, capsys=capsys)[0] == 0
    with StateDB.open_url(back, create=False) as target:
        assert _snapshot(target) == expected
    code, _, err = _copy(home, url, capsys=capsys)
    assert code == ExitCode.REFUSED
    assert "the source and the target are the same" in err


def test_a_source_column_name_that_is_not_an_identifier_is_refused(
    tmp_path: Path,
    pg: PgServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Column names become SQL text in the target: a hand-edited source cannot inject."""
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home, url = tmp_path / "home", pg.new_database()
    with StateDB.open(home) as db:
        _seed(db)
    hostile = "x) VALUES (1); DROP TABLE sessions; --"
    with sqlite3.connect(home / "state.db") as raw:
        raw.execute(f'ALTER TABLE plays ADD COLUMN "{hostile}" TEXT')
    with StateDB.open_url(url) as target:
        theirs = target.create_session(kind="play").id
    code, _, err = _copy(home, url, "--merge", capsys=capsys)
    assert code == ExitCode.REFUSED
    assert f"table plays has a column named {hostile!r}" in err
    with StateDB.open_url(url, create=False) as target:  # nothing written, nothing dropped
        assert [s.id for s in target.list_sessions(limit=None)] == [theirs]
