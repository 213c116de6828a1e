"""When the control poller ticks: watcher wake-ups, prompt retries, an idle loop (issue 20).

Real SQLite file, real watcher thread. ``forced_list`` is raised to an hour, so within
a test the only things that can make the poller tick again are the ones under test:
a wake-up by the watcher thread (another connection committed) or a retry that is due
one interval after a failure. Every wait is bounded (tests/waiting.py); nothing asserts
wall-clock time: "the row was applied" under a one-hour fallback is the observation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerflow.control import ControlPoller, SteeringTarget
from steerflow.control import _poller as poller_module
from steerflow.errors import DatabaseBusyError
from steerflow.state import ControlRow, Phase, StateDB
from waiting import wait_until, wait_until_async

WATCH = "steerflow-control-watch"  # the watcher thread's name, as a stack dump shows it
NEVER = 3600.0  # forced_list: the fallback listing never comes within a test
LOGGER = "steerflow.control._poller"


class Target(SteeringTarget):
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


class WatchedDB(StateDB):
    """Counts the watcher thread's reads; fails or holds chosen calls (set per test)."""

    watch_reads = 0
    watch_failures = 0  # the watcher's next reads that fail
    version_failures = 0  # the loop's (not the watcher's) next data_version reads that fail
    hold: threading.Event | None = None  # the watcher's next read waits for this event
    held: threading.Event | None = None  # set once a read is being held
    list_failures = 0
    finalize_failures = 0
    claim_errors: tuple[Exception, ...] = ()  # raised by the next claims, in order
    claim_lands_then_fails = 0  # claims that land, then report a failure
    get_control_failures = 0
    phase_failures = 0
    phase_writes = 0
    meta_failures = 0
    meta_writes = 0

    def data_version(self) -> int:
        if threading.current_thread().name == WATCH:
            self.watch_reads += 1
            hold, self.hold = self.hold, None
            if hold is not None:
                assert self.held is not None
                self.held.set()
                hold.wait(30)
                return super().data_version() + 1  # looks like a change: the watcher wakes
            if self.watch_failures > 0:
                self.watch_failures -= 1
                raise DatabaseBusyError("database busy: injected (watch)")
        elif self.version_failures > 0:
            self.version_failures -= 1
            raise DatabaseBusyError("database busy: injected (version)")
        return super().data_version()

    def list_pending_controls(self, session_id: str) -> list[ControlRow]:
        if self.list_failures > 0:
            self.list_failures -= 1
            raise DatabaseBusyError("database busy: injected (list)")
        return super().list_pending_controls(session_id)

    def finalize_control(
        self, control_id: str, result: str, *, claimant: str | None = None
    ) -> bool:
        if self.finalize_failures > 0:
            self.finalize_failures -= 1
            raise DatabaseBusyError("database busy: injected (finalize)")
        return super().finalize_control(control_id, result, claimant=claimant)

    def claim_control(self, control_id: str, claimant: str) -> bool:
        if self.claim_errors:
            error, *rest = self.claim_errors
            self.claim_errors = tuple(rest)
            raise error
        claimed = super().claim_control(control_id, claimant)
        if self.claim_lands_then_fails > 0:
            self.claim_lands_then_fails -= 1
            raise DatabaseBusyError("database busy: injected (claim answer lost)")
        return claimed

    def get_control(self, control_id: str) -> ControlRow | None:
        if self.get_control_failures > 0:
            self.get_control_failures -= 1
            raise DatabaseBusyError("database busy: injected (get)")
        return super().get_control(control_id)

    def set_session_phase(self, session_id: str, phase: Phase) -> None:
        if self.phase_failures > 0:
            self.phase_failures -= 1
            raise DatabaseBusyError("database busy: injected (phase)")
        super().set_session_phase(session_id, phase)
        self.phase_writes += 1

    def update_node_metadata(self, session_id: str, patch: Any) -> dict[str, Any]:
        if self.meta_failures > 0:
            self.meta_failures -= 1
            raise DatabaseBusyError("database busy: injected (meta)")
        self.meta_writes += 1
        return super().update_node_metadata(session_id, patch)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def writer(home: Path) -> Iterator[StateDB]:
    """The "other process" (a ``ctl`` connection): creates the session and queues rows."""
    with StateDB.open(home) as db:
        yield db


