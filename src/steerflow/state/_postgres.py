"""The PostgreSQL backend of the state database: the only module that imports ``psycopg``.

Selected by ``STEERFLOW_STATE_DB_URL=postgresql://...`` (or ``--state-db URL``), with
the optional extra ``postgres`` installed. It runs the same portable SQL as the SQLite
backend (``?`` placeholders are rewritten to ``%s``) and keeps the same guarantees:

* Every lock wait is bounded: ``lock_timeout`` is the busy timeout, and a wait past it
  (SQLSTATE 55P03, or a cancelled statement, 57014) is
  :class:`~steerflow.errors.DatabaseBusyError`, exit 3.
* SQLite serializes every writer with ``BEGIN IMMEDIATE``; PostgreSQL runs writers side
  by side, so the facade asks for the serialization it relies on with :meth:`lock`, a
  transaction-scoped advisory lock per ``(scope, key)``: the control inserts and status
  changes of one session, the resume claims of one source run, the migrations.
* An insert into ``session_controls`` fires a ``NOTIFY`` (see
  :mod:`steerflow.state._pg_schema`); :meth:`watch_controls` ``LISTEN``s on the same
  connection and calls back on each notification for its session, so the flow's
  poller is woken by the insert instead of polling for it.

Every :class:`PostgresBackend` of a process with the same URL and settings shares one
autocommit connection guarded by one lock (:mod:`steerflow.state._pg_link`, decision
360), so a flow holds one server connection and the synchronous
:class:`~steerflow.state.StateDB` methods may be called from worker threads. A
connection the server dropped is replaced on the next call, with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from steerflow.errors import (
    DatabaseBusyError,
    RefusedError,
    StateDBLostError,
    SteerflowError,
    UsageError,
    quote_input,
)
from steerflow.state._pg_admission import (
    DB_CONNECT_TIMEOUT_ENV,
    DEFAULT_DB_CONNECT_TIMEOUT_S,
    PG_SCHEMES,
    admission_wait,
    connect_timeout_s,
    is_postgres_url,
)
from steerflow.state._pg_link import Link, acquire, link_key, release
from steerflow.state._pg_schema import CONTROLS_CHANNEL, PG_MIGRATIONS, PG_SCHEMA_VERSION_DDL
from steerflow.state._schema import Migration, StateTransaction

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DB_CONNECT_TIMEOUT_ENV",
    "DEFAULT_DB_CONNECT_TIMEOUT_S",
    "PG_SCHEMES",
    "PostgresBackend",
    "PostgresTransaction",
    "admission_wait",
    "check_postgres_url",
    "connect_timeout_s",
    "is_postgres_url",
    "redact",
]

_MISSING_EXTRA = (
    "STEERFLOW_STATE_DB_URL names a PostgreSQL database, but psycopg is not installed:"
    " pip install 'steerflow[postgres]'"
)
_BUSY_STATES = {"55P03", "57014", "40P01", "40001"}  # lock timeout, cancelled, deadlock, serial
_READ_ONLY_STATE = "25006"
_UNDEFINED_TABLE = "42P01"
_ADMIT_FIRST_S = 0.25
_ADMIT_MAX_S = 2.0
_log = logging.getLogger("steerflow.state")

_MIGRATION_LOCK = "schema-migration"
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing psycopg at module load


_PORT = re.compile(r"[0-9]{1,5}")


def redact(url: str) -> str:
    """``url`` without its password, for messages (also for a URL that does not parse)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # "[bad": redact by hand whatever sits between ':' and '@'
        return re.sub(r"^([^:/]*://[^:/@]*):[^@/]*@", r"\1:***@", url)
    if password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


_USERINFO = re.compile(r"^[^:/]*://[^:/@]*:([^@/]*)@")


def _without_password(message: str, url: str) -> str:
    """The parse error of libpq quotes the URL, or the token it choked on: not the password."""
    found = _USERINFO.match(url)
    if found is None or not found.group(1):
        return message
    password = found.group(1)
    for text in sorted({password, unquote(password)}, key=len, reverse=True):
        message = message.replace(text, "***")
    return message


