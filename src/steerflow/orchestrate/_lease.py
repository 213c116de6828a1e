"""The lease a live run holds on its session, renewed by the heartbeat.

Every admission and every checkpoint record checks it (docs/decisions.md, decisions
120-122). A DB round trip per admission would cost a 10,000-node run 10,000 round trips, so the
check is amortized: a renewal sent at local time ``t`` that the database accepts sets
``lease_expires`` to its own clock at the statement plus the lease, and the statement
ran after ``t``; no takeover can therefore happen before ``t + lease`` in real time. The
keeper takes the lease as held until ``t + lease - margin`` on a clock that keeps
counting through a suspend (``CLOCK_BOOTTIME``), and only past that deadline does an
admission wait for a renewal from the database. After a stall longer than what was left
of the lease, the deadline has passed, so no new call starts before a DB check: what a
stalled owner can still do on waking is finish the calls already in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from steerflow.errors import (
    DatabaseBusyError,
    LeaseLostError,
    RefusedError,
    StateDBLostError,
    SteerflowError,
)
from steerflow.state import HEARTBEAT_STALE_S, StateDB, lease_seconds

__all__ = ["LeaseKeeper", "LeaseLoss", "lease_clock", "loss_error"]

_RETRY_S = 0.25  # after a failed renewal (busy, or a PostgreSQL server away for a moment)
_MIN_MARGIN_S = 0.25
_MARGIN_SHARE = 0.1  # of the lease: clock-rate drift and small steps of the DB's clock
_RENEWALS_PER_LEASE = 4
# Unconfirmed for this many leases after the last renewal was sent: whoever could reach
# the database may have taken the run over; this process can no longer act for it.
_UNREACHABLE_LEASES = 2


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _choose_clock() -> Callable[[], float]:
    # CLOCK_MONOTONIC stops while the machine is suspended; a laptop that slept through
    # its lease would wake up believing the lease fresh. CLOCK_BOOTTIME keeps counting.
    try:
        _boottime()
    except (AttributeError, OSError):
        return time.monotonic
    return _boottime


lease_clock: Callable[[], float] = _choose_clock()
"""The clock lease deadlines are kept on (``CLOCK_BOOTTIME`` where there is one)."""


@dataclass(frozen=True)
class LeaseLoss:
    """Why this process may no longer act for its session.

    Attributes:
        error: :class:`LeaseLostError` (a takeover) or :class:`StateDBLostError`.
        unreachable: The database could not be reached for longer than the lease.
    """

    error: LeaseLostError | StateDBLostError
    unreachable: bool = False

    @property
    def taken_over(self) -> bool:
        """Another session owns the run now: nothing more may be recorded as the run's."""
        return isinstance(self.error, LeaseLostError)

    @property
    def reason(self) -> str:
        """The admission-closed reason: ``taken-over`` or ``state-db-lost``."""
        return "taken-over" if self.taken_over else "state-db-lost"

    @property
    def may_record(self) -> bool:
        """Whether outcomes of calls already in flight may still go to the checkpoint.

        Only when the database itself went away (deleted, replaced, unwritable): nobody
        can hold the lease through it, and the checkpoint is what a resume starts from.
        Not after a takeover, nor while the database is unreachable (a takeover cannot
        be ruled out).
        """
        return not self.taken_over and not self.unreachable