@pytest.fixture
def sid(writer: StateDB) -> str:
    return writer.create_session(kind="flow", node_metadata={"poller": "pending"}).id


@pytest.fixture
def db(home: Path, writer: StateDB) -> Iterator[WatchedDB]:
    """The poller's own connection."""
    opened = StateDB.open(home)
    watched = WatchedDB(opened.backend, path=opened.path)
    try:
        yield watched
    finally:
        watched.close()


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCH]


async def _idle(poller: ControlPoller, db: WatchedDB) -> None:
    """Wait until the loop ran and the watcher read a few times without a change since."""
    await wait_until_async(lambda: poller.ticks >= 1, timeout=10, what="a first tick")
    reads = db.watch_reads
    await wait_until_async(lambda: db.watch_reads >= reads + 3, timeout=10, what="watcher reads")


async def _stop(poller: ControlPoller, task: asyncio.Future[None]) -> None:
    await poller.stop()
    await asyncio.wait_for(task, 10)


def _start(home: Path, sid: str, target: SteeringTarget, db: StateDB) -> tuple[
    ControlPoller, asyncio.Future[None]
]:  # fmt: skip
    poller = ControlPoller(home, sid, target, interval=0.01, db=db, forced_list=NEVER)
    return poller, asyncio.ensure_future(poller.run())


# -- the watcher wakes the loop ----------------------------------------------------------------


