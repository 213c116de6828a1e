"""The ``ctl`` writers at library level, on a real SQLite state DB (ADR-0069 D1)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from steerflow.control import MAX_MESSAGE_BYTES, enqueue_control, resolve_control
from steerflow.errors import ControlNotApplyingError, NotRunningError, UsageError
from steerflow.state import ResolvedTarget, StateDB


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def sid(home: Path) -> str:
    with StateDB.open(home) as db:
        return db.create_session(kind="flow").id


def test_rows_are_stored_in_commit_order_even_with_a_stuck_clock(
    home: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.time", lambda: 1000.0)  # a clock that never advances
    made = [enqueue_control(home, sid, "message", f"m{i}") for i in range(20)]
    with StateDB.open(home) as db:
        rows = db.list_controls(sid)
    assert [r.id for r in rows] == [q.control_id for q in made]
    stamps = [r.created_at for r in rows]
    assert all(a < b for a, b in itertools.pairwise(stamps))
    assert [r.payload for r in rows] == [{"text": f"m{i}"} for i in range(20)]
    assert all(r.is_pending for r in rows)


def test_session_finishing_after_resolution_is_refused_without_a_row(
    home: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = StateDB.resolve_target

    def resolve_then_finish(self: StateDB, target: str) -> ResolvedTarget:
        resolved = original(self, target)
        with StateDB.open(home) as other:  # the flow ends right after we looked
            other.set_session_status(sid, "completed")
        return resolved

    monkeypatch.setattr(StateDB, "resolve_target", resolve_then_finish)
    with pytest.raises(NotRunningError, match="completed, not running"):
        enqueue_control(home, sid, "pause")
    with StateDB.open(home) as db:
        assert db.count_controls() == 0


def test_payloads_and_usage(home: Path, sid: str) -> None:
    paused = enqueue_control(home, sid[:6], "pause")
    said = enqueue_control(home, sid, "message", "line one\n  line two")
    with StateDB.open(home) as db:
        assert db.get_control(paused.control_id).payload is None  # type: ignore[union-attr]
        assert db.get_control(said.control_id).payload == {  # type: ignore[union-attr]
            "text": "line one\n  line two"
        }
    for blank in (None, "", " \n\t "):  # a blank message is refused, not queued
        with pytest.raises(UsageError, match="non-empty"):
            enqueue_control(home, sid, "message", blank)
    with pytest.raises(UsageError, match="65536 bytes"):
        enqueue_control(home, sid, "message", "x" * (MAX_MESSAGE_BYTES + 1))
    bad: Any = "stop"
    with pytest.raises(UsageError):
        enqueue_control(home, sid, bad)
    with StateDB.open(home) as db:
        assert db.count_controls() == 2


def test_resolve_only_applying_rows(home: Path, sid: str) -> None:
    queued = enqueue_control(home, sid, "message", "x")
    with pytest.raises(ControlNotApplyingError):
        resolve_control(home, queued.control_id, "abandoned", "me")
    with StateDB.open(home) as db:
        assert db.claim_control(queued.control_id, "h:1:flow-executor:s")
    row = resolve_control(home, queued.control_id, "abandoned", "me")
    assert row.result == "abandoned:me" and row.applied_at is not None
    with pytest.raises(ControlNotApplyingError):
        resolve_control(home, queued.control_id, "applied", None)