def check_postgres_url(url: str) -> None:
    """Refuse a ``postgresql://`` URL that libpq cannot parse or whose host list has a hole.

    libpq parses it (:func:`psycopg.conninfo.conninfo_to_dict`, no connection). A URL with
    no host at all (``postgresql:///db``) means what it means to psql: ``PGHOST``, else
    libpq's default unix socket. A host *list* with an empty member (``h1,,h2``) is a typo
    that would quietly add that default to the failover list, so it is refused, as is any
    port outside 1-65535.

    Raises:
        UsageError: The URL is malformed, or the ``postgres`` extra is not installed.
    """
    pg = _psycopg()
    from psycopg.conninfo import conninfo_to_dict

    shown = quote_input(redact(url))
    try:
        params = conninfo_to_dict(url)
    except pg.Error as exc:
        raise UsageError(
            f"invalid state database URL {shown}: {_without_password(_first_line(exc), url)}"
        ) from None
    named = str(params.get("host") or params.get("hostaddr") or "")
    hosts = named.split(",") if named else [""]
    if len(hosts) > 1 and any(not host.strip() for host in hosts):
        raise UsageError(
            f"invalid state database URL {shown}: its host list {named!r} has an empty "
            "member (name every server; a unix socket directory goes in ?host=/path/to/dir)"
        )
    ports = str(params.get("port") or "").split(",") if params.get("port") else []
    for port in ports:
        if not _PORT.fullmatch(port.strip()) or not 1 <= int(port) <= 65535:
            raise UsageError(
                f"invalid state database URL {shown}: port {port.strip()!r} is not 1-65535"
            )
    if len(ports) > 1 and len(ports) != len(hosts):
        raise UsageError(
            f"invalid state database URL {shown}: {len(ports)} ports for {len(hosts)} hosts"
        )


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise UsageError(_MISSING_EXTRA) from exc
    return psycopg


