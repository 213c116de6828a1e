"""Which process owns a session, and whether that process is still alive.

A session row records its owner as ``(host, pid, start time)`` plus a
heartbeat. On the owner's own host the process table is the authority: the
owner is dead when the pid is gone, is a zombie, or now belongs to a process
that started at another time (pid reuse). From another host only the heartbeat
can be seen: the owner counts as dead once the heartbeat is older than
:data:`HEARTBEAT_STALE_S`.

Process start times come from ``/proc/<pid>/stat`` (field 22, clock ticks after
boot) plus the boot time from ``/proc/stat``, so :meth:`Owner.current` and the
liveness check compute them the same way. Where ``/proc`` is missing, start
times are unknown (``None``) and only the pid's existence is checked.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass
from typing import Protocol

from steerflow.state._vocab import SessionStatus

__all__ = [
    "HEARTBEAT_STALE_S",
    "HOST_ID_ENV",
    "START_TIME_TOLERANCE_S",
    "OwnedRow",
    "Owner",
    "effective_status",
    "owner_alive",
    "pid_alive",
    "process_start_time",
    "this_host",
]

HEARTBEAT_STALE_S = 30.0
"""Seconds after which a heartbeat from another host no longer proves its owner alive."""

START_TIME_TOLERANCE_S = 1.0
"""Largest start-time difference still taken as the same process (boot time is whole seconds)."""

_PROC = "/proc"

HOST_ID_ENV = "STEERFLOW_HOST_ID"
"""Overrides the host name a process records and compares (two "hosts" on one machine,
or machines whose host names collide on a shared state DB)."""


@functools.cache
def _boot_time() -> float | None:
    try:
        with open(os.path.join(_PROC, "stat"), encoding="ascii") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.cache
def _clock_ticks() -> int | None:
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None
    return ticks if ticks > 0 else None


def _read_proc_stat(pid: int) -> tuple[str, int] | None:
    """Return ``(state, starttime ticks)`` of ``pid`` from ``/proc``, or ``None``."""
    try:
        with open(os.path.join(_PROC, str(pid), "stat"), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name (field 2) is parenthesised and may itself hold spaces or ')'.
    fields = text[text.rfind(")") + 1 :].split()
    try:
        return fields[0], int(fields[19])  # field 3 (state) and field 22 (starttime)
    except (IndexError, ValueError):
        return None


def _have_proc() -> bool:
    return os.path.isdir(os.path.join(_PROC, "self"))


def process_start_time(pid: int) -> float | None:
    """Start time of process ``pid`` in epoch seconds, or ``None`` when unknown.

    Args:
        pid: Process id on this host.

    Returns:
        Boot time plus the process's start offset, or ``None`` when the process
        does not exist or ``/proc`` is not available.
    """
    stat = _read_proc_stat(pid)
    boot, ticks = _boot_time(), _clock_ticks()
    if stat is None or boot is None or ticks is None:
        return None
    return boot + stat[1] / ticks


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie.

    Args:
        pid: Process id on this host.
    """
    if pid <= 0:
        return False
    if _have_proc():
        stat = _read_proc_stat(pid)
        return stat is not None and stat[0] not in ("Z", "X", "x")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def this_host() -> str:
    """The host name recorded in ``owner_host``: ``STEERFLOW_HOST_ID``, else the host name.

    Only a row whose ``owner_host`` equals it is judged by the local process table;
    any other is judged by its heartbeat alone, never by a pid of this machine.
    """
    return os.environ.get(HOST_ID_ENV, "").strip() or socket.gethostname()


class OwnedRow(Protocol):
    """What :func:`effective_status` reads of a session row (``SessionRow`` has it all)."""

    @property
    def status(self) -> SessionStatus: ...
    @property
    def owner_host(self) -> str | None: ...
    @property
    def owner_pid(self) -> int | None: ...
    @property
    def owner_started(self) -> float | None: ...
    @property
    def heartbeat_at(self) -> float | None: ...


@dataclass(frozen=True)
class Owner:
    """The process that owns a session.

    Attributes:
        host: ``socket.gethostname()`` of the owning machine.
        pid: Process id on that host.
        started_at: Process start time in epoch seconds (guards against pid
            reuse), or ``None`` when it could not be determined.
    """

    host: str
    pid: int
    started_at: float | None

    @classmethod
    def current(cls) -> Owner:
        """The owner record of the calling process."""
        pid = os.getpid()
        return cls(host=this_host(), pid=pid, started_at=process_start_time(pid))


def owner_alive(
    host: str | None,
    pid: int | None,
    started_at: float | None,
    heartbeat_at: float | None,
    *,
    now: float | None = None,
) -> bool:
    """Whether a session's owner should still be taken as alive.

    Args:
        host: Recorded owner host, or ``None``.
        pid: Recorded owner pid, or ``None``.
        started_at: Recorded owner start time, or ``None``.
        heartbeat_at: Last heartbeat, or ``None``.
        now: Current epoch time (defaults to ``time.time()``), for the heartbeat rule.

    Returns:
        On this host: the pid exists, is not a zombie, and (when both start
        times are known) started within :data:`START_TIME_TOLERANCE_S` of
        ``started_at``. Elsewhere, or when no owner is recorded: the heartbeat is
        at most :data:`HEARTBEAT_STALE_S` old.
    """
    if host is not None and pid is not None and host == this_host():
        if not pid_alive(pid):
            return False
        if started_at is not None:
            actual = process_start_time(pid)
            if actual is not None and abs(actual - started_at) > START_TIME_TOLERANCE_S:
                return False
        return True
    if heartbeat_at is None:
        return False
    current = time.time() if now is None else now
    return current - heartbeat_at <= HEARTBEAT_STALE_S


def effective_status(row: OwnedRow, *, now: float | None = None) -> SessionStatus:
    """The status to report for a session, accounting for a dead owner.

    A row stored as ``running`` whose owner is no longer alive (see
    :func:`owner_alive`) is reported ``interrupted``; any other row is reported
    as stored.

    Args:
        row: The session row.
        now: Current epoch time for the heartbeat rule (defaults to ``time.time()``).
    """
    if row.status != "running":
        return row.status
    alive = owner_alive(row.owner_host, row.owner_pid, row.owner_started, row.heartbeat_at, now=now)
    return "running" if alive else "interrupted"