async def test_a_commit_by_another_connection_wakes_the_idle_poller(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        (watcher,) = _watchers()  # one watcher for the whole run, and a daemon
        assert watcher.daemon
        row = writer.insert_control(session_id=sid, verb="pause", payload=None)
        await wait_until_async(lambda: target.calls == ["pause"], timeout=10, what="the pause")
        await wait_until_async(
            lambda: writer.get_control(row.id).result == "applied",  # type: ignore[union-attr]
            timeout=10,
            what="the stamp",
        )
        writer.insert_control(session_id=sid, verb="resume", payload=None)
        await wait_until_async(lambda: len(target.calls) == 2, timeout=10, what="the resume")
        assert _watchers() == [watcher]
    finally:
        await _stop(poller, task)
    wait_until(lambda: not _watchers(), timeout=10, what="the watcher thread to end")


async def test_an_idle_poller_is_not_woken_while_nothing_changes(
    home: Path, sid: str, db: WatchedDB
) -> None:
    poller, task = _start(home, sid, Target(), db)
    try:
        await _idle(poller, db)
        ticks, listings, reads = poller.ticks, poller.listings, db.watch_reads
        await wait_until_async(
            lambda: db.watch_reads >= reads + 10, timeout=10, what="ten more watcher reads"
        )
        # At most the one wake-up already on its way when counting started.
        assert poller.ticks - ticks <= 1
        assert poller.listings - listings <= 1
    finally:
        await _stop(poller, task)


async def test_a_watcher_that_cannot_read_wakes_the_loop_every_interval(
    home: Path, sid: str, db: WatchedDB
) -> None:
    poller, task = _start(home, sid, Target(), db)
    try:
        await _idle(poller, db)
        ticks, listings = poller.ticks, poller.listings
        db.watch_failures = 10**6  # the loop's own tick still reads fine
        await wait_until_async(
            lambda: poller.ticks >= ticks + 3, timeout=10, what="ticks while the watcher fails"
        )
        db.watch_failures = 0
        assert poller.listings == listings  # nothing changed: woken, but no table read
    finally:
        await _stop(poller, task)


# -- a retry is due one interval later --------------------------------------------------------


async def test_a_failed_listing_is_retried_without_another_commit(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        db.list_failures = 1
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        await wait_until_async(lambda: target.calls == ["pause"], timeout=10, what="the pause")
        assert db.list_failures == 0
    finally:
        await _stop(poller, task)


async def test_a_failed_change_check_is_retried_without_another_commit(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        db.version_failures = 1
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        await wait_until_async(lambda: target.calls == ["pause"], timeout=10, what="the pause")
        assert db.version_failures == 0
    finally:
        await _stop(poller, task)


async def test_a_stamp_that_keeps_failing_is_retried_every_interval(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        db.finalize_failures = 6  # the tick that applies it, then its first retry
        row = writer.insert_control(session_id=sid, verb="pause", payload=None)
        await wait_until_async(
            lambda: writer.get_control(row.id).result == "applied",  # type: ignore[union-attr]
            timeout=10,
            what="the stamp on the third tick",
        )
        assert target.calls == ["pause"]
    finally:
        await _stop(poller, task)


async def test_an_uncertain_claim_is_looked_at_again_without_another_commit(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        db.claim_errors = (DatabaseBusyError("database busy: injected (claim)"),)
        writer.insert_control(session_id=sid, verb="message", payload={"text": "hi"})
        await wait_until_async(lambda: target.calls == ["message:hi"], timeout=10, what="hi")
    finally:
        await _stop(poller, task)


async def test_a_tick_that_fails_unexpectedly_is_logged_and_retried_soon(
    home: Path,
    writer: StateDB,
    sid: str,
    db: WatchedDB,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    target = Target()
    poller, task = _start(home, sid, target, db)
    try:
        await _idle(poller, db)
        boom = RuntimeError("boom")
        db.claim_errors = (boom,)  # after the listing: the version is already recorded
        writer.insert_control(session_id=sid, verb="message", payload={"text": "hi"})
        await wait_until_async(lambda: target.calls == ["message:hi"], timeout=10, what="hi")
    finally:
        await _stop(poller, task)
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["control poller tick failed; retrying next tick"]
    assert errors[0].exc_info is not None and errors[0].exc_info[1] is boom


async def test_a_failed_node_metadata_write_is_logged_and_retried_soon(
    home: Path,
    writer: StateDB,
    sid: str,
    db: WatchedDB,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    poller, task = _start(home, sid, Target(), db)
    try:
        await _idle(poller, db)
        db.meta_failures = 1
        row = writer.insert_control(session_id=sid, verb="pause", payload=None)

        def logged() -> bool:
            session = writer.get_session(sid)
            assert session is not None
            return [e["id"] for e in session.node_metadata.get("control_log", [])] == [row.id]

        await wait_until_async(logged, timeout=10, what="the control log written again")
    finally:
        await _stop(poller, task)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "control poller could not update node_metadata: database busy: injected (meta)"
    ]


async def test_a_state_db_that_cannot_be_opened_is_retried_every_interval(
    tmp_path: Path,
) -> None:
    poller = ControlPoller(tmp_path / "home", "f" * 32, Target(), interval=0.01, forced_list=NEVER)
    task = asyncio.ensure_future(poller.run())
    try:
        await wait_until_async(lambda: poller.open_failures >= 3, timeout=10, what="3 attempts")
    finally:
        await _stop(poller, task)


# -- the end of the run -------------------------------------------------------------------------


async def test_the_final_pass_lists_even_when_no_other_connection_committed(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller, task = _start(home, sid, target, db)
    await _idle(poller, db)
    # Written through the poller's own connection: data_version does not move.
    row = db.insert_control(session_id=sid, verb="pause", payload=None)
    await _stop(poller, task)
    assert writer.get_control(row.id).result == "rejected:run-ended"  # type: ignore[union-attr]
    assert target.calls == []


class DeferringTarget(Target):
    def defers_message_stamp(self) -> bool:
        return True


async def test_messages_no_operation_took_are_all_rejected_in_order_at_the_end(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, DeferringTarget(), interval=0.01, db=db)
    rows = [
        writer.insert_control(session_id=sid, verb="message", payload={"text": str(n)})
        for n in range(3)
    ]
    assert await poller.tick() == 0  # appended; their stamps wait for an operation
    task = asyncio.ensure_future(poller.run())
    await _stop(poller, task)
    assert [(e["id"], e["result"]) for e in poller.control_log] == [
        (row.id, "rejected:no-pending-ops") for row in rows
    ]


async def test_the_final_pass_stamps_an_earlier_effect_before_the_rejected_messages(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, DeferringTarget(), interval=0.01, db=db)
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "m"})
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    db.finalize_failures = 3  # the pause is applied but stays unstamped
    assert await poller.tick() == 0
    await poller.stop()
    await poller.run()  # straight to the final pass
    assert [(e["id"], e["result"]) for e in poller.control_log] == [
        (pause.id, "applied"),
        (msg.id, "rejected:no-pending-ops"),
    ]


async def test_delivered_messages_are_stamped_and_counted_by_the_next_tick(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, DeferringTarget(), interval=0.01, db=db)
    rows = [
        writer.insert_control(session_id=sid, verb="message", payload={"text": str(n)})
        for n in range(2)
    ]
    assert await poller.tick() == 0
    poller.messages_delivered([row.id for row in rows])
    assert await poller.tick() == 2
    assert [writer.get_control(row.id).result for row in rows] == ["applied", "applied"]  # type: ignore[union-attr]


def test_a_watcher_stuck_in_a_read_does_not_hold_up_the_end_of_the_run(
    home: Path, writer: StateDB, sid: str, db: WatchedDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poller_module, "_WATCH_JOIN_S", 0.05)
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    release, held = threading.Event(), threading.Event()

    async def run_until_stopped() -> None:
        poller, task = _start(home, sid, Target(), db)
        try:
            await _idle(poller, db)
            db.held, db.hold = held, release
            await wait_until_async(held.is_set, timeout=10, what="the watcher held in a read")
            await _stop(poller, task)  # the run ends although its watcher is still stuck
            assert poller.state == "stopped" and _watchers()
        except BaseException:
            release.set()  # the run did not end: do not leave the watcher (and the loop) hanging
            raise

    try:
        asyncio.run(run_until_stopped())
    finally:
        release.set()
    # The read now returns a change after the loop has closed: the wake-up is dropped quietly.
    wait_until(lambda: not _watchers(), timeout=10, what="the watcher thread to end")
    assert thread_errors == []


# -- claims whose answer was lost, and deliveries of unknown ids ------------------------------


async def test_a_claim_that_landed_although_it_reported_a_failure_is_delivered_once(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller = ControlPoller(home, sid, target, interval=0.01, db=db, forced_list=NEVER)
    row = writer.insert_control(session_id=sid, verb="message", payload={"text": "once"})
    db.claim_lands_then_fails = 1
    assert await poller.tick() == 1
    assert target.calls == ["message:once"]
    assert writer.get_control(row.id).result == "applied"  # type: ignore[union-attr]
    assert await poller.tick(force=True) == 0
    assert target.calls == ["message:once"]


async def test_a_claim_that_cannot_be_looked_up_stops_the_tick(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = Target()
    poller = ControlPoller(home, sid, target, interval=0.01, db=db, forced_list=NEVER)
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    later = writer.insert_control(session_id=sid, verb="pause", payload=None)
    db.claim_errors = (DatabaseBusyError("database busy: injected (claim)"),)
    db.get_control_failures = 1
    assert await poller.tick() == 0
    assert target.calls == []
    assert writer.get_control(later.id).is_pending  # type: ignore[union-attr]
    assert await poller.tick() == 2
    assert target.calls == ["message:x", "pause"]
    assert writer.get_control(msg.id).result == "applied"  # type: ignore[union-attr]


async def test_a_delivery_of_an_unknown_control_is_ignored(
    home: Path, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=db)
    poller.messages_delivered(["0" * 32, None, ""])
    assert await poller.tick() == 0
    assert poller.control_log == []


# -- the phase --------------------------------------------------------------------------------


async def test_a_first_tick_with_nothing_to_do_writes_only_the_poller_state(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=db, forced_list=NEVER)
    assert await poller.tick() == 0
    session = writer.get_session(sid)
    assert session is not None and session.phase == "planning"
    assert session.node_metadata == {"poller": "active"}  # no empty control log
    assert db.phase_writes == 0  # a session starts out planning: nothing to write


async def test_ticks_that_change_nothing_write_nothing(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=db, forced_list=NEVER)
    await poller.tick()
    await poller.tick()
    assert (db.meta_writes, db.phase_writes) == (1, 0)  # the state, once
    writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert (db.meta_writes, db.phase_writes) == (2, 1)  # the control log; the phase
    await poller.tick(force=True)
    await poller.tick()
    assert (db.meta_writes, db.phase_writes) == (2, 1)
    session = writer.get_session(sid)
    assert session is not None and session.phase == "paused"
    assert session.node_metadata["poller"] == "active"
    assert len(session.node_metadata["control_log"]) == 1


async def test_a_failed_phase_write_after_a_pause_is_retried_by_the_same_tick(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=db, forced_list=NEVER)
    row = writer.insert_control(session_id=sid, verb="pause", payload=None)
    db.phase_failures = 1  # the write before the stamp fails; the one at the end of the tick not
    assert await poller.tick() == 1
    assert writer.get_control(row.id).result == "applied"  # type: ignore[union-attr]
    assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]


class GateTarget(Target):
    """A flow whose gate also closes by itself (the target reports it)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_closed = False

    def is_paused(self) -> bool | None:
        return self.gate_closed


async def test_once_the_run_is_over_the_phase_stays_as_last_published(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    target = GateTarget()
    poller = ControlPoller(home, sid, target, interval=0.01, db=db, forced_list=NEVER)
    poller.executing = True
    await poller.tick()
    assert writer.get_session(sid).phase == "executing"  # type: ignore[union-attr]
    target.gate_closed = True  # after the last tick of the run
    await poller.stop()
    await poller.run()  # straight to the final pass
    assert writer.get_session(sid).phase == "executing"  # type: ignore[union-attr]


async def test_a_cancelled_run_writes_no_phase_when_it_closes(
    home: Path, writer: StateDB, sid: str, db: WatchedDB
) -> None:
    poller, task = _start(home, sid, Target(), db)
    await _idle(poller, db)
    poller.executing = True  # the loop is woken, but the cancel lands first
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert poller.state == "stopped"
    session = writer.get_session(sid)
    assert session is not None and session.node_metadata["poller"] == "stopped"
    assert session.phase == "planning"


async def test_a_failed_phase_write_at_start_executing_is_logged_and_written_next_tick(
    home: Path,
    writer: StateDB,
    sid: str,
    db: WatchedDB,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=db, forced_list=NEVER)
    db.phase_failures = 1
    await poller.start_executing()
    assert poller.executing
    assert writer.get_session(sid).phase == "planning"  # type: ignore[union-attr]
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "control poller could not write the phase: database busy: injected (phase)"
    ]
    await poller.tick()
    assert writer.get_session(sid).phase == "executing"  # type: ignore[union-attr]


# -- closing ------------------------------------------------------------------------------------


async def test_a_run_whose_last_metadata_write_fails_still_ends_and_closes(
    home: Path, sid: str, db: WatchedDB
) -> None:
    poller, task = _start(home, sid, Target(), db)
    await _idle(poller, db)
    db.meta_failures = 10**6  # the final pass and the closing write both fail
    await _stop(poller, task)
    assert poller.state == "stopped"


async def test_a_poller_that_opened_its_own_db_lets_go_of_it_when_it_stops(
    home: Path, writer: StateDB, sid: str
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, forced_list=NEVER)
    task = asyncio.ensure_future(poller.run())
    await wait_until_async(lambda: poller.ticks >= 1, timeout=10, what="a first tick")
    await _stop(poller, task)
    assert writer.get_session(sid).node_metadata["poller"] == "stopped"  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match=r"before the state DB is open"):
        await poller.tick()
