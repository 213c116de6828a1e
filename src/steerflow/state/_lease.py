"""How long a session's lease lasts, and whether a session still holds it.

A running session's ownership is a lease in its ``sessions`` row (docs/decisions.md,
decision 120): ``lease_epoch`` is the fencing token its owner writes under,
``lease_expires`` the moment the lease runs out by the database's own clock
(``StateBackend.clock_sql``), renewed by the owner's heartbeat. A resume takes over
only a lease that this clock says has run out, or whose owner is provably dead on the
resuming host, so clock skew between hosts cannot cause a takeover.
"""

from __future__ import annotations

import math
import os

from steerflow.errors import InvalidValueError, quote_input
from steerflow.state._owner import HEARTBEAT_STALE_S, owner_alive, this_host
from steerflow.state._schema import SessionRow

__all__ = [
    "DEFAULT_LEASE_S",
    "LEASE_ENV",
    "MAX_LEASE_S",
    "MIN_LEASE_S",
    "dead_on_this_host",
    "holds_lease",
    "lease_seconds",
]

LEASE_ENV = "STEERFLOW_LEASE_S"
"""Overrides the lease duration, in seconds (tests shorten it; a fleet may lengthen it)."""

DEFAULT_LEASE_S = HEARTBEAT_STALE_S
"""The lease an owner takes and renews: the window another host waited before, too."""

MIN_LEASE_S = 0.5
"""Shortest lease accepted: below it the renewal round trips would be most of the lease."""

MAX_LEASE_S = 3600.0
"""Longest lease accepted (an hour): how long a resume on another host may have to wait
for a dead owner's lease to run out (decision 248)."""


def lease_seconds() -> float:
    """The lease duration: ``STEERFLOW_LEASE_S`` when set, else :data:`DEFAULT_LEASE_S`.

    Raises:
        InvalidValueError: The variable is not a number of seconds from
            :data:`MIN_LEASE_S` to :data:`MAX_LEASE_S` (a usage error, exit 2).
    """
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not MIN_LEASE_S <= value <= MAX_LEASE_S:
        raise InvalidValueError(
            LEASE_ENV,
            f"{quote_input(raw)} is not a number of seconds from {MIN_LEASE_S:g} to "
            f"{MAX_LEASE_S:g}",
        )
    return value


def _on_this_host(row: SessionRow) -> bool:
    return (
        row.owner_host is not None and row.owner_pid is not None and (row.owner_host == this_host())
    )


def dead_on_this_host(row: SessionRow) -> bool:
    """Whether ``row``'s owner ran on this host and its process is gone (or was reused)."""
    return _on_this_host(row) and not owner_alive(
        row.owner_host, row.owner_pid, row.owner_started, None
    )


def holds_lease(row: SessionRow, db_now: float) -> bool:
    """Whether ``row``'s owner must still be taken as holding the session, at ``db_now``.

    Only a ``running`` row can. On the owner's own host the process table decides, as
    before: a stopped (``SIGSTOP``) process still exists and keeps its session. From
    another host the lease decides, by the database's clock: held until
    ``lease_expires`` (a row written before leases existed: ``heartbeat_at`` plus the
    heartbeat window).

    Args:
        row: The session row, read in the caller's transaction.
        db_now: The database's clock (``StateBackend.clock_sql``) in that transaction.
    """
    if row.status != "running":
        return False
    if _on_this_host(row):
        return not dead_on_this_host(row)
    expires = row.lease_expires
    if expires is None and row.heartbeat_at is not None:
        expires = row.heartbeat_at + HEARTBEAT_STALE_S
    return expires is not None and db_now <= expires
