"""The control poller inside the flow process: the single consumer of its session's rows.

It checks ``PRAGMA data_version`` every tick (microseconds, no table read) and runs
the indexed pending-rows query only when another connection committed something,
so a short interval gives low latency without measurable idle CPU.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

from steerflow import _faults
from steerflow.errors import SteerflowError
from steerflow.state import ControlRow, StateDB

__all__ = ["DEFAULT_POLL_S", "POLL_ENV", "ControlPoller", "SteeringTarget"]

POLL_ENV = "STEERFLOW_CONTROL_POLL_S"
DEFAULT_POLL_S = 0.05
# Re-list pending rows at least this often even when data_version says nothing changed,
# so a row whose stamping failed is retried on a later tick.
_FORCED_LIST_S = 2.0
_STAMP_ATTEMPTS = 3  # the first try and two retries (D2)
_CONTROL_LOG_MAX = 50


class SteeringTarget(abc.ABC):
    """What the poller may do to the live flow."""

    @abc.abstractmethod
    def pause(self) -> None:
        """Close the pause gate."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Open the pause gate."""

    @abc.abstractmethod
    def has_pending_operation(self) -> bool:
        """True if an operation has not started yet."""

    @abc.abstractmethod
    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        """Append one message to the shared context's operator messages."""

    def is_paused(self) -> bool:
        """True while the gate is closed (used for the phase column)."""
        return False


def poll_interval() -> float:
    """The poll interval from ``STEERFLOW_CONTROL_POLL_S`` (default 0.05 s)."""
    raw = os.environ.get(POLL_ENV)
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_POLL_S
    return value if value > 0 else DEFAULT_POLL_S


class ControlPoller:
    """Applies pause, resume and message rows in (created_at, id) order."""

    def __init__(self, home: Path, session_id: str, target: SteeringTarget) -> None:
        self.home = home
        self.session_id = session_id
        self.target = target
        self.interval = poll_interval()
        self.claimant = f"{socket.gethostname()}:{os.getpid()}:flow-executor:{session_id[:12]}"
        self.executing = False
        self.paused = False
        self._db: StateDB | None = None
        self._stopping = asyncio.Event()
        self._log: list[dict[str, Any]] = []
        self._last_version: int | None = None
        self._last_list = 0.0
        self.state = "pending"

    async def run(self) -> None:
        """Tick until :meth:`stop`."""
        try:
            self._db = await asyncio.to_thread(StateDB.open, self.home)
            await self._set_meta({"poller": "active"})
            self.state = "active"
            while not self._stopping.is_set():
                await self.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.interval)
        finally:
            if self._db is not None:
                with contextlib.suppress(SteerflowError):
                    await self._set_meta({"poller": "stopped"})
                await asyncio.to_thread(self._db.close)
            self.state = "stopped"

    async def stop(self) -> None:
        """Ask the loop to end after the current tick."""
        self._stopping.set()

    async def tick(self) -> None:
        """One pass: list pending rows if something changed, apply them in order."""
        db = self._db
        assert db is not None
        try:
            version = await asyncio.to_thread(db.data_version)
        except SteerflowError:
            return
        now = time.monotonic()
        if version == self._last_version and now - self._last_list < _FORCED_LIST_S:
            return
        try:
            rows = await asyncio.to_thread(db.list_pending_controls, self.session_id)
        except SteerflowError:
            return  # a failed listing is retried next tick; the run goes on
        self._last_version = version
        self._last_list = now
        for row in rows:
            if not await self._apply(db, row):
                # An effect we could not stamp: stop here so no later row overtakes it.
                self._last_version = None
                return

    async def _apply(self, db: StateDB, row: ControlRow) -> bool:
        if row.verb in ("pause", "resume"):
            if row.verb == "pause":
                self.target.pause()
            else:
                self.target.resume()
            self.paused = row.verb == "pause"
            stamped = await self._finalize(db, row, "applied")
            if stamped:
                phase = "paused" if self.paused else ("executing" if self.executing else "planning")
                with contextlib.suppress(SteerflowError):
                    await asyncio.to_thread(db.set_session_phase, self.session_id, phase)
            return stamped
        if row.verb == "message":
            return await self._apply_message(db, row)
        return await self._finalize(db, row, f"rejected:unsupported-verb:{row.verb}")

    async def _apply_message(self, db: StateDB, row: ControlRow) -> bool:
        try:
            claimed = await asyncio.to_thread(db.claim_control, row.id, self.claimant)
        except SteerflowError:
            return False
        if not claimed:
            return True  # someone else holds it; never touch a claimed row
        _faults.seam("control-claim", "after")
        try:
            if not self.target.has_pending_operation():
                return await self._finalize(db, row, "rejected:no-pending-ops")
            payload = row.payload or {}
            text = payload.get("text", "") if isinstance(payload, dict) else ""
            self.target.add_operator_message(str(text), ts=time.time(), control_id=row.id)
        except Exception as exc:  # the row records any apply failure, the run goes on
            return await self._finalize(db, row, f"rejected:error:{str(exc)[:500]}")
        _faults.seam("control-finalize", "before")
        return await self._finalize(db, row, "applied")

    async def _finalize(self, db: StateDB, row: ControlRow, result: str) -> bool:
        for _ in range(_STAMP_ATTEMPTS):
            try:
                await asyncio.to_thread(db.finalize_control, row.id, result)
            except SteerflowError:
                continue
            self._log.append({"id": row.id, "verb": row.verb, "result": result, "at": time.time()})
            del self._log[:-_CONTROL_LOG_MAX]
            with contextlib.suppress(SteerflowError):
                await self._set_meta({"control_log": list(self._log)})
            return True
        return False

    async def _set_meta(self, patch: dict[str, Any]) -> None:
        assert self._db is not None
        await asyncio.to_thread(self._db.update_node_metadata, self.session_id, patch)