class LeaseKeeper:
    """Renews a session's lease and answers, cheaply, whether it is still held.

    Args:
        db: The run's state database.
        session_id: The session whose lease this is.
        epoch: Its fencing token (``SessionRow.lease_epoch``).
        lease_s: The lease duration (default: ``STEERFLOW_LEASE_S``, else 30 s).
    """

    def __init__(
        self, db: StateDB, session_id: str, epoch: int, *, lease_s: float | None = None
    ) -> None:
        self.db = db
        self.session_id = session_id
        self.epoch = epoch
        self.lease_s = lease_seconds() if lease_s is None else lease_s
        self.margin_s = min(max(self.lease_s * _MARGIN_SHARE, _MIN_MARGIN_S), self.lease_s / 2)
        # The renewal is also the heartbeat other hosts judge liveness by (30 s window):
        # a long lease must not make it rarer than a quarter of that window.
        self.interval_s = min(self.lease_s, HEARTBEAT_STALE_S) / _RENEWALS_PER_LEASE
        self.valid_until = -math.inf  # nothing is admitted before the first renewal
        self.lost: LeaseLoss | None = None
        self.on_lost: list[Callable[[LeaseLoss], None]] = []
        #: Renewals written, and how many of them an admission or record waited for.
        self.renewals = 0
        self.waited = 0
        #: Outcomes :meth:`may_record` refused (not recorded as the run's).
        self.withheld = 0
        self._last_sent = lease_clock()
        self._lock = asyncio.Lock()

    def fresh(self) -> bool:
        """True while the lease is known held: no DB round trip, safe on the hot path."""
        return self.lost is None and lease_clock() < self.valid_until

    async def hold(self) -> bool:
        """Whether the lease is held, confirmed by the database once the deadline passed.

        Returns ``False`` once it is lost (the loss callbacks have run by then).
        """
        while self.lost is None:
            if lease_clock() < self.valid_until:
                return True
            self.waited += 1
            if not await self._renew_now():
                await asyncio.sleep(_RETRY_S)
        return False

    async def may_record(self) -> bool:
        """Whether an outcome may be recorded as the run's (see :attr:`LeaseLoss.may_record`)."""
        if await self.hold():
            return True
        if self.lost is not None and self.lost.may_record:
            return True
        self.withheld += 1
        return False

    def fenced(self, error: LeaseLostError | StateDBLostError) -> None:
        """A fenced write found the lease gone before the keeper did."""
        self._lose(error)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew every quarter lease, at most every 7.5 s (sooner after a failure).

        Until ``stop`` is set or the lease is lost.
        """
        while not stop.is_set() and self.lost is None:
            ok = await self._renew_now(periodic=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s if ok else _RETRY_S):
                    await stop.wait()

    async def _renew_now(self, *, periodic: bool = False) -> bool:
        async with self._lock:  # many waiters after a stall: one round trip
            if self.fresh() and not periodic:
                return True  # renewed by another waiter meanwhile
            if self.lost is not None:
                return False
            return await self._renew_once()

    async def _renew_once(self) -> bool:
        sent = lease_clock()
        try:
            await asyncio.to_thread(self.db.renew_lease, self.session_id, self.epoch, self.lease_s)
        except (LeaseLostError, StateDBLostError) as exc:
            self._lose(exc)
            return False
        except SteerflowError as exc:
            if not self._transient(exc):
                self._lose(StateDBLostError(f"the state database {self.db.location}: {exc}"))
            elif sent - self._last_sent > _UNREACHABLE_LEASES * self.lease_s:
                message = (
                    f"cannot reach the state database {self.db.location} to renew the lease"
                    f" of session {self.session_id} for {sent - self._last_sent:.0f} s: {exc}"
                )
                self._lose(StateDBLostError(message), unreachable=True)
            return False
        self.renewals += 1
        self._last_sent = sent
        if self.lost is None:
            self.valid_until = sent + self.lease_s - self.margin_s
        return True

    def _transient(self, exc: SteerflowError) -> bool:
        """A failure worth retrying: a busy lock, or (PostgreSQL) a server away."""
        if isinstance(exc, DatabaseBusyError):
            return True
        if isinstance(exc, RefusedError):  # read-only
            return False
        # On SQLite any other error is the file's own (I/O, corruption), not the network.
        return self.db.path is None

    def _lose(self, error: LeaseLostError | StateDBLostError, *, unreachable: bool = False) -> None:
        if self.lost is not None:
            return
        self.lost = LeaseLoss(error, unreachable)
        self.valid_until = -math.inf
        for callback in list(self.on_lost):
            callback(self.lost)


def loss_error(
    loss: LeaseLoss,
    *,
    run_id: str | None,
    session_id: str,
    cancelled: int,
    withheld: int,
    completed: int,
    checkpoint: str | None,
) -> LeaseLostError | StateDBLostError:
    """The one-line error a run that lost its lease ends with.

    A takeover is :class:`LeaseLostError` (exit 3, ``taken over``: CONTRACT §11); a lost
    database is :class:`StateDBLostError`.
    """
    error = loss.error
    if isinstance(error, LeaseLostError):
        out: LeaseLostError | StateDBLostError = LeaseLostError(
            f"{error}; this process started no call after it learned so, and did not record"
            f" {cancelled + withheld} call(s) it had in flight as the run's",
            session_id=error.session_id,
            new_session_id=error.new_session_id,
            new_host=error.new_host,
        )
    else:
        out = StateDBLostError(
            f"{error}; run {run_id} (session {session_id}) stopped admitting: its {completed}"
            f" completed node(s) are in its checkpoint {checkpoint}, to resume from"
            f" (steerflow resume {run_id})"
        )
    out.source_ids = {"session_id": session_id, "run_id": run_id}
    return out
