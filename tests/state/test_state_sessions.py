"""Sessions, invocations, plays, node metadata and node status."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from state_support import insert_session

from steerflow.errors import UnknownIdError, UsageError
from steerflow.state import NodeUpdate, Owner, StateDB


def test_create_and_get_session(db: StateDB) -> None:
    row = db.create_session(kind="flow", prompt="do it", run_id="20250101T000000-abcdef",
                            node_metadata={"resumed_from": None, "x": 1})  # fmt: skip
    assert len(row.id) == 32 and row.id == row.id.lower()
    assert (row.status, row.phase, row.kind) == ("running", "planning", "flow")
    assert row.node_metadata == {"resumed_from": None, "x": 1, "run_id": row.run_id}
    assert row.heartbeat_at == row.created_at == row.updated_at
    assert row.owner == Owner.current()
    assert db.get_session(row.id) == row
    assert db.get_session("0" * 32) is None


def test_create_session_validates(db: StateDB) -> None:
    with pytest.raises(UsageError):
        db.create_session(kind="job")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        db.create_session(kind="flow", phase="done")  # type: ignore[arg-type]


def test_list_sessions_newest_first(db: StateDB, raw: sqlite3.Connection) -> None:
    for sid, at in (("1" * 32, 1.0), ("3" * 32, 2.0), ("2" * 32, 2.0), ("4" * 32, 0.5)):
        insert_session(raw, sid, created_at=at)
    assert [s.id for s in db.list_sessions()] == ["3" * 32, "2" * 32, "1" * 32, "4" * 32]
    assert [s.id for s in db.list_sessions(limit=2)] == ["3" * 32, "2" * 32]
    assert len(db.list_sessions(limit=None)) == 4
    for _ in range(25):
        db.create_session(kind="agent")
    assert len(db.list_sessions()) == 20
    assert len(db.list_sessions(limit=None)) == 29


def test_status_phase_heartbeat_run_id(db: StateDB) -> None:
    sid = db.create_session(kind="flow").id
    assert db.set_session_status(sid, "completed", expected="failed") is False
    assert db.set_session_status(sid, "completed", expected="running") is True
    assert db.set_session_status(sid, "failed") is True
    assert db.set_session_status("0" * 32, "failed") is False
    db.set_session_phase(sid, "paused")
    before = db.get_session(sid)
    assert before is not None
    db.heartbeat(sid)
    db.set_run_id(sid, "20250102T030405-0a0b0c")
    row = db.get_session(sid)
    assert row is not None
    assert (row.status, row.phase, row.run_id) == ("failed", "paused", "20250102T030405-0a0b0c")
    assert row.node_metadata["run_id"] == row.run_id
    assert row.heartbeat_at is not None and before.heartbeat_at is not None
    assert row.heartbeat_at >= before.heartbeat_at
    with pytest.raises(UnknownIdError):
        db.set_session_phase("0" * 32, "executing")
    with pytest.raises(UnknownIdError):
        db.heartbeat("0" * 32)


def test_update_node_metadata_merges(db: StateDB) -> None:
    sid = db.create_session(kind="flow", node_metadata={"a": 1, "b": {"x": 1}, "c": 3}).id
    new = db.update_node_metadata(sid, {"b": {"y": 2}, "c": None, "d": [1, 2]})
    assert new == {"a": 1, "b": {"y": 2}, "d": [1, 2]}
    row = db.get_session(sid)
    assert row is not None and row.node_metadata == new
    with pytest.raises(UnknownIdError):
        db.update_node_metadata("0" * 32, {"a": 1})


def test_update_node_metadata_is_atomic_across_connections(home: Path, db: StateDB) -> None:
    sid = db.create_session(kind="flow").id

    def writer(tag: str) -> None:
        with StateDB.open(home) as mine:
            for i in range(25):
                mine.update_node_metadata(sid, {f"{tag}{i}": i})

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    row = db.get_session(sid)
    assert row is not None and len(row.node_metadata) == 100


def test_artifact_contract(db: StateDB) -> None:
    sid = db.create_session(kind="flow").id
    row = db.get_session(sid)
    assert row is not None and row.artifact_contract_json is None and row.artifact_contract is None
    db.set_artifact_contract(sid, {"draft": ["patch.diff"]})
    row = db.get_session(sid)
    assert row is not None and row.artifact_contract == {"draft": ["patch.diff"]}
    db.set_artifact_contract(sid, None)
    row = db.get_session(sid)
    assert row is not None and row.artifact_contract_json is None


def test_invocations_and_plays(db: StateDB) -> None:
    sid = db.create_session(kind="play").id
    inv = db.create_invocation(session_id=sid, kind="play")
    assert (inv.session_id, inv.kind, inv.status) == (sid, "play", "running")
    db.set_invocation_status(inv.id, "completed")
    with pytest.raises(UnknownIdError):
        db.set_invocation_status("0" * 32, "completed")
    play = db.create_play(session_id=sid, invocation_id=inv.id, playbook="demo")
    assert (play.session_id, play.invocation_id, play.playbook) == (sid, inv.id, "demo")
    assert len(play.id) == 32


def test_upsert_and_list_nodes(db: StateDB) -> None:
    sid = db.create_session(kind="flow").id
    db.upsert_nodes(sid, [
        NodeUpdate("research", "planned", "running", node_id="n-1", assignee="researcher"),
        NodeUpdate("draft", "planned", "pending", assignee="coder"),
    ])  # fmt: skip
    db.upsert_nodes(sid, [
        NodeUpdate("research", "planned", "completed", detail={"usage": {"tokens": 3}}),
        NodeUpdate("fix-1", "spawned", "failed", node_id="n-9", detail={"error": "boom"}),
    ])  # fmt: skip
    nodes = {n.node_key: n for n in db.list_nodes(sid)}
    assert [n.node_key for n in db.list_nodes(sid)] == ["draft", "fix-1", "research"]
    research = nodes["research"]
    assert (research.status, research.node_id, research.assignee) == (
        "completed", "n-1", "researcher")  # fmt: skip
    assert research.detail == {"usage": {"tokens": 3}}
    assert nodes["fix-1"].kind == "spawned" and nodes["fix-1"].detail == {"error": "boom"}
    assert nodes["draft"].detail is None
    assert db.list_nodes("0" * 32) == []


def test_list_nodes_by_key_by_kind_and_without_detail(db: StateDB) -> None:
    sid = db.create_session(kind="flow").id
    other = db.create_session(kind="flow").id
    updates = [
        NodeUpdate(f"n{i:04d}", "planned", "completed", detail={"i": i}) for i in range(1_200)
    ]
    updates.append(NodeUpdate("fix-1", "spawned", "running", detail={"parent": "n0007"}))
    db.upsert_nodes(sid, updates)
    db.upsert_nodes(other, [NodeUpdate("n0001", "planned", "failed", detail={"other": True})])
    # More keys than one IN (...) binds; unknown keys and the other session's rows stay out.
    keys = [f"n{i:04d}" for i in range(0, 1_200, 2)] + ["nope"]
    rows = db.list_nodes(sid, keys=keys)
    assert [r.node_key for r in rows] == sorted(keys[:-1])
    assert rows[1].detail == {"i": 2} and rows[1].session_id == sid
    (spawned,) = db.list_nodes(sid, kind="spawned")
    assert (spawned.node_key, spawned.detail) == ("fix-1", {"parent": "n0007"})
    assert db.list_nodes(sid, kind="spawned", keys=["n0001"]) == []
    light = db.list_nodes(sid, detail=False)
    assert len(light) == 1_201 and all(r.detail is None for r in light)
    assert (light[0].node_key, light[0].status, light[-1].status) == (
        "fix-1",
        "running",
        "completed",
    )


def test_session_for_run_finds_the_owner_of_a_run_directory(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "home") as db:
        db.create_session(kind="flow", run_id="20260101T000000-aaaaaa")
        owner = db.create_session(kind="play", run_id="20260101T000001-bbbbbb")
        found = db.session_for_run("20260101T000001-bbbbbb")
        assert found is not None and found.id == owner.id
        assert db.session_for_run("20260101T000002-cccccc") is None
