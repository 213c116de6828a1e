"""The one PostgreSQL connection a process shares (docs/decisions.md, decision 360).

Before, a flow process held three server connections: its own, its control poller's and
the poller's ``LISTEN``; a default server (``max_connections=100``) filled at about 30
flows. Now every :class:`~steerflow.state._postgres.PostgresBackend` of one process with
the same URL and settings is a handle on one :class:`Link`: one connection, its
statements serialized by one lock (they are short: indexed reads, single-row writes,
lock waits bounded by ``lock_timeout``), its ``LISTEN`` issued on that same connection.

Notifications are never lost to a busy connection: the server queues them for the
session until the client reads, and psycopg hands every one it reads, during whatever
statement, to :meth:`Link._on_notify`. While the connection is idle a daemon thread
waits on its socket (``select``) *without* the lock; when bytes arrive it takes the lock
and runs one ``SELECT 1`` so psycopg reads them (a notification costs one round trip).

A connection the server dropped is replaced by the next statement that needs it, at
most once per backoff step (0.25 s doubling to 5 s): statements in between fail fast
with the last error, which every caller treats as transient (the lease keeper retries,
the poller lists again). The process says so once when the connection is lost and once
when it is back; on reconnecting the ``LISTEN`` is issued again and every subscriber is
woken, because inserts made while nobody listened sent their notifications to nobody.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from steerflow.errors import SteerflowError

if TYPE_CHECKING:
    import psycopg

__all__ = ["Link", "LinkKey", "acquire", "link_key", "release"]

_log = logging.getLogger("steerflow.state")

LinkKey = tuple[int, str, bool, float, int]
"""(pid, URL, read-only, busy timeout, 0 or a private number): what two shared backends share."""

_BACKOFF_FIRST_S = 0.25
_BACKOFF_MAX_S = 5.0
_IDLE_SLICE_S = 0.5  # how soon a released link's waiter thread notices and exits

_links: dict[LinkKey, Link] = {}
_private = itertools.count(1)
_links_guard = threading.Lock()


class Link:
    """One shared connection: its lock, its reconnect backoff and its notification fan-out.

    Args:
        location: The URL without its password, for messages.
        channel: The ``LISTEN`` channel of control inserts.
        connect: Opens a new connection with the backend's settings (raises
            :class:`SteerflowError` naming the server's reason).
        translate: Turns a psycopg error into the typed error of the backend.
    """

    def __init__(
        self,
        location: str,
        channel: str,
        connect: Callable[[], psycopg.Connection[Any]],
        translate: Callable[[], contextlib.AbstractContextManager[None]],
    ) -> None:
        self.location = location
        self.lock = threading.RLock()
        self.users = 0
        self.notified = 0
        self._channel = channel
        self._connect = connect
        self._translate = translate
        self._conn: psycopg.Connection[Any] | None = None
        self._listening = False
        self._subscribers: dict[int, tuple[str, Callable[[], None]]] = {}
        self._next_token = 0
        self._waiter: threading.Thread | None = None
        self._closed = threading.Event()
        self._lost_at: float | None = None
        self._retry_at = 0.0
        self._backoff = _BACKOFF_FIRST_S
        self._last_error: SteerflowError | None = None

    # -- the connection -------------------------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        """The live connection, replaced first if the server dropped it (hold :attr:`lock`).

        Raises:
            SteerflowError: The server cannot be reached now (the same error, fast, until
                the next backoff step).
        """
        if self._closed.is_set():
            raise SteerflowError(f"state database is closed: {self.location}")
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            self._drop(conn)
        now = time.monotonic()
        if now < self._retry_at and self._last_error is not None:
            raise self._last_error
        try:
            conn = self._connect()
        except SteerflowError as exc:
            self._last_error = exc
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
            raise
        conn.add_notify_handler(self._on_notify)
        try:
            if self._listening:
                with self._translate():
                    conn.execute(f"LISTEN {self._channel}")
        except SteerflowError:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self._conn = conn
        self._back()
        return conn

    def first_connection(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        """Install the first connection, opened by the caller's own (waiting) ``connect``."""
        conn = connect()
        conn.add_notify_handler(self._on_notify)
        self._conn = conn

    def _drop(self, conn: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(Exception):
            conn.close()
        self._conn = None
        if self._lost_at is None:
            self._lost_at = time.monotonic()
            self._backoff = _BACKOFF_FIRST_S
            self._retry_at = 0.0
            _log.warning(
                "lost the connection to the state database %s; running on the checkpoint"
                " and reconnecting (controls sent meanwhile are applied once it is back)",
                self.location,
            )

    def _back(self) -> None:
        self._last_error = None
        self._backoff = _BACKOFF_FIRST_S
        self._retry_at = 0.0
        if self._lost_at is None:
            return
        away = time.monotonic() - self._lost_at
        self._lost_at = None
        _log.warning("reconnected to the state database %s after %.1f s", self.location, away)
        # Inserts made while nobody listened notified nobody: look at everything again.
        self.notified += 1
        self._dispatch(None)

    @contextlib.contextmanager
    def held(self) -> Iterator[psycopg.Connection[Any]]:
        """The lock and the live connection, for one statement or transaction."""
        with self.lock:
            yield self.connection()

    # -- notifications --------------------------------------------------------------------

    def listen(self) -> None:
        """``LISTEN`` on the shared connection from now on (and after every reconnect)."""
        with self.lock:
            conn = self.connection()
            if not self._listening:
                with self._translate():
                    conn.execute(f"LISTEN {self._channel}")
                self._listening = True

    def _on_notify(self, note: Any) -> None:
        # Called by psycopg, with the lock held, whichever statement read the message.
        self.notified += 1
        self._dispatch(str(note.payload))

    def _dispatch(self, session_id: str | None) -> None:
        callbacks = [cb for sid, cb in self._subscribers.values() if session_id in (None, sid)]
        for callback in callbacks:
            with contextlib.suppress(Exception):  # a subscriber's failure is its own
                callback()

    def subscribe(self, session_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on each control insert for ``session_id``; returns the unsubscribe.

        ``LISTEN`` is in effect when this returns, so a row inserted afterwards is never
        missed.
        """
        self.listen()
        with self.lock:
            token, self._next_token = self._next_token, self._next_token + 1
            self._subscribers[token] = (session_id, callback)
            if self._waiter is None:
                self._waiter = threading.Thread(
                    target=self._wait_idle, name="steerflow-pg-notify", daemon=True
                )
                self._waiter.start()

        def unsubscribe() -> None:
            with self.lock:
                self._subscribers.pop(token, None)

        return unsubscribe

    def _wait_idle(self) -> None:
        """Read notifications that arrive while no statement runs (see the module doc)."""
        while not self._closed.is_set():
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                # Nobody has needed the connection since it went: bring it back, so a
                # control sent meanwhile is not left waiting for the next statement.
                with self.lock, contextlib.suppress(SteerflowError):
                    if not self._closed.is_set():
                        self.connection()
                self._closed.wait(max(self._retry_at - time.monotonic(), _BACKOFF_FIRST_S))
                continue
            try:
                readable, _, _ = select.select([conn.fileno()], [], [], _IDLE_SLICE_S)
            except (OSError, ValueError, Exception):  # closed under us: look again
                self._closed.wait(_BACKOFF_FIRST_S)
                continue
            if not readable:
                self._drain_parsed(conn)
                continue
            with self.lock:
                if self._closed.is_set() or conn is not self._conn:
                    continue
                # Often the bytes were a statement's reply that its own thread has read
                # since: look again, now that nobody else may read, and skip the round trip.
                with contextlib.suppress(OSError, ValueError):
                    if not select.select([conn.fileno()], [], [], 0)[0]:
                        continue
                # One round trip: psycopg reads whatever arrived and calls _on_notify.
                # A connection the server closed fails here, and the next pass reconnects.
                with contextlib.suppress(Exception):
                    conn.execute("SELECT 1")
                if conn.broken:
                    self._drop(conn)

    def _drain_parsed(self, conn: psycopg.Connection[Any]) -> None:
        """Hand on notifications libpq parsed after a statement's last result.

        A NOTIFY that reached the socket together with a statement's reply is read into
        libpq's buffer by that statement but only handed out by the next one; the socket
        is then not readable. Checked every idle slice, without a round trip.
        """
        if not self.lock.acquire(blocking=False):
            return  # a statement runs: it hands them out itself
        try:
            if conn is not self._conn or conn.closed:
                return
            while (note := conn.pgconn.notifies()) is not None:
                self.notified += 1
                self._dispatch(note.extra.decode("utf-8", "replace"))
        except Exception:  # a broken connection is found by the next pass
            pass
        finally:
            self.lock.release()

    def close(self) -> None:
        """Close the connection and end the waiter thread (the last handle was closed)."""
        self._closed.set()
        with self.lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def acquire(key: LinkKey, make: Callable[[], Link]) -> tuple[Link, bool]:
    """The process's link for ``key`` (made by ``make`` when there is none), and whether new.

    The pid is part of the key: a forked child never shares its parent's socket.
    """
    with _links_guard:
        link = _links.get(key)
        fresh = link is None
        if link is None:
            link = _links[key] = make()
        link.users += 1
        return link, fresh


def release(key: LinkKey, link: Link) -> None:
    """One handle fewer; the last one closes the connection."""
    with _links_guard:
        link.users -= 1
        if link.users > 0:
            return
        if _links.get(key) is link:
            del _links[key]
    link.close()


def link_key(url: str, read_only: bool, busy_timeout_s: float, *, own: bool = False) -> LinkKey:
    """The key a backend with these settings shares its connection under (``own``: none)."""
    return (os.getpid(), url, read_only, busy_timeout_s, next(_private) if own else 0)
