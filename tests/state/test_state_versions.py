"""``data_version`` as a change check, and thread-safe use from ``asyncio.to_thread``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from steerflow.state import StateDB


def test_data_version_changes_only_for_other_connections(home: Path) -> None:
    with StateDB.open(home) as poller, StateDB.open(home) as writer:
        sid = writer.create_session(kind="flow").id
        seen = poller.data_version()
        poller.list_pending_controls(sid)
        poller.get_session(sid)
        assert poller.data_version() == seen
        poller.heartbeat(sid)  # its own commit does not count
        assert poller.data_version() == seen
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        after = poller.data_version()
        assert after != seen
        assert poller.data_version() == after
        assert [c.verb for c in poller.list_pending_controls(sid)] == ["pause"]


async def test_concurrent_calls_through_to_thread(db: StateDB) -> None:
    sid = db.create_session(kind="flow").id

    async def one(i: int) -> None:
        row = await asyncio.to_thread(
            db.insert_control, session_id=sid, verb="message", payload={"text": str(i)}
        )
        assert await asyncio.to_thread(db.claim_control, row.id, f"h:1:{i}")
        await asyncio.to_thread(db.update_node_metadata, sid, {f"k{i}": i})

    await asyncio.gather(*(one(i) for i in range(40)))
    assert db.count_controls() == 40
    assert db.list_pending_controls(sid) == []
    row = db.get_session(sid)
    assert row is not None and len(row.node_metadata) == 40
