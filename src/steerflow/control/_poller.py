"""The control poller inside the flow process: the single consumer of its session's rows.

Every tick it reads ``PRAGMA data_version`` (microseconds, no table read) and runs
the indexed pending-rows query only when another connection committed something
(or at least every :data:`_FORCED_LIST_S`), so a short interval gives low latency
without measurable idle CPU. On a backend that notifies (PostgreSQL ``LISTEN``), no
watcher polls at all: an insert for the session wakes the loop, and the
:data:`_FORCED_LIST_S` listing is the safety net.

Rules it keeps (ADR-0069 D1-D3, CONTRACT §7):

* Pending rows are applied oldest first by ``(created_at, id)``.
* A listing that fails is retried on the next tick; the run goes on.
* An effect whose terminal stamp fails (first try plus two retries) stops the
  tick, and the next tick retries that stamp before anything else, so no later
  control overtakes it.
* ``pause``/``resume`` are idempotent and applied without a claim.
* ``stop`` is idempotent too and applied without a claim: the target closes
  admission (and with ``now`` cancels the calls in flight) and opens the pause
  gate; a target without :meth:`SteeringTarget.stop` stamps
  ``rejected:unsupported-verb:stop``.
* ``message`` is at most once: claim ``applying:<claimant>``, check that an
  operation is still pending, append, stamp ``applied``. A target that defers the
  claim (:meth:`SteeringTarget.defers_message_claim`, an agent during a turn) has
  its message rows left pending until it stops deferring. A row already claimed is
  never touched again, not even by a later poller of the same session. A target
  that defers the stamp (:meth:`SteeringTarget.defers_message_stamp`) has it
  stamped ``applied`` only once an operation was invoked with the message
  (:meth:`ControlPoller.messages_delivered`); one no operation took by the end of
  the run is ``rejected:no-pending-ops`` (decision 36).
* Any other verb is ``rejected:unsupported-verb:<verb>``; an
  exception while applying is ``rejected:error:<message cut to 500>``.
* The poller state (``pending`` -> ``active`` -> ``stopped``) and a compact log of
  the controls it stamped live in the session's ``node_metadata``.
* The poller is the only writer of the session ``phase``: ``planning`` until the
  runner calls :meth:`ControlPoller.start_executing`, then ``executing``, and
  ``paused`` while the gate is closed.
* When the run ends, one last pass stamps the rows that arrived too late to have
  any effect, so no row the run accepted stays pending for ever.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from steerflow import _faults
from steerflow.errors import SteerflowError
from steerflow.state import ControlRow, Phase, StateDB, this_host

__all__ = [
    "CONTROL_LOG_MAX",
    "DEFAULT_POLL_S",
    "POLL_ENV",
    "ControlPoller",
    "PollerState",
    "SteeringTarget",
    "poll_interval",
]

_log = logging.getLogger(__name__)

POLL_ENV = "STEERFLOW_CONTROL_POLL_S"
DEFAULT_POLL_S = 0.05
_MIN_POLL_S = 0.001
# Re-list pending rows at least this often even when data_version says nothing changed.
_FORCED_LIST_S = 2.0
# The same safety net where the backend notifies (PostgreSQL LISTEN): an insert wakes the
# poller and a reconnected listener wakes every poller, so the listing only covers a
# notification lost some other way. At 2 s it was most of a 1,000-flow fleet's DB round
# trips and a quarter of its CPU (decision 124, benchmarks/fleet_pg.py).
_FORCED_LIST_NOTIFIED_S = 20.0
# How long the end of a run waits for the watcher thread (stuck in a read at worst; a daemon).
_WATCH_JOIN_S = 5.0
_STAMP_ATTEMPTS = 3  # the first try and two retries (D2)
_ERROR_MAX = 500  # characters of an exception message kept in ``rejected:error:<message>``
CONTROL_LOG_MAX = 50
"""How many of the most recent stamped controls ``node_metadata["control_log"]`` keeps."""

PollerState = Literal["pending", "active", "stopped"]


class SteeringTarget(abc.ABC):
    """What the poller may do to the live flow.

    Every method is called on the event loop, synchronously, so a check and the
    effect that follows it (``has_pending_operation`` then ``add_operator_message``)
    cannot be separated by an operation starting.
    """

    @abc.abstractmethod
    def pause(self) -> None:
        """Close the pause gate (idempotent)."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Open the pause gate (idempotent)."""

    @abc.abstractmethod
    def has_pending_operation(self) -> bool:
        """True if an operation has not started yet (or the plan is still being made)."""

    @abc.abstractmethod
    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        """Append one message to the shared context's operator messages."""

    def defers_message_stamp(self) -> bool:
        """True if ``applied`` waits until an operation is invoked with the message.

        The target then reports deliveries to :meth:`ControlPoller.messages_delivered`.
        """
        return False

    def defers_message_claim(self) -> bool:
        """True while a message row should stay pending (unclaimed) for now.

        An agent renders messages only into the turn that starts after the running one
        ends, so it claims them then, not while that turn runs (issue 26): a process
        that dies meanwhile leaves them pending, for a resume to deliver, instead of
        claimed and lost. The run's last pass claims (and refuses) them regardless.
        """
        return False

    def stop(self, *, now: bool, reason: str | None, control_id: str) -> None:
        """``ctl stop``: admit nothing new (``now``: also cancel the calls in flight).

        Idempotent; it also ends a pause. A target that cannot stop keeps this
        default and the row is ``rejected:unsupported-verb:stop``.
        """
        raise NotImplementedError

    def decide_approval(
        self, verb: str, payload: dict[str, Any], *, control_id: str, sender: str | None
    ) -> str | None:
        """``ctl approve``/``ctl deny`` (issue 41): the result to stamp, or None.

        None: the decision was taken, and is stamped ``applied`` once journaled
        (:meth:`ControlPoller.decision_journaled`). A target without approvals keeps this
        default (``rejected:unsupported-verb:<verb>``).
        """
        raise NotImplementedError

    def set_budget(self, *, max_cost: float | None, max_tokens: int | None) -> str:
        """``ctl budget``: change the caps given (None keeps one); the result to stamp.

        A target without a budget keeps this default (``rejected:unsupported-verb:budget``).
        """
        raise NotImplementedError

    def is_paused(self) -> bool | None:
        """Whether the gate is closed, or ``None`` when the target cannot tell.

        With ``None`` the poller derives the phase from the pause and resume
        controls it applied itself.
        """
        return None


