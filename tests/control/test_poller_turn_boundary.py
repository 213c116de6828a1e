"""The poller at an agent's turn boundary (issue 19): ``catch_up`` and ``messages_rejected``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerflow.control import ControlPoller, SteeringTarget
from steerflow.state import StateDB


class DeferringTarget(SteeringTarget):
    """Takes messages and defers their stamp, as an agent does."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def pause(self) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def has_pending_operation(self) -> bool:
        return True

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        self.messages.append({"text": text, "control_id": control_id})

    def defers_message_stamp(self) -> bool:
        return True


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def writer(home: Path) -> Iterator[StateDB]:
    db = StateDB.open(home)
    try:
        yield db
    finally:
        db.close()


async def test_catch_up_lists_a_row_committed_just_before(home: Path, writer: StateDB) -> None:
    sid = writer.create_session(kind="agent").id
    target = DeferringTarget()
    # Neither the watcher (30 s) nor the forced listing (1 h) would see the row in time:
    # only catch_up explains a prompt claim.
    poller = ControlPoller(home, sid, target, interval=30.0, forced_list=3600.0)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(poller.run())
        async with asyncio.timeout(10):
            await poller.catch_up()  # the first tick has run: the poller is settled
            row = await asyncio.to_thread(
                writer.insert_control, session_id=sid, verb="message", payload={"text": "hi"}
            )
            await poller.catch_up()
        assert [m["control_id"] for m in target.messages] == [row.id]
        current = writer.get_control(row.id)
        assert current is not None and (current.result or "").startswith("applying:")
        await poller.stop()
    # Stopped: catch_up returns at once instead of waiting for a tick that never comes.
    async with asyncio.timeout(1):
        await poller.catch_up()


async def test_catch_up_lists_even_when_no_other_connection_committed(
    home: Path, writer: StateDB
) -> None:
    sid = writer.create_session(kind="agent").id
    target = DeferringTarget()
    # The poller shares the writer's connection, whose own commits never move its
    # data_version: without catch_up's forced listing the row would wait for the hour.
    poller = ControlPoller(home, sid, target, interval=30.0, forced_list=3600.0, db=writer)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(poller.run())
        async with asyncio.timeout(10):
            await poller.catch_up()
            listings = poller.listings
            await poller.catch_up()  # nothing changed at all: it lists anyway
            assert poller.listings == listings + 1
            row = await asyncio.to_thread(
                writer.insert_control, session_id=sid, verb="message", payload={"text": "hi"}
            )
            await poller.catch_up()
        assert [m["control_id"] for m in target.messages] == [row.id]
        await poller.stop()


async def test_catch_up_returns_at_once_after_a_cancelled_run(home: Path, writer: StateDB) -> None:
    sid = writer.create_session(kind="agent").id
    poller = ControlPoller(home, sid, DeferringTarget(), interval=30.0, forced_list=3600.0)
    task = asyncio.ensure_future(poller.run())
    async with asyncio.timeout(10):
        await poller.catch_up()
    task.cancel()  # ended without stop(): only its state says the poller is gone
    with pytest.raises(asyncio.CancelledError):
        await task
    assert poller.state == "stopped"
    async with asyncio.timeout(5):  # no tick will ever serve a waiter now
        await poller.catch_up()


async def test_messages_rejected_stamps_the_given_result(home: Path, writer: StateDB) -> None:
    sid = writer.create_session(kind="agent").id
    taken = writer.insert_control(session_id=sid, verb="message", payload={"text": "one"})
    left = writer.insert_control(session_id=sid, verb="message", payload={"text": "two"})
    target = DeferringTarget()
    poller = ControlPoller(home, sid, target, interval=0.01)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(poller.run())
        async with asyncio.timeout(10):
            await poller.catch_up()
        assert len(target.messages) == 2
        poller.messages_rejected([taken.id, None, "f" * 32], "rejected:max-turns")
        await poller.stop()
    results = {c.id: c.result for c in writer.list_controls(sid)}
    assert results[taken.id] == "rejected:max-turns"
    # A message nobody rejected or delivered is still closed when the run ends.
    assert results[left.id] == "rejected:no-pending-ops"


class ClaimAtBoundaryTarget(DeferringTarget):
    """Leaves message rows pending until a turn boundary opens the claim (issue 26)."""

    def __init__(self) -> None:
        super().__init__()
        self.claiming = False

    def defers_message_claim(self) -> bool:
        return not self.claiming


def _result(db: StateDB, control_id: str) -> str | None:
    row = db.get_control(control_id)
    assert row is not None
    return row.result


async def test_a_deferred_claim_leaves_messages_pending_until_the_boundary(
    home: Path, writer: StateDB
) -> None:
    sid = writer.create_session(kind="agent").id
    target = ClaimAtBoundaryTarget()
    poller = ControlPoller(home, sid, target, interval=30.0, forced_list=3600.0)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(poller.run())
        async with asyncio.timeout(10):
            first = await asyncio.to_thread(
                writer.insert_control, session_id=sid, verb="message", payload={"text": "a"}
            )
            stop = await asyncio.to_thread(
                writer.insert_control, session_id=sid, verb="pause", payload=None
            )
            await poller.catch_up()
            # Listed (the later row was applied, refused by this target) yet not claimed.
            assert (_result(writer, stop.id) or "").startswith("rejected:error:")
            assert _result(writer, first.id) is None and target.messages == []
            target.claiming = True
            await poller.catch_up()
            assert [m["control_id"] for m in target.messages] == [first.id]
            assert (_result(writer, first.id) or "").startswith("applying:")
            target.claiming = False
            later = await asyncio.to_thread(
                writer.insert_control, session_id=sid, verb="message", payload={"text": "b"}
            )
            await poller.catch_up()
            assert _result(writer, later.id) is None
            poller.messages_delivered([first.id])
            await poller.catch_up()
            assert _result(writer, first.id) == "applied"
        await poller.stop()
    # The run's last pass claims a message still deferred, and no operation will take it.
    assert _result(writer, later.id) == "rejected:no-pending-ops"


def test_a_target_claims_at_once_unless_it_says_otherwise() -> None:
    assert DeferringTarget().defers_message_claim() is False