def _placeholders(sql: str) -> str:
    """The portable SQL with psycopg's placeholders (no statement quotes a ``?`` or ``%``)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _key(text: str) -> int:
    """A stable signed 32-bit advisory-lock key (the same in every process and host)."""
    value = zlib.crc32(text.encode("utf-8"))
    return value - (1 << 32) if value >= (1 << 31) else value


class PostgresTransaction:
    """Statements run inside one open transaction of a :class:`PostgresBackend`."""

    def __init__(self, backend: PostgresBackend, conn: psycopg.Connection[Any]) -> None:
        self._backend = backend
        self._conn = conn  # never a replacement: a dropped connection fails the transaction

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run one parameterised statement and return its rows as dicts."""
        return self._backend._run_query(sql, params, self._conn)

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run one parameterised write statement and return its row count."""
        return self._backend._run_execute(sql, params, self._conn)


class PostgresBackend:
    """A handle on the process's one connection to a PostgreSQL state database.

    Every backend of one process with the same URL and settings shares one
    :class:`~steerflow.state._pg_link.Link` (decision 360); closing a handle closes the
    connection only when it was the last.

    Attributes:
        url: The connection URL (with any password: never print it; see :attr:`location`).
        read_only: Whether every transaction is read-only.
        busy_timeout_s: Bound on every lock wait (``lock_timeout``).
    """

    def __init__(
        self, url: str, *, read_only: bool, busy_timeout_s: float, own: bool = False
    ) -> None:
        if busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        self.url = url
        self.read_only = read_only
        self.busy_timeout_s = busy_timeout_s
        self._closed = False
        self._key = link_key(url, read_only, busy_timeout_s, own=own)
        self._link, self._fresh = acquire(
            self._key, lambda: Link(self.location, CONTROLS_CHANNEL, self.connect, self._translate)
        )
        self._lock = self._link.lock

    @classmethod
    def open(
        cls, url: str, *, read_only: bool, busy_timeout_s: float, own: bool = False
    ) -> PostgresBackend:
        """Connect to the database at ``url`` (or share this process's connection to it).

        A server that does not admit a new connection (full, or starting up) is waited
        for, up to ``STEERFLOW_DB_CONNECT_TIMEOUT_S`` (decision 361). ``own``: a
        connection of its own, shared with no other backend (a test's second "process").

        Raises:
            UsageError: The URL is malformed (:func:`check_postgres_url`), or the
                ``postgres`` extra (psycopg) is not installed.
            InvalidValueError: ``STEERFLOW_DB_CONNECT_TIMEOUT_S`` is not a number of seconds.
            SteerflowError: The server cannot be reached, refuses the login, or did not
                admit this process in time.
        """
        check_postgres_url(url)
        timeout = connect_timeout_s()
        backend = cls(url, read_only=read_only, busy_timeout_s=busy_timeout_s, own=own)
        try:
            with backend._lock:
                if backend._fresh:
                    backend._link.first_connection(lambda: backend._connect_waiting(timeout))
                else:
                    backend._link.connection()
        except BaseException:
            backend.close()
            raise
        return backend

    @property
    def location(self) -> str:
        """The URL without its password."""
        return redact(self.url)

    @property
    def clock_sql(self) -> str:
        """The server's clock at the statement (not ``now()``: that is the transaction's start)."""
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    @property
    def migrations(self) -> tuple[Migration, ...]:
        """The schema steps in PostgreSQL's dialect."""
        return PG_MIGRATIONS

    @property
    def schema_version_ddl(self) -> str:
        """The ``schema_version`` table in PostgreSQL's dialect."""
        return PG_SCHEMA_VERSION_DDL

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A new connection with this backend's settings (bounded lock waits, text JSON)."""
        pg = _psycopg()
        from psycopg.conninfo import conninfo_to_dict
        from psycopg.rows import dict_row
        from psycopg.types.string import TextLoader

        options = f"-c lock_timeout={int(self.busy_timeout_s * 1000)}"
        if self.read_only:
            options += " -c default_transaction_read_only=on"
        try:  # keep the URL's own options (a search_path, say): ours come after, and win
            given = conninfo_to_dict(self.url).get("options")
        except pg.Error as exc:
            raise UsageError(f"invalid state database URL {self.location}: {exc}") from exc
        if given:
            options = f"{given} {options}"
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self.url,
                autocommit=autocommit,
                row_factory=dict_row,
                options=options,
                connect_timeout=max(2, int(self.busy_timeout_s)),
                # The pid tells a process's connection apart in pg_stat_activity.
                application_name=f"steerflow:{os.getpid()}",
            )
        except pg.Error as exc:
            raise SteerflowError(
                f"cannot connect to the state database {self.location}: {_first_line(exc)}"
            ) from exc
        # JSON columns come back as text, as from SQLite: the facade decodes them itself.
        for name in ("json", "jsonb"):
            conn.adapters.register_loader(name, TextLoader)
        return conn

    def _connect_waiting(self, timeout: float) -> psycopg.Connection[Any]:
        """:meth:`connect`, waiting (bounded backoff) while the server does not admit us yet.

        One progress line, not one per try. Only a refusal to admit is waited for (too
        many clients, the server starting up): a wrong password, a missing database or
        an unreachable host fail at once, as before.
        """
        deadline = time.monotonic() + timeout
        delay = _ADMIT_FIRST_S
        said = False
        while True:
            try:
                return self.connect()
            except SteerflowError as exc:
                reason = _not_admitted(exc)
                left = deadline - time.monotonic()
                if reason is None:
                    raise
                if left <= 0:
                    raise SteerflowError(
                        f"cannot connect to the state database {self.location}: the server did"
                        f" not admit this process within {timeout:g} s ({DB_CONNECT_TIMEOUT_ENV}):"
                        f" {reason}"
                    ) from exc
                if not said:
                    said = True
                    _log.warning(
                        "the state database %s does not admit this process yet (%s):"
                        " waiting up to %g s (%s)",
                        self.location,
                        reason,
                        timeout,
                        DB_CONNECT_TIMEOUT_ENV,
                    )
                # Jittered, so a fleet refused together does not come back together.
                time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
                delay = min(delay * 2, _ADMIT_MAX_S)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise SteerflowError(f"state database is closed: {self.location}")
        with self._translate():
            return self._link.connection()

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        psycopg = _psycopg()
        try:
            yield
        except psycopg.Error as exc:
            state = getattr(exc, "sqlstate", None)
            if state in _BUSY_STATES:
                raise DatabaseBusyError(
                    f"database busy: {self.location} (lock wait exceeded {self.busy_timeout_s:g} s)"
                ) from exc
            if state == _READ_ONLY_STATE:
                raise RefusedError(f"state database is read-only: {self.location}") from exc
            if state == _UNDEFINED_TABLE:
                # Opening checks the schema; a table missing afterwards was dropped under
                # us: the database was replaced, which a live run must stop for.
                raise StateDBLostError(
                    f"the state database {self.location} lost its tables: {_first_line(exc)}"
                ) from exc
            raise SteerflowError(
                f"state database error at {self.location}: {_first_line(exc)}"
            ) from exc

    def _run_query(
        self, sql: str, params: Sequence[object], conn: psycopg.Connection[Any] | None = None
    ) -> list[dict[str, Any]]:
        with self._lock, self._translate():
            cursor = (conn or self._connection()).execute(_placeholders(sql), tuple(params))
            return list(cursor.fetchall()) if cursor.description is not None else []

    def _run_execute(
        self, sql: str, params: Sequence[object], conn: psycopg.Connection[Any] | None = None
    ) -> int:
        with self._lock, self._translate():
            cursor = (conn or self._connection()).execute(_placeholders(sql), tuple(params))
            return int(cursor.rowcount)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run one read statement in its own (autocommit) transaction."""
        return self._run_query(sql, params)

    @contextlib.contextmanager
    def transaction(self, *, write: bool) -> Iterator[PostgresTransaction]:
        """Hold the connection for one transaction (READ COMMITTED).

        It commits when the block ends and rolls back when it raises. Writers that
        depend on one another serialize with :meth:`lock`; a read transaction gets
        one snapshot per statement, as every reader here needs.

        Raises:
            RefusedError: A write on a read-only backend.
        """
        if write and self.read_only:
            raise RefusedError(f"state database is read-only: {self.location}")
        with self._lock:
            with self._translate():
                conn = self._connection()
                if conn.info.transaction_status != _IDLE:
                    # The lock is re-entrant: this thread is inside another handle's
                    # transaction on the shared connection, whose COMMIT this one's would be.
                    raise RuntimeError(
                        "a state DB transaction inside another on the same connection"
                        " (open this one with own_connection=True)"
                    )
                conn.execute("BEGIN")
            try:
                yield PostgresTransaction(self, conn)
                with self._translate():
                    conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")  # a no-op after a failed COMMIT
                raise

    def identity(self) -> tuple[object, ...]:
        """The server's system identifier, the database's oid and the ``sessions`` table's.

        The system identifier is fixed when the cluster is created (a replica shares
        its primary's: the same data); the database oid tells the databases of one
        server apart. The tables are found through the URL's ``search_path``, so two
        schemas of one database are two state databases: the oid of the ``sessions``
        table those names resolve to tells them apart (null before any migration).
        """
        rows = self.query(
            "SELECT (SELECT system_identifier FROM pg_control_system()) AS system,"
            " (SELECT oid FROM pg_database WHERE datname = current_database()) AS db,"
            " to_regclass('sessions')::oid AS sessions"
        )
        row = rows[0]
        return ("postgresql", str(row["system"]), int(row["db"]), row["sessions"])

    def lock(self, tx: StateTransaction, scope: str, key: str) -> None:
        """Wait (bounded) for the advisory lock of ``(scope, key)`` until ``tx`` ends."""
        tx.query("SELECT pg_advisory_xact_lock(?, ?)", (_key(scope), _key(key)))

    def lock_for_migration(self, tx: StateTransaction) -> None:
        """Serialize migrations: the first process migrates, the others then see it done."""
        self.lock(tx, _MIGRATION_LOCK, _MIGRATION_LOCK)

    def schema_version(self) -> int:
        """The highest applied migration, or 0 when the bookkeeping table is missing."""
        rows = self._run_query("SELECT to_regclass('schema_version') IS NOT NULL AS present", ())
        if not rows or not rows[0]["present"]:
            return 0
        found = self._run_query("SELECT MAX(version) AS version FROM schema_version", ())
        version = found[0]["version"] if found else None
        return int(version) if version is not None else 0

    def data_version(self) -> int:
        """How many control inserts this process's connection has been notified of.

        It changes when any writer inserts a control row (the NOTIFY trigger). One
        round trip: PostgreSQL hands an idle listening connection every notification
        committed before the statement, so an insert committed before this call has
        always been counted when it returns (the same promise as SQLite's pragma).
        """
        with self._lock:
            if self._closed:
                raise SteerflowError(f"state database is closed: {self.location}")
            with self._translate():
                self._link.listen()
                self._link.connection().execute("SELECT 1")
            return self._link.notified

    def watch_controls(self, session_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from another thread) on each control insert for ``session_id``.

        ``LISTEN`` is in effect when this returns, so a row inserted afterwards is never
        missed. Returns the function that stops the calls.
        """
        if self._closed:
            raise SteerflowError(f"state database is closed: {self.location}")
        with self._translate():
            return self._link.subscribe(session_id, callback)

    def close(self) -> None:
        """Let go of the shared connection (closed with its last handle). Twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        release(self._key, self._link)


# libpq reports a refused startup as text (no SQLSTATE reaches the client before the
# session exists): these are the server's words for "not now" rather than "never".
_NOT_ADMITTED = (
    "too many clients",
    "too many connections for",  # a role's or a database's CONNECTION LIMIT
    "remaining connection slots are reserved",
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
)


def _not_admitted(exc: SteerflowError) -> str | None:
    """The server's reason when ``exc`` is a refusal to admit a new connection now."""
    text = str(exc.__cause__ or exc)
    lowered = text.lower()
    if not any(words in lowered for words in _NOT_ADMITTED):
        return None
    found = re.search(r"FATAL:\s*(.*)", text)
    return (found.group(1) if found else _first_line(exc)).strip()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