def _positive(value: object, *, whole: bool) -> bool:
    """None, or a positive finite number (``whole``: an integer), never a bool."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        return False
    return math.isfinite(value) and value > 0


def poll_interval() -> float:
    """The poll interval from ``STEERFLOW_CONTROL_POLL_S`` (default 0.05 s).

    A value that is not a positive number falls back to the default.
    """
    raw = os.environ.get(POLL_ENV, "").strip()
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_POLL_S
    if not value > 0 or value == float("inf"):
        return DEFAULT_POLL_S
    return max(value, _MIN_POLL_S)


def _error_result(exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    return f"rejected:error:{message[:_ERROR_MAX]}"


@dataclass(frozen=True)
class _Unstamped:
    """An effect that happened (or a verdict that was reached) but is not stamped yet."""

    row: ControlRow
    result: str


class ControlPoller:
    """Applies one session's pause, resume and message rows in ``(created_at, id)`` order.

    Args:
        home: The steerflow home whose state DB holds the rows.
        session_id: The only session whose rows this poller consumes.
        target: The live flow.
        interval: Seconds between ticks; default from :func:`poll_interval`.
        db: Use this open database instead of opening one (tests); the poller
            then leaves it open when it stops.
        forced_list: Seconds after which pending rows are listed (and an idle loop
            woken) even though ``data_version`` did not change. Tests raise it so
            that only a watcher wake-up or a due retry can explain a prompt tick.
            Default: 2 s while polling, 20 s once the backend's notifications are in
            effect.

    Attributes:
        state: ``pending`` until the first tick, ``active`` while ticking,
            ``stopped`` once :meth:`run` has returned (mirrored into
            ``node_metadata["poller"]``).
        executing: True once the runner called :meth:`start_executing` (the
            phase leaves ``planning``).
        claimant: What ``applying:<claimant>`` names: host, pid and executor.
    """

    def __init__(
        self,
        home: Path,
        session_id: str,
        target: SteeringTarget,
        *,
        interval: float | None = None,
        db: StateDB | None = None,
        forced_list: float | None = None,
    ) -> None:
        self.home = home
        self.session_id = session_id
        self.target = target
        self.interval = poll_interval() if interval is None else max(interval, _MIN_POLL_S)
        self.claimant = f"{this_host()}:{os.getpid()}:flow-executor:{session_id[:12]}"
        self.forced_list = _FORCED_LIST_S if forced_list is None else forced_list
        self._forced_default = forced_list is None
        self.state: PollerState = "pending"
        self._executing = False
        self._paused_by_controls = False
        self._db = db
        self._owns_db = db is None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._retry_soon = False
        self._draining = False
        self._unstamped: list[_Unstamped] = []
        self._awaiting: dict[str, ControlRow] = {}  # appended, stamp deferred to delivery
        self._deciding: dict[str, ControlRow] = {}  # decisions taken, not yet journaled
        self._catch_up: list[asyncio.Future[None]] = []  # callers of catch_up() not yet served
        self._log: list[dict[str, Any]] = []
        self._log_dirty = False
        self._state_written: PollerState | None = None
        self._phase_written: Phase | None = "planning"  # a session starts out planning
        self._phase_lock = asyncio.Lock()
        self._last_version: int | None = None
        self._last_list = float("-inf")
        self.ticks = 0
        self.listings = 0
        self.open_failures = 0
        #: ``(verb, control_id, sender, result)`` once this poller stamped a row (traces:
        #: a span event per control, with its sender; decision 384). Must not block.
        self.on_stamped: list[Callable[[str, str, str | None, str], None]] = []

    # -- what the runner sees -------------------------------------------------------------

    @property
    def executing(self) -> bool:
        """True once the executor runs; the phase is then ``executing`` (or ``paused``)."""
        return self._executing

    @executing.setter
    def executing(self, value: bool) -> None:
        self._executing = value
        # Write the phase again at the next tick even if we think it is current, so
        # a write by anyone else (an older runner) cannot leave it stale.
        self._phase_written = None
        self._wake.set()

    async def start_executing(self) -> None:
        """The executor is about to run: publish ``executing`` (or ``paused``) before it does.

        The poller is the only writer of ``sessions.phase``; the runner calls this
        instead of writing it. Before the poller's database is open, its first tick
        writes the phase.
        """
        self.executing = True
        db = self._db
        if db is not None and not self._draining and self.state != "stopped":
            try:
                await self._sync_phase(db)
            except SteerflowError as exc:
                # No retry flag: the setter above woke the loop (and left the phase unwritten),
                # and that tick's phase sync queues behind this one on the lock, so it writes
                # the phase again; before run() the first tick writes it.
                _log.warning("control poller could not write the phase: %s", exc)

    @property
    def paused(self) -> bool:
        """Whether the gate is closed, as far as the poller can tell."""
        told = self.target.is_paused()
        return self._paused_by_controls if told is None else told

    def messages_delivered(self, control_ids: list[str | None]) -> None:
        """An operation was invoked with these messages: stamp their rows ``applied``.

        Called on the event loop; the stamps are written by the next tick, in order.
        """
        for control_id in control_ids:
            row = self._awaiting.pop(control_id, None) if control_id else None
            if row is not None:
                self._unstamped.append(_Unstamped(row, "applied"))
                self._wake.set()

    def decision_journaled(self, control_id: str) -> None:
        """An approval decision's journal record is durable: stamp its row ``applied``."""
        row = self._deciding.pop(control_id, None)
        if row is not None:
            self._unstamped.append(_Unstamped(row, "applied"))
            self._wake.set()

    def messages_rejected(self, control_ids: list[str | None], result: str) -> None:
        """No operation will take these delivered messages: stamp their rows ``result``.

        For a consumer with its own reason (an agent out of turns: ``rejected:max-turns``);
        without this call the end of the run stamps them ``rejected:no-pending-ops``.
        """
        for control_id in control_ids:
            row = self._awaiting.pop(control_id, None) if control_id else None
            if row is not None:
                self._unstamped.append(_Unstamped(row, result))
                self._wake.set()

    async def catch_up(self) -> None:
        """Return once a tick that began after this call has listed the pending rows.

        A consumer deciding "no message is pending" (an agent at the end of a turn)
        calls it first, so a row committed just before is claimed now rather than
        after the decision. Returns at once when the poller has stopped.
        """
        if self._stopping.is_set() or self.state == "stopped":
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._catch_up.append(waiter)
        self._wake.set()
        await waiter

    def _serve_catch_up(self, waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def control_log(self) -> list[dict[str, Any]]:
        """The compact log of stamped controls (newest last, at most :data:`CONTROL_LOG_MAX`)."""
        return list(self._log)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Tick until :meth:`stop`, then make one last pass over rows that came too late.

        While idle the event loop is not woken at all: a watcher thread reads
        ``data_version`` every interval and wakes the loop only on a change (or
        every :data:`_FORCED_LIST_S` (:data:`_FORCED_LIST_NOTIFIED_S` where the backend
        notifies), or every interval while a retry is due).
        """
        loop = asyncio.get_running_loop()
        watcher: _Watcher | None = None
        unwatch: Callable[[], None] | None = None
        try:
            while not self._stopping.is_set():
                waiters, self._catch_up = self._catch_up, []
                if await self._ensure_db():
                    if watcher is None and unwatch is None and self._db is not None:
                        unwatch, watcher = await self._watch(self._db, self._waker(loop))
                    await self._guarded_tick(force=bool(waiters))
                else:
                    self._retry_soon = True
                self._serve_catch_up(waiters)
                await self._wait()
            self._draining = True
            for _ in range(_STAMP_ATTEMPTS):  # the final pass, retried while a stamp is due
                if await self._ensure_db():
                    await self._guarded_tick(force=True)
                    if not self._retry_soon:
                        break
                await asyncio.sleep(self.interval)
        finally:
            self.state = "stopped"
            self._serve_catch_up(self._catch_up)
            self._catch_up = []
            if unwatch is not None:
                unwatch()
            if watcher is not None:
                watcher.stop()
                await asyncio.to_thread(watcher.join, _WATCH_JOIN_S)
            await self._close()

    async def _watch(
        self, db: StateDB, wake: Callable[[], None]
    ) -> tuple[Callable[[], None] | None, _Watcher | None]:
        """Be woken by the backend's notifications, else by a ``data_version`` watcher."""
        try:
            unwatch = await asyncio.to_thread(db.watch_controls, self.session_id, wake)
        except SteerflowError as exc:  # no LISTEN now: poll, as on SQLite
            _log.warning("control poller cannot listen for controls (polling): %s", exc)
            unwatch = None
        if unwatch is not None:
            if self._forced_default:
                self.forced_list = _FORCED_LIST_NOTIFIED_S
            return unwatch, None
        watcher = _Watcher(db, self.interval, wake)
        watcher.start()
        return None, watcher

    async def stop(self) -> None:
        """Ask the loop to end after the current tick (and its final pass)."""
        self._stopping.set()
        self._wake.set()

    def _waker(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._wake.set)

        return wake

    async def _wait(self) -> None:
        timeout = self.interval if self._retry_soon else self.forced_list
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        self._wake.clear()

    async def _ensure_db(self) -> bool:
        if self._db is None:
            try:
                # The runner created the DB before starting us: never create one here.
                self._db = await asyncio.to_thread(StateDB.open, self.home, create=False)
            except (SteerflowError, OSError) as exc:
                self.open_failures += 1
                _log.warning("control poller cannot open the state DB (retrying): %s", exc)
                return False
        return True  # the tick that follows makes the poller ``active``

    async def _guarded_tick(self, *, force: bool = False) -> None:
        try:
            await self.tick(force=force)
        except Exception:  # a bug in one tick must not end live control for the run
            _log.exception("control poller tick failed; retrying next tick")
            self._last_version = None
            self._retry_soon = True

    async def _close(self) -> None:
        db = self._db
        if db is None:
            return
        with contextlib.suppress(SteerflowError):
            await self._write_meta()
        if self._owns_db:
            self._db = None
            await asyncio.to_thread(db.close)

    # -- one tick -------------------------------------------------------------------------

    async def tick(self, *, force: bool = False) -> int:
        """One pass: finish unstamped effects, then apply new pending rows in order.

        Args:
            force: List pending rows even if ``data_version`` did not change.

        Returns:
            How many rows were stamped in this tick.
        """
        db = self._db
        if db is None:
            raise RuntimeError("ControlPoller.tick() before the state DB is open")
        if self.state == "pending":
            self.state = "active"
        self.ticks += 1
        self._retry_soon = False
        try:
            return await self._tick(db, force=force)
        finally:
            try:
                await self._write_meta()
            except SteerflowError as exc:
                _log.warning("control poller could not update node_metadata: %s", exc)
                self._retry_soon = True

    async def _tick(self, db: StateDB, *, force: bool) -> int:
        stamped = 0
        if self._draining and self._awaiting:
            # The run is over: no operation will take these messages any more.
            rows = sorted(self._awaiting.values(), key=lambda r: (r.created_at, r.id))
            self._unstamped += [_Unstamped(r, "rejected:no-pending-ops") for r in rows]
            self._awaiting.clear()
        while self._unstamped:
            # An earlier effect still lacks its stamp: nothing may overtake it.
            first = self._unstamped[0]
            if not await self._finalize(db, first.row, first.result):
                self._retry_soon = True
                return stamped
            self._unstamped.pop(0)
            stamped += 1
        try:
            version = await asyncio.to_thread(db.data_version)
        except SteerflowError:
            self._retry_soon = True
            return stamped
        now = time.monotonic()
        unchanged = version == self._last_version and now - self._last_list < self.forced_list
        if unchanged and not force:
            return stamped
        try:
            rows = await asyncio.to_thread(db.list_pending_controls, self.session_id)
        except SteerflowError as exc:
            # Retried next tick (the version stays unrecorded); the run goes on.
            _log.warning("control poller could not list pending controls: %s", exc)
            self._retry_soon = True
            return stamped
        self.listings += 1
        self._last_version, self._last_list = version, now
        for row in rows:
            try:
                outcome = await self._apply(db, row)
            except _ClaimUncertainError:
                self._last_version = None  # list again next tick; nothing overtakes this row
                self._retry_soon = True
                return stamped
            if outcome is None:
                continue  # claimed or stamped by someone else: not ours to touch
            if row.verb in ("pause", "resume", "stop") and outcome == "applied":
                # The phase follows the gate, so it is written before the row is stamped:
                # whoever sees the stamp also sees the phase (end of tick retries a failure).
                with contextlib.suppress(SteerflowError):
                    await self._sync_phase(db)
            if not await self._finalize(db, row, outcome):
                # An effect we could not stamp: stop so no later row overtakes it.
                self._unstamped.append(_Unstamped(row, outcome))
                self._last_version = None
                self._retry_soon = True
                return stamped
            stamped += 1
        return stamped

    async def _apply(self, db: StateDB, row: ControlRow) -> str | None:
        """Apply one row; return the result to stamp, or ``None`` to leave the row alone."""
        if row.verb in ("pause", "resume"):
            if self._draining:
                return "rejected:run-ended"
            try:
                if row.verb == "pause":
                    self.target.pause()
                else:
                    self.target.resume()
            except Exception as exc:  # the row records the failure; the run goes on
                return _error_result(exc)
            self._paused_by_controls = row.verb == "pause"
            return "applied"
        if row.verb == "message":
            if not self._draining and self.target.defers_message_claim():
                return None  # left pending: claimed when an operation can render it
            return await self._apply_message(db, row)
        if row.verb == "stop":
            return self._apply_stop(row)
        if row.verb == "budget":
            return self._apply_budget(row)
        if row.verb in ("approve", "deny"):
            return await self._apply_decision(db, row)
        return f"rejected:unsupported-verb:{row.verb}"

    async def _apply_decision(self, db: StateDB, row: ControlRow) -> str | None:
        """At most once: claim, hand to the target; stamped once the decision is journaled.

        A decision taken and not yet journaled when the run ends stays ``applying``: the
        resume reads it from the chain and applies it (issue 41).
        """
        try:
            claimed = await asyncio.to_thread(db.claim_control, row.id, self.claimant)
        except SteerflowError:
            current = await asyncio.to_thread(db.get_control, row.id)
            if current is None or current.result != f"applying:{self.claimant}":
                raise _ClaimUncertainError(row.id) from None
            claimed = True
        if not claimed:
            return None
        payload = row.payload if isinstance(row.payload, dict) else {}
        try:
            result = self.target.decide_approval(
                row.verb, payload, control_id=row.id, sender=row.sender
            )
        except NotImplementedError:
            return f"rejected:unsupported-verb:{row.verb}"
        except Exception as exc:  # the row records the failure; the run goes on
            return _error_result(exc)
        if result is None:
            self._deciding[row.id] = row
        return result

    def _apply_budget(self, row: ControlRow) -> str:
        if self._draining:
            return "rejected:run-ended"
        payload = row.payload if isinstance(row.payload, dict) else {}
        cost, tokens = payload.get("max_cost"), payload.get("max_tokens")
        valid = _positive(cost, whole=False) and _positive(tokens, whole=True)
        if not valid or (cost is None and tokens is None):
            return "rejected:invalid-budget"
        try:
            return self.target.set_budget(
                max_cost=None if cost is None else float(cost), max_tokens=tokens
            )
        except NotImplementedError:
            return "rejected:unsupported-verb:budget"
        except Exception as exc:  # the row records the failure; the run goes on
            return _error_result(exc)

    def _apply_stop(self, row: ControlRow) -> str:
        if self._draining:
            return "rejected:run-ended"
        payload = row.payload if isinstance(row.payload, dict) else {}
        reason = payload.get("reason")
        try:
            self.target.stop(
                now=payload.get("now") is True,
                reason=reason if isinstance(reason, str) or reason is None else str(reason),
                control_id=row.id,
            )
        except NotImplementedError:
            return "rejected:unsupported-verb:stop"
        except Exception as exc:  # the row records the failure; the run goes on
            return _error_result(exc)
        self._paused_by_controls = False  # a stop ends a pause
        return "applied"

    async def _apply_message(self, db: StateDB, row: ControlRow) -> str | None:
        try:
            claimed = await asyncio.to_thread(db.claim_control, row.id, self.claimant)
        except SteerflowError as exc:
            # Unknown whether the claim landed: look again rather than guess.
            _log.warning("control poller could not claim %s: %s", row.id, exc)
            return await self._after_uncertain_claim(db, row)
        if not claimed:
            return None  # someone else holds it; never touch a claimed or stamped row
        return self._deliver(row)

    async def _after_uncertain_claim(self, db: StateDB, row: ControlRow) -> str | None:
        try:
            current = await asyncio.to_thread(db.get_control, row.id)
        except SteerflowError:
            current = None
        if current is not None and current.result == f"applying:{self.claimant}":
            return self._deliver(row)  # our claim did land
        # Not claimed (or not known to be): raise so the tick stops and the row is
        # listed again next tick, before any later control.
        raise _ClaimUncertainError(row.id)

    def _deliver(self, row: ControlRow) -> str | None:
        _faults.seam("control-claim", "after")
        if self._draining:
            return "rejected:no-pending-ops"
        try:
            # No await between the check and the append: no operation can start between them.
            if not self.target.has_pending_operation():
                return "rejected:no-pending-ops"
            payload = row.payload if isinstance(row.payload, dict) else {}
            text = payload.get("text", "")
            self.target.add_operator_message(
                text if isinstance(text, str) else str(text), ts=time.time(), control_id=row.id
            )
        except Exception as exc:  # the row records any apply failure, the run goes on
            return _error_result(exc)
        if self.target.defers_message_stamp():
            self._awaiting[row.id] = row  # stamped when an operation is invoked with it
            return None
        _faults.seam("control-finalize", "before")
        return "applied"

    async def _finalize(self, db: StateDB, row: ControlRow, result: str) -> bool:
        """Stamp ``result``; True once stamped (by us, or already by someone else)."""
        for attempt in range(_STAMP_ATTEMPTS):
            try:
                changed = await asyncio.to_thread(
                    lambda: db.finalize_control(row.id, result, claimant=self.claimant)
                )
            except SteerflowError as exc:
                _log.warning(
                    "control poller could not stamp %s (attempt %d): %s", row.id, attempt + 1, exc
                )
                continue
            now = time.time()
            entry: dict[str, Any] = {"id": row.id, "verb": row.verb, "result": result, "at": now}
            if not changed:
                entry["result"] = "stamped-elsewhere"
            else:
                for callback in list(self.on_stamped):
                    callback(row.verb, row.id, row.sender, result)
            self._log.append(entry)
            del self._log[:-CONTROL_LOG_MAX]
            self._log_dirty = True
            return True
        return False

    # -- node_metadata and phase ----------------------------------------------------------

    def _desired_phase(self) -> Phase:
        if self.paused:
            return "paused"
        return "executing" if self._executing else "planning"

    async def _write_meta(self) -> None:
        db = self._db
        if db is None:
            return
        patch: dict[str, Any] = {}
        if self._state_written != self.state:
            patch["poller"] = self.state
        if self._log_dirty:
            patch["control_log"] = list(self._log)
        if patch:
            await asyncio.to_thread(db.update_node_metadata, self.session_id, patch)
            self._state_written = patch.get("poller", self._state_written)
            self._log_dirty = False
        await self._sync_phase(db)

    async def _sync_phase(self, db: StateDB) -> None:
        if self.state == "stopped":
            return
        if self._draining and not (self._executing and self._phase_written is None):
            # Once the run is over the phase stays as last published, unless the run
            # ended before the poller could publish that execution had started.
            return
        # A tick and start_executing may both sync: deciding and writing under one lock
        # means the last write always carries the freshest phase.
        async with self._phase_lock:
            phase = self._desired_phase()
            if phase != self._phase_written:
                await asyncio.to_thread(db.set_session_phase, self.session_id, phase)
                self._phase_written = phase


class _Watcher:
    """A daemon thread that reads ``data_version`` every interval and wakes the loop on a change.

    Keeping the cheap check off the event loop means an idle flow's loop is not
    woken 20 times a second, and a check that has to wait on a lock never blocks it.
    """

    def __init__(self, db: StateDB, interval: float, wake: Callable[[], None]) -> None:
        self._db = db
        self._interval = interval
        self._wake = wake
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="steerflow-control-watch", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _watch(self) -> None:
        last: int | None = None
        while not self._stop.wait(self._interval):
            try:
                version: int | None = self._db.data_version()
            except Exception:  # the loop's tick reports and retries; keep watching
                version = None
            if version is None or version != last:
                last = version
                self._wake()


class _ClaimUncertainError(SteerflowError):
    """A claim whose outcome is unknown; the tick stops and the row is looked at again."""
