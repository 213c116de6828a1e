"""The control poller at library level, on each real state backend (ADR-0069 D1-D3).

Rows are written through a second connection (as a ``ctl`` process would), so the
poller's ``PRAGMA data_version`` check (SQLite) or its ``LISTEN`` (PostgreSQL) sees them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster

from pg_support import PgRaw
from steerflow import _faults
from steerflow.control import (
    CONTROL_LOG_MAX,
    DEFAULT_POLL_S,
    POLL_ENV,
    ControlPoller,
    SteeringTarget,
    poll_interval,
)
from steerflow.errors import DatabaseBusyError
from steerflow.state import STATE_DB_URL_ENV, ControlRow, StateDB
from waiting import wait_until_async


class Target(SteeringTarget):
    """Records every effect; ``pending`` says whether an operation is still to start."""

    def __init__(self, *, pending: bool = True, report_paused: bool = False) -> None:
        self.calls: list[str] = []
        self.pending = pending
        self.messages: list[dict[str, Any]] = []
        self.fail_with: Exception | None = None
        self.gate_closed = False
        self.report_paused = report_paused

    def pause(self) -> None:
        if self.fail_with:
            raise self.fail_with
        self.gate_closed = True
        self.calls.append("pause")

    def resume(self) -> None:
        self.gate_closed = False
        self.calls.append("resume")

    def has_pending_operation(self) -> bool:
        return self.pending

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        if self.fail_with:
            raise self.fail_with
        self.calls.append(f"message:{text}")
        self.messages.append({"text": text, "ts": ts, "control_id": control_id})

    def is_paused(self) -> bool | None:
        return self.gate_closed if self.report_paused else None


class FlakyDB(StateDB):
    """A StateDB whose listing or stamping fails a chosen number of times."""

    list_failures = 0
    finalize_failures = 0
    claim_failures = 0
    list_calls = 0
    finalize_calls = 0

    def list_pending_controls(self, session_id: str) -> list[ControlRow]:
        self.list_calls += 1
        if self.list_failures > 0:
            self.list_failures -= 1
            raise DatabaseBusyError("database busy: injected (list)")
        return super().list_pending_controls(session_id)

    def finalize_control(
        self, control_id: str, result: str, *, claimant: str | None = None
    ) -> bool:
        self.finalize_calls += 1
        if self.finalize_failures > 0:
            self.finalize_failures -= 1
            raise DatabaseBusyError("database busy: injected (finalize)")
        return super().finalize_control(control_id, result, claimant=claimant)

    def claim_control(self, control_id: str, claimant: str) -> bool:
        if self.claim_failures > 0:
            self.claim_failures -= 1
            raise DatabaseBusyError("database busy: injected (claim)")
        return super().claim_control(control_id, claimant)


@pytest.fixture
def home(tmp_path: Path, state_backend: str) -> Path:
    return tmp_path / "home"


@pytest.fixture
def writer(home: Path) -> Iterator[StateDB]:
    """The "other process": creates the session and queues rows."""
    with StateDB.open(home) as db:
        yield db


@pytest.fixture
def sid(writer: StateDB) -> str:
    return writer.create_session(kind="flow", node_metadata={"poller": "pending"}).id


@pytest.fixture
def consumer(home: Path, writer: StateDB) -> Iterator[FlakyDB]:
    """The poller's own connection (a distinct one, as in the flow process)."""
    backend_db = StateDB.open(home)
    db = FlakyDB(backend_db.backend, path=backend_db.path)
    try:
        yield db
    finally:
        db.close()


def _raw(writer: StateDB) -> Any:
    if writer.path is None:
        return PgRaw(os.environ[STATE_DB_URL_ENV])
    return sqlite3.connect(writer.path, isolation_level=None)


def _raw_control(writer: StateDB, cid: str, sid: str, verb: str, created_at: float,
                 text: str | None = None) -> None:  # fmt: skip
    conn = _raw(writer)
    try:
        conn.execute(
            "INSERT INTO session_controls (id, session_id, verb, payload, created_at) VALUES"
            " (?, ?, ?, ?, ?)",
            (cid, sid, verb, None if text is None else f'{{"text": "{text}"}}', created_at),
        )
    finally:
        conn.close()


def _poller(home: Path, sid: str, target: Target, db: StateDB) -> ControlPoller:
    return ControlPoller(home, sid, target, interval=0.01, db=db)


