"""The poller on PostgreSQL is woken by ``LISTEN``/``NOTIFY``, not by polling (issue 15).

The poll interval here is far longer than the waits, and the forced listing longer still,
so only a notification can explain a prompt application; and while idle the poller
makes no reads at all (no ``data_version`` watcher thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pg_support import PgServer
from steerflow.control import ControlPoller, SteeringTarget
from steerflow.state import STATE_DB_URL_ENV, StateDB
from waiting import holds_for_async, wait_until, wait_until_async

SLOW_S = 30.0  # the interval and forced listing: far beyond every wait below


class _Target(SteeringTarget):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def has_pending_operation(self) -> bool:
        return True

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        self.calls.append(f"message:{text}")


class _Counted(StateDB):
    reads = 0

    def data_version(self) -> int:
        self.reads += 1
        return super().data_version()


@pytest.fixture
def home(tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(STATE_DB_URL_ENV, pg.new_database())
    return tmp_path / "home"


@pytest.fixture
def writer(home: Path) -> Iterator[StateDB]:
    with StateDB.open(home) as db:
        yield db


async def test_a_notification_wakes_an_idle_poller_that_never_polls(
    home: Path, writer: StateDB
) -> None:
    sid = writer.create_session(kind="flow").id
    opened = StateDB.open(home)
    db = _Counted(opened.backend)
    target = _Target()
    poller = ControlPoller(home, sid, target, interval=SLOW_S, db=db, forced_list=SLOW_S)
    task = asyncio.ensure_future(poller.run())
    try:
        await wait_until_async(lambda: poller.listings >= 1, timeout=10, what="a first listing")
        assert not [t for t in threading.enumerate() if t.name == "steerflow-control-watch"]
        reads, ticks = db.reads, poller.ticks

        def idle() -> None:  # nothing wakes the loop, nothing reads
            assert (db.reads, poller.ticks) == (reads, ticks)

        await holds_for_async(idle, seconds=0.5)

        await asyncio.to_thread(writer.insert_control, session_id=sid, verb="pause", payload=None)
        await asyncio.to_thread(
            writer.insert_control, session_id=sid, verb="message", payload={"text": "hi"}
        )
        await wait_until_async(lambda: target.calls == ["pause", "message:hi"], timeout=10,
                               what="both rows applied, long before any poll")  # fmt: skip
        # The target is called between the claim ("applying:...") and the stamp: wait for
        # the stamps, which the poller writes right after, not for the next poll.
        await asyncio.to_thread(
            wait_until,
            lambda: [r.result for r in writer.list_controls(sid)] == ["applied", "applied"],
            timeout=10,
            what="both rows stamped applied, long before any poll",
        )
    finally:
        await poller.stop()
        await asyncio.wait_for(task, 10)
        db.close()


async def test_a_database_that_admits_no_new_connection_still_wakes_the_poller(
    tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before decision 360 the LISTEN was a second connection, refused here, and the
    # poller fell back to polling. Now it rides the process's one connection, which a
    # database that stops admitting connections keeps: the poller is still notified.
    name = f"nolisten_{uuid.uuid4().hex[:12]}"
    pg.psql(f'CREATE DATABASE "{name}" TEMPLATE template0')
    monkeypatch.setenv(STATE_DB_URL_ENV, pg.url(name))
    home = tmp_path / "home"
    writer, db = StateDB.open(home), StateDB.open(home)
    try:
        sid = writer.create_session(kind="flow").id
        pg.psql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        target = _Target()
        poller = ControlPoller(home, sid, target, interval=SLOW_S, db=db, forced_list=SLOW_S)
        with caplog.at_level(logging.WARNING):
            task = asyncio.ensure_future(poller.run())
            try:
                await wait_until_async(lambda: poller.listings >= 1, timeout=10, what="a listing")
                watchers = [t for t in threading.enumerate() if t.name == "steerflow-control-watch"]
                assert watchers == []  # notified, not polling
                await asyncio.to_thread(
                    writer.insert_control, session_id=sid, verb="pause", payload=None
                )
                await wait_until_async(lambda: target.calls == ["pause"], timeout=10,
                                       what="the row applied on its notification")  # fmt: skip
            finally:
                await poller.stop()
                await asyncio.wait_for(task, 10)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings == []
    finally:
        db.close()
        writer.close()
        pg.psql(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_with_notifications_the_safety_net_listing_is_rare(
    home: Path, writer: StateDB
) -> None:
    """Decision 124: 2 s while polling, 20 s once LISTEN is in effect (fleet cost)."""
    sid = writer.create_session(kind="flow").id
    opened = StateDB.open(home)
    db = _Counted(opened.backend)
    poller = ControlPoller(home, sid, _Target(), interval=0.05, db=db)
    assert poller.forced_list == 2.0  # nothing listens yet
    task = asyncio.ensure_future(poller.run())
    try:
        await wait_until_async(lambda: poller.listings >= 1, timeout=10, what="a first listing")
        assert poller.forced_list == 20.0
        reads = db.reads
        # Idle for 3 s: with the old 2 s net the poller would have listed again.
        await holds_for_async(lambda: _assert_equal(db.reads, reads), seconds=3.0)
        assert poller.listings == 1
    finally:
        await poller.stop()
        await asyncio.wait_for(task, timeout=30)
        opened.close()


def _assert_equal(got: int, want: int) -> None:
    assert got == want, (got, want)