async def test_applies_in_created_at_then_id_order(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    _raw_control(writer, "c" * 32, sid, "message", 5.0, "third")
    _raw_control(writer, "b" * 32, sid, "message", 5.0, "second")
    _raw_control(writer, "d" * 32, sid, "pause", 1.0)
    _raw_control(writer, "a" * 32, sid, "resume", 9.0)
    _raw_control(writer, "0" * 32, sid, "message", 2.0, "first")
    target = Target()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 5
    assert target.calls == ["pause", "message:first", "message:second", "message:third", "resume"]
    rows = writer.list_controls(sid)
    assert [r.id for r in rows] == ["d" * 32, "0" * 32, "b" * 32, "c" * 32, "a" * 32]
    assert all(r.result == "applied" for r in rows)
    stamps = [r.applied_at for r in rows]
    assert None not in stamps and stamps == sorted(stamps)  # type: ignore[type-var]
    assert [m["control_id"] for m in target.messages] == ["0" * 32, "b" * 32, "c" * 32]


async def test_nothing_listed_without_a_change(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    poller = _poller(home, sid, Target(), consumer)
    await poller.tick()
    calls = consumer.list_calls
    for _ in range(5):
        await poller.tick()
    assert consumer.list_calls == calls  # data_version unchanged: no table read
    writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert consumer.list_calls == calls + 1


async def test_failed_listing_is_retried_next_tick(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    row = writer.insert_control(session_id=sid, verb="pause", payload=None)
    consumer.list_failures = 1
    target = Target()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 0  # the failure does not raise
    assert target.calls == [] and writer.get_control(row.id) == row
    # No new commit happened, yet the next tick lists again and applies.
    assert await poller.tick() == 1
    assert target.calls == ["pause"]
    assert writer.get_control(row.id).result == "applied"  # type: ignore[union-attr]


async def test_stamp_retried_twice_within_the_tick(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    first = writer.insert_control(session_id=sid, verb="pause", payload=None)
    second = writer.insert_control(session_id=sid, verb="resume", payload=None)
    consumer.finalize_failures = 2  # the first try and one retry fail, the last retry works
    target = Target()
    assert await _poller(home, sid, target, consumer).tick() == 2
    assert target.calls == ["pause", "resume"]
    assert writer.get_control(first.id).result == "applied"  # type: ignore[union-attr]
    assert writer.get_control(second.id).result == "applied"  # type: ignore[union-attr]


async def test_unstamped_effect_stops_the_tick(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    first = writer.insert_control(session_id=sid, verb="pause", payload=None)
    second = writer.insert_control(session_id=sid, verb="resume", payload=None)
    consumer.finalize_failures = 3  # every attempt of this tick fails
    target = Target()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 0
    assert consumer.finalize_calls == 3
    assert target.calls == ["pause"]  # the later resume did not overtake the unstamped pause
    assert writer.get_control(first.id).is_pending  # type: ignore[union-attr]
    assert writer.get_control(second.id).is_pending  # type: ignore[union-attr]
    assert await poller.tick() == 2
    assert target.calls == ["pause", "resume"]
    stamped = [writer.get_control(r.id) for r in (first, second)]
    assert [r.result for r in stamped if r] == ["applied", "applied"]


async def test_unstamped_message_is_never_appended_twice(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "once"})
    later = writer.insert_control(session_id=sid, verb="pause", payload=None)
    consumer.finalize_failures = 6  # two whole ticks of attempts
    target = Target()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 0
    row = writer.get_control(msg.id)
    assert row is not None and row.is_applying  # claimed, appended, not stamped
    assert await poller.tick(force=True) == 0  # still failing: the later pause waits
    assert target.calls == ["message:once"]
    assert await poller.tick() == 2
    assert target.calls == ["message:once", "pause"]
    assert writer.get_control(msg.id).result == "applied"  # type: ignore[union-attr]
    assert writer.get_control(later.id).result == "applied"  # type: ignore[union-attr]


async def test_uncertain_claim_stops_the_tick_and_is_retried(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    later = writer.insert_control(session_id=sid, verb="pause", payload=None)
    consumer.claim_failures = 1
    target = Target()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 0
    assert target.calls == []
    assert writer.get_control(msg.id).is_pending  # type: ignore[union-attr]
    assert writer.get_control(later.id).is_pending  # type: ignore[union-attr]
    assert await poller.tick() == 2
    assert target.calls == ["message:x", "pause"]


async def test_message_rules(home: Path, writer: StateDB, sid: str, consumer: FlakyDB) -> None:
    target = Target(pending=False)
    poller = _poller(home, sid, target, consumer)
    late = writer.insert_control(session_id=sid, verb="message", payload={"text": "late"})
    stop = writer.insert_control(session_id=sid, verb="stop", payload=None)
    await poller.tick()
    assert writer.get_control(late.id).result == "rejected:no-pending-ops"  # type: ignore[union-attr]
    assert writer.get_control(stop.id).result == "rejected:unsupported-verb:stop"  # type: ignore[union-attr]
    assert target.calls == []

    target.pending = True
    target.fail_with = RuntimeError("x" * 2000)
    broken = writer.insert_control(session_id=sid, verb="message", payload={"text": "boom"})
    bad_pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    result = writer.get_control(broken.id).result  # type: ignore[union-attr]
    assert result == "rejected:error:" + "x" * 500
    assert writer.get_control(bad_pause.id).result == "rejected:error:" + "x" * 500  # type: ignore[union-attr]

    target.fail_with = None
    empty = writer.insert_control(session_id=sid, verb="message", payload={})
    await poller.tick()
    assert writer.get_control(empty.id).result == "applied"  # type: ignore[union-attr]
    assert target.messages[-1]["text"] == ""


async def test_claimed_row_is_never_touched(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "theirs"})
    assert writer.claim_control(msg.id, "otherhost:1:flow-executor:dead")
    target = Target()
    poller = _poller(home, sid, target, consumer)
    for _ in range(3):
        await poller.tick(force=True)
    assert target.calls == []
    assert writer.get_control(msg.id).result == "applying:otherhost:1:flow-executor:dead"  # type: ignore[union-attr]


async def test_claim_written_before_the_effect(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB, blockbuster: BlockBuster
) -> None:
    # the spy reads the row inside the effect callback, on the loop: a test-only probe
    for name, function in blockbuster.functions.items():
        if name.startswith("sqlite3."):
            function.can_block_in("tests/control/test_poller.py", "spy")
    seen: list[str | None] = []
    target = Target()
    original = target.add_operator_message

    def spy(text: str, *, ts: float, control_id: str) -> None:
        row = writer.get_control(control_id)
        seen.append(row.result if row else None)
        original(text, ts=ts, control_id=control_id)

    target.add_operator_message = spy  # type: ignore[method-assign]
    writer.insert_control(session_id=sid, verb="message", payload={"text": "hi"})
    poller = _poller(home, sid, target, consumer)
    await poller.tick()
    assert seen == [f"applying:{poller.claimant}"]
    host, pid, executor, _ = poller.claimant.split(":")
    assert host and int(pid) > 0 and executor == "flow-executor"


async def test_fault_seam_after_claim(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    points: list[tuple[str, str]] = []
    previous = _faults.set_fault_hook(lambda step, when: points.append((step, when)))
    try:
        writer.insert_control(session_id=sid, verb="message", payload={"text": "hi"})
        await _poller(home, sid, Target(), consumer).tick()
    finally:
        _faults.set_fault_hook(previous)
    assert ("control-claim", "after") in points
    assert points.index(("control-claim", "after")) < points.index(("control-finalize", "before"))
    assert _faults.parse("exit:after:control-claim")[0][0].point == "after:control-claim"


async def test_poller_state_control_log_and_phase(home: Path, writer: StateDB, sid: str) -> None:
    target = Target()
    poller = ControlPoller(home, sid, target, interval=0.01)
    assert poller.state == "pending"
    task = asyncio.ensure_future(poller.run())

    async def until(predicate: Any, what: str) -> None:
        await wait_until_async(predicate, timeout=10, what=what)

    def meta() -> dict[str, Any]:
        row = writer.get_session(sid)
        assert row is not None
        return dict(row.node_metadata)

    try:
        await until(lambda: meta().get("poller") == "active", "poller active")
        assert poller.state == "active"
        pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
        # The phase is written before the row is stamped, so once the stamp is
        # visible the phase must already be visible too (not the other way round).
        await until(lambda: writer.get_control(pause.id).applied_at is not None, "pause stamped")  # type: ignore[union-attr]
        assert writer.get_control(pause.id).result == "applied"  # type: ignore[union-attr]
        assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]
        resume = writer.insert_control(session_id=sid, verb="resume", payload=None)
        await until(lambda: writer.get_control(resume.id).applied_at is not None, "resume stamped")  # type: ignore[union-attr]
        assert writer.get_session(sid).phase == "planning"  # type: ignore[union-attr]
        poller.executing = True
        await until(lambda: writer.get_session(sid).phase == "executing", "executing")  # type: ignore[union-attr]
        writer.insert_control(session_id=sid, verb="pause", payload=None)
        await until(lambda: writer.get_session(sid).phase == "paused", "paused again")  # type: ignore[union-attr]
        await until(lambda: len(meta().get("control_log", [])) == 3, "log of three")
        log = meta()["control_log"]
        assert [e["verb"] for e in log] == ["pause", "resume", "pause"]
        assert [e["id"] for e in log[:2]] == [pause.id, resume.id]
        assert all(e["result"] == "applied" and isinstance(e["at"], float) for e in log)
    finally:
        await poller.stop()
        await asyncio.wait_for(task, 10)
    assert poller.state == "stopped" and meta()["poller"] == "stopped"


async def test_runner_phase_write_is_not_left_stale(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    """The runner writes ``executing`` when execution starts; a pause applied just
    before must still show once the runner hands over (``executing = True``)."""
    target = Target(report_paused=True)
    poller = _poller(home, sid, target, consumer)
    writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]
    writer.set_session_phase(sid, "executing")  # the runner's (stale) write
    poller.executing = True
    await poller.tick()
    assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]


async def test_control_log_is_compact(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    for _ in range(CONTROL_LOG_MAX + 7):
        writer.insert_control(session_id=sid, verb="resume", payload=None)
    poller = _poller(home, sid, Target(), consumer)
    await poller.tick()
    log = writer.get_session(sid).node_metadata["control_log"]  # type: ignore[union-attr]
    assert len(log) == CONTROL_LOG_MAX
    assert set(log[0]) == {"id", "verb", "result", "at"}
    assert log[-1]["id"] == writer.list_controls(sid)[-1].id


async def test_final_pass_stamps_rows_that_came_too_late(
    home: Path, writer: StateDB, sid: str
) -> None:
    target = Target()
    poller = ControlPoller(home, sid, target, interval=5.0)  # the loop would not tick again
    task = asyncio.ensure_future(poller.run())
    await _poller_active(writer, sid)
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "late"})
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert writer.get_control(msg.id).result == "rejected:no-pending-ops"  # type: ignore[union-attr]
    assert writer.get_control(pause.id).result == "rejected:run-ended"  # type: ignore[union-attr]
    assert target.calls == []


class StoppableTarget(Target):
    """A target that can be stopped (``ctl stop``); records the stops it got."""

    def __init__(self, *, report_paused: bool = True) -> None:
        super().__init__(report_paused=report_paused)
        self.stops: list[tuple[bool, str | None, str]] = []

    def stop(self, *, now: bool, reason: str | None, control_id: str) -> None:
        if self.fail_with:
            raise self.fail_with
        self.stops.append((now, reason, control_id))
        self.gate_closed = False
        self.calls.append("stop")


async def test_stop_is_applied_ends_a_pause_and_sets_the_phase(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    target = StoppableTarget()
    poller = _poller(home, sid, target, consumer)
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]
    graceful = writer.insert_control(
        session_id=sid, verb="stop", payload={"now": False, "reason": "maintenance"}
    )
    hard = writer.insert_control(session_id=sid, verb="stop", payload={"now": True})
    await poller.tick()
    assert target.calls == ["pause", "stop", "stop"]
    assert target.stops == [(False, "maintenance", graceful.id), (True, None, hard.id)]
    assert [writer.get_control(c.id).result for c in (pause, graceful, hard)] == [  # type: ignore[union-attr]
        "applied",
        "applied",
        "applied",
    ]
    assert writer.get_session(sid).phase == "planning"  # type: ignore[union-attr]

    target.fail_with = RuntimeError("cannot stop")
    broken = writer.insert_control(session_id=sid, verb="stop", payload=None)
    await poller.tick()
    assert writer.get_control(broken.id).result == "rejected:error:cannot stop"  # type: ignore[union-attr]


async def test_stop_after_the_run_ended_is_rejected_run_ended(
    home: Path, writer: StateDB, sid: str
) -> None:
    target = StoppableTarget()
    poller = ControlPoller(home, sid, target, interval=5.0)  # the loop would not tick again
    task = asyncio.ensure_future(poller.run())
    await _poller_active(writer, sid)
    late = writer.insert_control(session_id=sid, verb="stop", payload={"now": True})
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert writer.get_control(late.id).result == "rejected:run-ended"  # type: ignore[union-attr]
    assert target.stops == []


async def test_stop_hands_the_target_a_reason_as_text_and_now_only_when_true(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    target = StoppableTarget()
    poller = _poller(home, sid, target, consumer)
    odd = writer.insert_control(session_id=sid, verb="stop", payload={"now": "yes", "reason": 5})
    await poller.tick()
    assert target.stops == [(False, "5", odd.id)]
    assert writer.get_control(odd.id).result == "applied"  # type: ignore[union-attr]


async def test_stop_ends_a_pause_the_target_cannot_report(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    # is_paused() is None: only the poller's own record of the controls says "paused"
    target = StoppableTarget(report_paused=False)
    poller = _poller(home, sid, target, consumer)
    writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert poller.paused is True
    assert writer.get_session(sid).phase == "paused"  # type: ignore[union-attr]
    writer.insert_control(session_id=sid, verb="stop", payload=None)
    await poller.tick()
    assert poller.paused is False
    assert writer.get_session(sid).phase == "planning"  # type: ignore[union-attr]


async def test_poller_survives_a_db_that_cannot_be_opened_yet(tmp_path: Path) -> None:
    home = tmp_path / "home"
    poller = ControlPoller(home, "f" * 32, Target(), interval=0.01)
    # Not a directory: opening fails; the poller keeps trying instead of dying.
    home.write_text("not a directory")
    task = asyncio.ensure_future(poller.run())
    await wait_until_async(
        lambda: poller.open_failures >= 3, timeout=10, what="three open attempts"
    )
    assert not task.done()
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert poller.state == "stopped"


def test_poll_interval_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POLL_ENV, raising=False)
    assert poll_interval() == DEFAULT_POLL_S == 0.05
    monkeypatch.setenv(POLL_ENV, "2.0")
    assert poll_interval() == 2.0
    for bad in ("", "fast", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(POLL_ENV, bad)
        assert poll_interval() == DEFAULT_POLL_S, bad


async def test_final_pass_retries_a_failed_stamp(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    poller = ControlPoller(home, sid, Target(), interval=0.01, db=consumer)
    task = asyncio.ensure_future(poller.run())
    await _poller_active(writer, sid)
    consumer.finalize_failures = 3  # the whole first attempt of the final pass fails
    await poller.stop()
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "late"})
    await asyncio.wait_for(task, 10)
    assert writer.get_control(msg.id).result == "rejected:no-pending-ops"  # type: ignore[union-attr]
    assert writer.get_session(sid).node_metadata["poller"] == "stopped"  # type: ignore[union-attr]


async def _poller_active(writer: StateDB, sid: str) -> None:
    def active() -> bool:
        row = writer.get_session(sid)
        return row is not None and row.node_metadata.get("poller") == "active"

    await wait_until_async(active, timeout=10, what="poller state 'active'")


class _PhaseAtStamp(FlakyDB):
    """Records the session phase as it is in the DB when each row gets its stamp."""

    sid: str
    seen: list[tuple[str, str]]

    def finalize_control(
        self, control_id: str, result: str, *, claimant: str | None = None
    ) -> bool:
        row = self.get_session(self.sid)
        assert row is not None
        self.seen.append((control_id, row.phase))
        return super().finalize_control(control_id, result, claimant=claimant)


@pytest.mark.parametrize(
    ("make_target", "second"),
    [(Target, "resume"), (StoppableTarget, "stop")],
    ids=["resume", "stop"],
)
async def test_phase_is_written_before_the_row_is_stamped(
    home: Path,
    writer: StateDB,
    sid: str,
    consumer: FlakyDB,
    make_target: Callable[[], Target],
    second: str,
) -> None:
    db = _PhaseAtStamp(consumer.backend, path=consumer.path)
    db.sid, db.seen = sid, []
    poller = _poller(home, sid, make_target(), db)
    poller.executing = True
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    assert await poller.tick() == 1
    then = writer.insert_control(session_id=sid, verb=second, payload=None)
    assert await poller.tick() == 1
    # Anyone who sees a stamped pause also sees phase 'paused'; a resume or a stop ends
    # the pause, so whoever sees it stamped sees the gate open in the phase too.
    assert db.seen == [(pause.id, "paused"), (then.id, "executing")]


class DeferringTarget(Target):
    """A flow's target: ``applied`` waits until an operation is invoked with the message."""

    def defers_message_stamp(self) -> bool:
        return True


async def test_deferred_message_is_applied_when_delivered_and_rejected_if_never(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    """Decision 36: ``applied`` means an operation was invoked with the message; one that no
    operation took by the end of the run is ``rejected:no-pending-ops`` (decision 19)."""
    taken = writer.insert_control(session_id=sid, verb="message", payload={"text": "taken"})
    left = writer.insert_control(session_id=sid, verb="message", payload={"text": "left"})
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    target = DeferringTarget()
    poller = _poller(home, sid, target, consumer)
    assert await poller.tick() == 1  # only the pause: the messages wait for an operation
    assert target.calls == ["message:taken", "message:left", "pause"]
    assert writer.get_control(pause.id).result == "applied"  # type: ignore[union-attr]
    for row in (taken, left):
        current = writer.get_control(row.id)
        assert current is not None and current.is_applying and current.applied_at is None

    poller.messages_delivered([taken.id, None])
    assert await poller.tick() == 1
    assert writer.get_control(taken.id).result == "applied"  # type: ignore[union-attr]
    assert writer.get_control(left.id).is_applying  # type: ignore[union-attr]

    task = asyncio.ensure_future(poller.run())
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert writer.get_control(left.id).result == "rejected:no-pending-ops"  # type: ignore[union-attr]
    assert writer.get_control(taken.id).result == "applied"  # type: ignore[union-attr]
    assert target.calls == ["message:taken", "message:left", "pause"]  # nothing applied twice


# -- small rules pinned exactly (issue 20) -----------------------------------------------------


def test_poll_interval_keeps_sub_second_values_and_floors_tiny_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for raw, expected in (("0.5", 0.5), (" 0.2 ", 0.2), ("0.0001", 0.001), ("1", 1.0)):
        monkeypatch.setenv(POLL_ENV, raw)
        assert poll_interval() == expected, raw


def test_new_poller_starts_idle_with_its_claimant_and_interval(
    home: Path, sid: str, consumer: FlakyDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POLL_ENV, "0.25")
    poller = ControlPoller(home, sid, Target(), db=consumer)
    assert poller.interval == 0.25  # from the environment when not given
    assert poller.claimant.endswith(f":flow-executor:{sid[:12]}")
    assert poller.claimant.count(":") == 3
    assert (poller.state, poller.executing, poller.paused) == ("pending", False, False)
    assert (poller.ticks, poller.listings, poller.open_failures) == (0, 0, 0)
    assert ControlPoller(home, sid, Target(), interval=0.3, db=consumer).interval == 0.3
    assert ControlPoller(home, sid, Target(), interval=0, db=consumer).interval == 0.001


async def test_a_given_database_is_left_open(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    poller = _poller(home, sid, Target(), consumer)
    task = asyncio.ensure_future(poller.run())
    await _poller_active(writer, sid)
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert poller.state == "stopped"
    assert consumer.count_controls() == 0  # still usable: the caller owns it


async def test_error_without_a_message_is_named_by_its_type(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    target = Target()
    target.fail_with = RuntimeError()
    poller = _poller(home, sid, target, consumer)
    row = writer.insert_control(session_id=sid, verb="pause", payload=None)
    await poller.tick()
    assert writer.get_control(row.id).result == "rejected:error:RuntimeError"  # type: ignore[union-attr]


async def test_message_text_of_another_type_is_delivered_as_text(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    target = Target()
    poller = _poller(home, sid, target, consumer)
    writer.insert_control(session_id=sid, verb="message", payload={"text": 5})
    conn = _raw(writer)
    try:  # a payload that is not an object at all (written by hand, not by ``ctl``)
        conn.execute(
            "INSERT INTO session_controls (id, session_id, verb, payload, created_at) VALUES"
            " (?, ?, 'message', '[1]', ?)",
            ("e" * 32, sid, time.time() + 1),
        )
    finally:
        conn.close()
    before = time.time()
    await poller.tick()
    assert [m["text"] for m in target.messages] == ["5", ""]
    assert all(before <= m["ts"] <= time.time() for m in target.messages)


async def test_tick_counts_listings_and_stamps_and_activates_the_poller(
    home: Path, writer: StateDB, sid: str, consumer: FlakyDB
) -> None:
    poller = _poller(home, sid, Target(), consumer)
    assert await poller.tick() == 0
    assert (poller.state, poller.ticks, poller.listings) == ("active", 1, 1)
    assert writer.get_session(sid).node_metadata["poller"] == "active"  # type: ignore[union-attr]
    writer.insert_control(session_id=sid, verb="pause", payload=None)
    writer.insert_control(session_id=sid, verb="resume", payload=None)
    assert await poller.tick() == 2
    assert (poller.state, poller.ticks, poller.listings) == ("active", 2, 2)
    assert await poller.tick() == 0  # nothing changed: no listing
    assert (poller.ticks, poller.listings) == (3, 2)


async def test_tick_before_the_database_is_open_is_a_programming_error(
    home: Path, sid: str
) -> None:
    poller = ControlPoller(home, sid, Target())
    with pytest.raises(
        RuntimeError, match=r"^ControlPoller\.tick\(\) before the state DB is open$"
    ):
        await poller.tick()


# -- what the poller tells the operator's log (issue 20) ---------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "steerflow.control._poller" and r.levelno == logging.WARNING
    ]


async def test_open_failures_are_counted_logged_and_never_create_the_db(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="steerflow.control._poller")
    home = tmp_path / "home"  # no state DB: the runner creates it, never the poller
    poller = ControlPoller(home, "f" * 32, Target(), interval=0.01)
    task = asyncio.ensure_future(poller.run())
    await wait_until_async(lambda: poller.open_failures >= 2, timeout=10, what="two attempts")
    await poller.stop()
    await asyncio.wait_for(task, 10)
    assert not (home / "state.db").exists()
    logged = _warnings(caplog)
    assert len(logged) == poller.open_failures
    assert all(
        m.startswith("control poller cannot open the state DB (retrying): no state database at")
        for m in logged
    ), logged
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no tick ran


async def test_listing_claim_and_stamp_failures_are_logged(
    home: Path,
    writer: StateDB,
    sid: str,
    consumer: FlakyDB,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="steerflow.control._poller")
    poller = _poller(home, sid, Target(), consumer)
    consumer.list_failures = 1
    await poller.tick()
    assert _warnings(caplog) == [
        "control poller could not list pending controls: database busy: injected (list)"
    ]
    caplog.clear()
    msg = writer.insert_control(session_id=sid, verb="message", payload={"text": "x"})
    consumer.claim_failures = 1
    await poller.tick()
    assert _warnings(caplog) == [
        f"control poller could not claim {msg.id}: database busy: injected (claim)"
    ]
    caplog.clear()
    await poller.tick()  # the claim is retried and the message delivered
    pause = writer.insert_control(session_id=sid, verb="pause", payload=None)
    consumer.finalize_failures = 2
    assert await poller.tick() == 1
    assert _warnings(caplog) == [
        f"control poller could not stamp {pause.id} (attempt {n}): database busy: injected"
        " (finalize)"
        for n in (1, 2)
    ]


class _StampedElsewhere(FlakyDB):
    """Another consumer stamps the row just before this one tries."""

    def finalize_control(
        self, control_id: str, result: str, *, claimant: str | None = None
    ) -> bool:
        super().finalize_control(control_id, "rejected:run-ended")
        return super().finalize_control(control_id, result, claimant=claimant)


async def test_a_row_stamped_by_someone_else_is_logged_as_such(
    home: Path, writer: StateDB, sid: str
) -> None:
    opened = StateDB.open(home)
    db = _StampedElsewhere(opened.backend, path=opened.path)
    try:
        poller = _poller(home, sid, Target(), db)
        row = writer.insert_control(session_id=sid, verb="pause", payload=None)
        assert await poller.tick() == 1
        assert [(e["id"], e["verb"], e["result"]) for e in poller.control_log] == [
            (row.id, "pause", "stamped-elsewhere")
        ]
        assert writer.get_control(row.id).result == "rejected:run-ended"  # type: ignore[union-attr]
    finally:
        db.close()
