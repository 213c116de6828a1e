"""The typed state-database facade, :class:`StateDB`, over a pluggable backend.

:class:`StateDB` speaks portable SQL with ``?`` placeholders through the small
:class:`StateBackend` protocol. The embedded backend is SQLite
(:mod:`steerflow.state._sqlite`) at ``<home>/state.db``; the environment
variable ``STEERFLOW_STATE_DB_URL`` selects another backend by URL scheme:
``sqlite:///<path>``, or ``postgresql://...`` for the PostgreSQL backend
(:mod:`steerflow.state._postgres`, extra ``postgres``). No module outside this
package knows which one it talks to.

Every method is synchronous and bounded by the busy timeout; async callers
wrap them in :func:`asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import quote

from steerflow import _faults
from steerflow.errors import (
    AmbiguousIdError,
    ControlNotApplyingError,
    LeaseLostError,
    NotRunningError,
    RefusedError,
    StateDBLostError,
    SteerflowError,
    UnknownIdError,
    UsageError,
    quote_input,
)
from steerflow.state._claims import (
    ResumeClaim,
    ResumedBy,
    check_claim,
    db_clock,
    record_claim,
    take_over,
)
from steerflow.state._claims import resumed_by as _resumed_by
from steerflow.state._lease import lease_seconds
from steerflow.state._owner import Owner, owner_alive
from steerflow.state._owner import effective_status as _effective_status
from steerflow.state._pg_admission import is_postgres_url
from steerflow.state._schema import (
    ControlRow,
    ControlVerb,
    InvocationKind,
    InvocationRow,
    NodeRow,
    NodeUpdate,
    Phase,
    PlayRow,
    ResolvedTarget,
    SessionRow,
    SessionStatus,
    StateBackend,
    StateTransaction,
    TargetVia,
    dump_json,
    load_json,
    migrate,
)
from steerflow.state._sqlite import SqliteBackend, sqlite_path_from_url
from steerflow.state._vocab import NodeKind

__all__ = [
    "BUSY_TIMEOUT_S",
    "DB_FILENAME",
    "PENDING_CONTROLS_SQL",
    "STATE_DB_URL_ENV",
    "ResolvedTarget",
    "StateDB",
    "db_exists",
    "db_path",
    "normalize_state_db_url",
]

DB_FILENAME = "state.db"
"""File name of the embedded database inside the steerflow home."""

BUSY_TIMEOUT_S = 10.0
"""Bound on every lock wait (CONTRACT §2) and on connecting to a PostgreSQL state DB
(``connect_timeout``); ``--executor ray`` bounds joining its cluster by it too."""

STATE_DB_URL_ENV = "STEERFLOW_STATE_DB_URL"
"""Environment variable naming another state database by URL."""


def state_db_url() -> str | None:
    """``STEERFLOW_STATE_DB_URL`` when set (non-blank), else ``None``."""
    return os.environ.get(STATE_DB_URL_ENV, "").strip() or None


def normalize_state_db_url(url: str) -> str:
    """``url`` checked, a SQLite one respelled absolute (``sqlite:////abs/path``).

    So a child process started in another directory reads the same file from the
    inherited ``STEERFLOW_STATE_DB_URL``. A PostgreSQL URL is returned as given.

    Raises:
        UsageError: The URL is malformed, names no supported backend, or names
            PostgreSQL without the ``postgres`` extra.
    """
    if is_postgres_url(url):
        from steerflow.state._postgres import check_postgres_url  # only here: decision 391

        check_postgres_url(url)
        return url
    return "sqlite:///" + quote(str(sqlite_path_from_url(url)))


def _postgres_url() -> str | None:
    url = state_db_url()
    return url if url is not None and is_postgres_url(url) else None


def db_path(home: Path) -> Path:
    """The SQLite file of ``home``: ``STEERFLOW_STATE_DB_URL``, else ``<home>/state.db``.

    Raises:
        UsageError: ``STEERFLOW_STATE_DB_URL`` names a PostgreSQL database (no file) or
            an unsupported backend.
    """
    url = state_db_url()
    return sqlite_path_from_url(url) if url else Path(home) / DB_FILENAME


def db_exists(home: Path) -> bool:
    """Whether the state database of ``home`` exists, so a reader can skip it when it does not.

    For PostgreSQL: whether the database has the state tables (migrated at least once).

    Raises:
        UsageError: ``STEERFLOW_STATE_DB_URL`` names an unsupported backend, or
            PostgreSQL without the ``postgres`` extra.
        SteerflowError: The PostgreSQL server cannot be reached.
    """
    url = _postgres_url()
    if url is None:
        return db_path(home).is_file()
    from steerflow.state._postgres import PostgresBackend  # only here: decision 391

    backend = PostgresBackend.open(url, read_only=True, busy_timeout_s=BUSY_TIMEOUT_S)
    try:
        return backend.schema_version() > 0
    finally:
        backend.close()


_HEX_ID = re.compile(r"[0-9a-f]{1,32}")
_ID_LEN = 32
_MAX_CANDIDATES = 10
# Keys bound per ``IN (...)`` lookup: under SQLite's oldest host-parameter limit (999).
_KEYS_PER_QUERY = 500
_NODE_COLUMNS_NO_DETAIL = (
    "session_id, node_key, kind, node_id, assignee, status, updated_at, NULL AS detail"
)
_CONTROL_COLUMNS = "id, session_id, verb, payload, created_at, applied_at, result, sender"

_TARGET_SQL: dict[TargetVia, str] = {
    "session": "SELECT id AS sid, kind FROM sessions WHERE id = ?",
    "invocation": "SELECT session_id AS sid, kind FROM invocations WHERE id = ?",
    "play": "SELECT p.session_id AS sid, s.kind AS kind FROM plays p"
    " JOIN sessions s ON s.id = p.session_id WHERE p.id = ?",
}
_TABLES: tuple[tuple[str, TargetVia], ...] = (
    ("sessions", "session"), ("invocations", "invocation"), ("plays", "play")
)  # fmt: skip

_CONTROL_BY_ID_SQL = f"SELECT {_CONTROL_COLUMNS} FROM session_controls WHERE id = ?"
# Served by the partial index idx_session_controls_pending (ADR-0069 D1).
PENDING_CONTROLS_SQL = (
    f"SELECT {_CONTROL_COLUMNS} FROM session_controls"
    " WHERE session_id = ? AND applied_at IS NULL AND result IS NULL"
    " ORDER BY created_at, id"
)


def _initialize(path: Path, *, busy_timeout_s: float) -> None:
    """Create a migrated WAL database under a private name, then link it into place.

    Switching a shared file to WAL mode fails at once (no busy wait) while another
    process has it open, so a brand-new ``state.db`` that a second process opened
    half-initialized made the first one fail with "database busy". Building it aside
    means every process sees either no file or a complete one; a process that loses
    the race to link simply opens the winner's file.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.init")
    try:
        backend = SqliteBackend.open(
            tmp, create=True, read_only=False, busy_timeout_s=busy_timeout_s
        )
        try:
            _faults.seam("state-init", "after")
            migrate(backend)
            # Fold the log into the file now, where a failure raises: the implicit
            # checkpoint at close fails silently on a full disk, and linking a file
            # whose pages are still in its -wal published a malformed database.
            folded = backend.query("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            backend.close()  # the last connection: SQLite removes -wal/-shm
        if folded[0].get("busy") or os.path.exists(f"{tmp}-wal"):
            raise SteerflowError(
                f"cannot create the state database {str(path)!r}: its write-ahead log"
                " could not be folded into it (is the disk full?)"
            )
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    except OSError as exc:
        raise SteerflowError(
            f"cannot create the state database {str(path)!r}: {exc.strerror or exc}"
        ) from exc
    finally:
        # A failed initialisation leaves nothing behind, not even a half-built file.
        # NotADirectoryError: the path runs through a regular file; the error already
        # raised names that, and must not be replaced by this cleanup's errno text.
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(f"{tmp}{suffix}")


class _RowChangedError(Exception):
    """The row a redelivery read changed before its stamp: roll the insert back."""


def _insert_control(
    tx: StateTransaction,
    session_id: str,
    verb: ControlVerb,
    body: dict[str, Any] | None,
    created_at: float,
    sender: str | None,
) -> ControlRow:
    """Insert a pending control inside ``tx``; ``created_at`` kept above the session's newest."""
    # Strictly above the session's newest row even when clocks differ between hosts.
    newest = tx.query(
        "SELECT MAX(created_at) AS newest FROM session_controls WHERE session_id = ?",
        (session_id,),
    )[0]["newest"]
    if newest is not None and created_at <= float(newest):
        created_at = math.nextafter(float(newest), math.inf)
    row = ControlRow(_new_id(), session_id, verb, body, created_at, None, None, sender)
    tx.execute(
        "INSERT INTO session_controls (id, session_id, verb, payload, created_at,"
        " applied_at, result, sender) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?)",
        (row.id, session_id, verb, None if body is None else dump_json(body), created_at,
         sender),
    )  # fmt: skip
    return row


def _new_id() -> str:
    return uuid.uuid4().hex


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _check_choice(value: object, alias: object, what: str) -> None:
    allowed = get_args(alias)
    if value not in allowed:
        raise UsageError(f"invalid {what} {value!r}: expected one of {', '.join(allowed)}")


class StateDB:
    """Typed access to the sessions, invocations, plays, controls and node status.

    Build one with :meth:`open`. One object holds one connection; its methods
    are thread-safe and synchronous. It is a context manager that closes the
    connection on exit.

    Attributes:
        path: The database file (for the SQLite backend), else ``None``.
        backend: The backend in use.
    """

    def __init__(self, backend: StateBackend, *, path: Path | None = None) -> None:
        """Wrap an open backend whose schema is current (see :meth:`open`)."""
        self.backend = backend
        self.path = path
        # The file this connection has open, as its path named it once opened: SQLite
        # keeps writing to an unlinked or renamed-over inode, so only a comparison with
        # what the path names now tells that the database went away (decision 122).
        self._identity = _file_identity(path) if path is not None else None

    @classmethod
    def open(
        cls,
        home: Path,
        *,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        own_connection: bool = False,
    ) -> StateDB:
        """Open the state database of a steerflow home.

        Args:
            home: The steerflow home; ``<home>/state.db`` is the database unless
                ``STEERFLOW_STATE_DB_URL`` names another.
            create: Create the home (mode 0700), the file (mode 0600) and the
                tables when missing. With ``False`` a missing file is refused.
            read_only: Open without creating the home, the file or the tables, and
                refuse every write (``RefusedError``).
            busy_timeout_s: Bound on every lock wait, in seconds.
            own_connection: PostgreSQL: a connection of its own rather than the one
                this process shares (decision 360); for a test standing in for a
                second process in this one.

        Raises:
            RefusedError: ``no state database at <path>``, or the schema is newer
                than this code, or a read-only open of an unmigrated database.
            DatabaseBusyError: A lock wait ran past ``busy_timeout_s``.
            UsageError: ``STEERFLOW_STATE_DB_URL`` names an unsupported backend.
        """
        url = _postgres_url()
        if url is not None:
            return cls._open_postgres(
                url,
                create=create,
                read_only=read_only,
                busy_timeout_s=busy_timeout_s,
                own_connection=own_connection,
            )
        return cls._open_sqlite(
            db_path(home), create=create, read_only=read_only, busy_timeout_s=busy_timeout_s
        )

    @classmethod
    def open_url(
        cls,
        url: str,
        *,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        own_connection: bool = False,
    ) -> StateDB:
        """Open the state database named by ``url``, whatever ``STEERFLOW_STATE_DB_URL`` says.

        ``url`` is ``sqlite:///PATH`` or ``postgresql://...``; the other arguments are
        those of :meth:`open`.

        Raises:
            UsageError: ``url`` names an unsupported backend, or PostgreSQL without the extra.
        """
        if is_postgres_url(url):
            return cls._open_postgres(
                url,
                create=create,
                read_only=read_only,
                busy_timeout_s=busy_timeout_s,
                own_connection=own_connection,
            )
        return cls._open_sqlite(
            sqlite_path_from_url(url),
            create=create,
            read_only=read_only,
            busy_timeout_s=busy_timeout_s,
        )

    @classmethod
    def _open_sqlite(
        cls, path: Path, *, create: bool, read_only: bool, busy_timeout_s: float
    ) -> StateDB:
        if create and not read_only and not path.exists():
            _initialize(path, busy_timeout_s=busy_timeout_s)
        backend = SqliteBackend.open(
            path, create=create, read_only=read_only, busy_timeout_s=busy_timeout_s
        )
        try:
            migrate(backend)
        except BaseException:
            backend.close()
            raise
        return cls(backend, path=path)

    @classmethod
    def _open_postgres(
        cls,
        url: str,
        *,
        create: bool,
        read_only: bool,
        busy_timeout_s: float,
        own_connection: bool = False,
    ) -> StateDB:
        from steerflow.state._postgres import PostgresBackend  # only here: decision 391

        backend = PostgresBackend.open(
            url, read_only=read_only, busy_timeout_s=busy_timeout_s, own=own_connection
        )
        try:
            if not create and backend.schema_version() == 0:
                # As a missing SQLite file: readers and ctl never create the tables.
                raise RefusedError(f"no state database at {backend.location}")
            migrate(backend)
        except BaseException:
            backend.close()
            raise
        return cls(backend)

    @property
    def location(self) -> str:
        """Where the database is, for messages (a path, or a URL without its password)."""
        return self.backend.location

    def close(self) -> None:
        """Close the connection. Closing twice is harmless."""
        self.backend.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def data_version(self) -> int:
        """A cheap change check for pollers (``PRAGMA data_version`` on SQLite).

        The number changes only when ANOTHER connection commits; this object's
        own writes and reads leave it as it was. A poller compares it with the
        last value it saw and runs the indexed pending query only on a change.
        """
        return self.backend.data_version()

    def watch_controls(
        self, session_id: str, callback: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Call ``callback`` (from another thread) when a control for ``session_id`` is inserted.

        Returns the function that stops the calls, or ``None`` when the backend cannot
        notify (SQLite): the caller then polls :meth:`data_version`.
        """
        return self.backend.watch_controls(session_id, callback)

    def create_session(
        self,
        *,
        kind: InvocationKind,
        prompt: str | None = None,
        run_id: str | None = None,
        node_metadata: Mapping[str, Any] | None = None,
        owner: Owner | None = None,
        phase: Phase = "planning",
        resume: ResumeClaim | None = None,
        lease_s: float | None = None,
        name: str | None = None,
    ) -> SessionRow:
        """Insert a ``running`` session owned by ``owner`` (default: this process).

        ``name`` is the run's name as lists show it (see ``orchestrate.run_name``).

        A ``run_id`` is also mirrored into ``node_metadata["run_id"]``. With
        ``resume``, the claim on the source run is checked and taken in the same
        write transaction as the insert (docs/decisions.md, one resume per source),
        so of two resumes of one source at the same moment exactly one gets a session,
        and none while the source run's own session still holds its lease. A
        ``running`` session the claim judges dead is taken over in that transaction:
        its ``lease_epoch`` is raised to the new session's, so it can fence no more.

        The new session's lease runs ``lease_s`` (default :func:`lease_seconds`) past
        the database's clock; its owner renews it (:meth:`renew_lease`).

        Raises:
            ResumeClaimedError: ``resume`` is refused; nothing was written.
        """
        _check_choice(kind, InvocationKind, "session kind")
        _check_choice(phase, Phase, "phase")
        who = owner if owner is not None else Owner.current()
        meta = dict(node_metadata or {})
        if run_id is not None:
            meta["run_id"] = run_id
        sid = _new_id()
        duration = lease_seconds() if lease_s is None else lease_s
        clock = self.backend.clock_sql
        with self.backend.transaction(write=True) as tx:
            check = None
            if resume is not None:  # two resumes of one source: one checks after the other
                self.backend.lock(tx, "resume", resume.source_run_id)
                check = check_claim(tx, resume, db_clock(tx, clock))
            now = time.time()
            takeover = check.takeover if check is not None else []
            # Above every token it fences: the chain's owners hold ever larger epochs.
            epoch = 1 + max((row.lease_epoch for row in takeover), default=0)
            tx.execute(
                "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at,"
                " node_metadata, prompt, run_id, owner_host, owner_pid, owner_started,"
                " heartbeat_at, lease_epoch, name, lease_expires) VALUES (?, ?, 'running', ?,"
                f" ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {clock} + ?)",
                (sid, kind, phase, now, now, dump_json(meta), prompt, run_id,
                 who.host, who.pid, who.started_at, now, epoch, name, duration),
            )  # fmt: skip
            if resume is not None and check is not None:
                take_over(tx, takeover, sid, epoch, now, clock)
                record_claim(tx, resume, sid, now, check.stale)
            expires = tx.query("SELECT lease_expires FROM sessions WHERE id = ?", (sid,))
        return SessionRow(sid, kind, "running", phase, now, now, meta, None, prompt, run_id,
                          who.host, who.pid, who.started_at, now, epoch,
                          float(expires[0]["lease_expires"]), None, name)  # fmt: skip

    def get_session(self, session_id: str) -> SessionRow | None:
        """The session with exactly this id, or ``None``."""
        rows = self.backend.query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return SessionRow.from_mapping(rows[0]) if rows else None

    def check_resume(self, claim: ResumeClaim) -> None:
        """Refuse ``claim`` now if it would be refused.

        A read-only preflight; :meth:`create_session` makes the check that counts.

        Raises:
            ResumeClaimedError: The source run still runs, or another resume holds
                or continued it.
        """
        with self.backend.transaction(write=False) as tx:
            check_claim(tx, claim, db_clock(tx, self.backend.clock_sql))

    def resumed_by(self, run_ids: Sequence[str]) -> dict[str, list[ResumedBy]]:
        """Who resumed each of ``run_ids``, oldest first; runs never resumed are absent."""
        with self.backend.transaction(write=False) as tx:
            return _resumed_by(tx, run_ids)

    def session_for_run(self, run_id: str) -> SessionRow | None:
        """The session that owns run directory ``run_id``, or ``None``."""
        rows = self.backend.query(
            "SELECT * FROM sessions WHERE run_id = ? ORDER BY created_at DESC, id DESC LIMIT 1",
            (run_id,),
        )
        return SessionRow.from_mapping(rows[0]) if rows else None

    def list_sessions(
        self,
        *,
        limit: int | None = 20,
        offset: int = 0,
        stored: Sequence[str] | None = None,
        text: str | None = None,
        since: float | None = None,
    ) -> list[SessionRow]:
        """Sessions newest first (``created_at DESC, id DESC``); ``limit=None`` for all.

        ``stored``: only sessions whose stored status is one of these; ``text``: only those
        whose name or run id contains it (case-insensitive); ``since``: only those created
        at or after that epoch; ``offset`` skips that many rows first (a page of a long list).
        """
        where: list[str] = []
        params: list[object] = []
        if since is not None:
            where.append("created_at >= ?")
            params.append(float(since))
        if stored is not None:
            marks = ", ".join("?" for _ in stored)
            where.append(f"status IN ({marks})" if stored else "0=1")
            params += list(stored)
        if text:
            pattern = "%" + re.sub(r"([\\%_])", r"\\\1", text.lower()) + "%"
            where.append(
                "(LOWER(COALESCE(name, '')) LIKE ? ESCAPE '\\'"
                " OR LOWER(COALESCE(run_id, '')) LIKE ? ESCAPE '\\')"
            )
            params += [pattern, pattern]
        sql = "SELECT * FROM sessions" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at DESC, id DESC"
        if limit is not None or offset:
            sql += " LIMIT ? OFFSET ?"
            # Both backends take a large bound; PostgreSQL refuses SQLite's LIMIT -1.
            params += [2**62 if limit is None else max(0, int(limit)), max(0, int(offset))]
        return [SessionRow.from_mapping(r) for r in self.backend.query(sql, tuple(params))]

    def _write(self, sql: str, params: Sequence[object]) -> int:
        """Run one statement in its own write transaction; return the row count."""
        with self.backend.transaction(write=True) as tx:
            return tx.execute(sql, params)

    def _update_session(self, session_id: str, assignments: str, params: Sequence[object]) -> None:
        sql = f"UPDATE sessions SET {assignments}, updated_at = ? WHERE id = ?"
        if self._write(sql, (*params, time.time(), session_id)) != 1:
            raise UnknownIdError(f"unknown session id {session_id!r}")

    def set_session_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        expected: str | None = None,
        epoch: int | None = None,
    ) -> bool:
        """Set the status (with ``expected``: only while stored); return whether it changed.

        With ``epoch``, only while the session still holds its lease at that epoch.

        Raises:
            LeaseLostError: ``epoch`` was given and the lease was taken over.
        """
        _check_choice(status, SessionStatus, "session status")
        sql = "UPDATE sessions SET status = ?, updated_at = ? WHERE id = ?"
        params: list[object] = [status, time.time(), session_id]
        if expected is not None:
            sql, params = sql + " AND status = ?", [*params, expected]
        if epoch is not None:  # in the statement: PostgreSQL re-checks it after a lock wait
            sql, params = sql + " AND lease_epoch = ?", [*params, epoch]
        with self.backend.transaction(write=True) as tx:
            self.backend.lock(tx, "session", session_id)  # after any control insert in flight
            if tx.execute(sql, params) == 1:
                return True
            self._fence(tx, session_id, epoch)  # no row changed: lost the lease, or not expected
            return False

    def set_session_phase(self, session_id: str, phase: Phase) -> None:
        """Record the flow's phase (``planning``, ``executing`` or ``paused``)."""
        _check_choice(phase, Phase, "phase")
        self._update_session(session_id, "phase = ?", (phase,))

    def heartbeat(self, session_id: str) -> None:
        """Stamp ``heartbeat_at`` with the current time."""
        self._update_session(session_id, "heartbeat_at = ?", (time.time(),))

    def renew_lease(self, session_id: str, epoch: int, lease_s: float) -> None:
        """Extend the lease of ``session_id`` held at ``epoch`` to ``lease_s`` past the DB's clock.

        One fenced statement, which is also the heartbeat. On SQLite the file this
        connection writes to is first compared with the one its path names now.

        Raises:
            LeaseLostError: Another session took the lease over.
            StateDBLostError: The database file was deleted, replaced or made
                unwritable, or the session's row is gone (a replaced database).
            DatabaseBusyError: The write lock could not be taken within the bound.
        """
        self.check_file()
        now = time.time()
        with self.backend.transaction(write=True) as tx:
            changed = tx.execute(
                "UPDATE sessions SET heartbeat_at = ?, updated_at = ?,"
                f" lease_expires = {self.backend.clock_sql} + ? WHERE id = ? AND lease_epoch = ?",
                (now, now, lease_s, session_id, epoch),
            )
            if changed != 1:
                self._lease_lost(tx, session_id)

    def check_file(self) -> None:
        """Refuse when the SQLite file this connection has open is no longer the path's.

        Nothing to check on PostgreSQL (a replaced database there has no lease row).

        Raises:
            StateDBLostError: The file was deleted, another file now has its path, or
                it lost its write permission (or its file system went read-only).
        """
        if self.path is None or self._identity is None:
            return
        where = str(self.path)
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            raise StateDBLostError(f"the state database {where} was deleted") from None
        except OSError as exc:
            raise StateDBLostError(
                f"the state database {where} cannot be checked: {exc.strerror or exc}"
            ) from None
        if (found.st_dev, found.st_ino) != self._identity:
            raise StateDBLostError(
                f"the state database {where} was replaced: another file has its path now"
            )
        # Root writes past the mode bits; the operator who cleared them still meant it.
        if not found.st_mode & stat.S_IWUSR or not os.access(self.path, os.W_OK):
            raise StateDBLostError(f"the state database {where} was made unwritable")

    def _fence(self, tx: StateTransaction, session_id: str, epoch: int | None) -> None:
        """Refuse ``tx`` unless ``session_id`` still holds its lease at ``epoch``.

        A read, not a row lock: on PostgreSQL a lock on the session row would queue the
        poller's phase and stamp writes behind every node-status batch (control latency
        p99 went from ~130 ms to ~650 ms at 100 flows, benchmarks/fleet_pg.py). So a batch
        whose check ran just before a takeover committed may still land just after it;
        it writes only the old session's own rows, which the new owner never reads or
        writes (decision 120). Status and metadata writes carry the epoch in their
        ``UPDATE`` instead, which PostgreSQL re-checks after any lock wait.
        """
        if epoch is None:
            return
        held = tx.query(
            "SELECT 1 AS held FROM sessions WHERE id = ? AND lease_epoch = ?", (session_id, epoch)
        )
        if not held:
            self._lease_lost(tx, session_id)

    def _lease_lost(self, tx: StateTransaction, session_id: str) -> None:
        rows = tx.query(
            "SELECT s.run_id, s.lease_taken_by, t.owner_host AS taker_host,"
            " t.run_id AS taker_run FROM sessions s LEFT JOIN sessions t"
            " ON t.id = s.lease_taken_by WHERE s.id = ?",
            (session_id,),
        )
        if not rows:
            raise StateDBLostError(
                f"the state database {self.location} no longer has session {session_id}:"
                " it was replaced, or the row deleted"
            )
        row = rows[0]
        taker = row["lease_taken_by"]
        host = row["taker_host"] or "an unknown host"
        raise LeaseLostError(
            f"run {row['run_id']} (session {session_id}) was taken over by session"
            f" {taker or 'unknown'} on host {host} (its run {row['taker_run'] or 'unknown'})",
            session_id=session_id,
            new_session_id=taker,
            new_host=row["taker_host"],
        )

    def set_run_id(self, session_id: str, run_id: str) -> None:
        """Set the ``run_id`` column and mirror it into ``node_metadata["run_id"]``."""
        with self.backend.transaction(write=True) as tx:
            meta = self._read_metadata(tx, session_id)
            meta["run_id"] = run_id
            tx.execute(
                "UPDATE sessions SET run_id = ?, node_metadata = ?, updated_at = ? WHERE id = ?",
                (run_id, dump_json(meta), time.time(), session_id),
            )

    def _read_metadata(self, tx: StateTransaction, session_id: str) -> dict[str, Any]:
        # A read-modify-write: the next writer of this session's metadata reads our result.
        self.backend.lock(tx, "metadata", session_id)
        rows = tx.query("SELECT node_metadata FROM sessions WHERE id = ?", (session_id,))
        if not rows:
            raise UnknownIdError(f"unknown session id {session_id!r}")
        meta = load_json(rows[0]["node_metadata"])
        return dict(meta) if isinstance(meta, dict) else {}

    def update_node_metadata(
        self, session_id: str, patch: Mapping[str, object], *, epoch: int | None = None
    ) -> dict[str, Any]:
        """Merge ``patch`` into ``node_metadata`` in one write transaction.

        Top-level keys of ``patch`` replace stored ones; a value of ``None``
        deletes the key. With ``epoch``, only while the session holds its lease at it.

        Returns:
            The new ``node_metadata``.

        Raises:
            LeaseLostError: ``epoch`` was given and the lease was taken over.
        """
        with self.backend.transaction(write=True) as tx:
            meta = self._read_metadata(tx, session_id)
            for key, value in patch.items():
                if value is None:
                    meta.pop(key, None)
                else:
                    meta[key] = value
            sql = "UPDATE sessions SET node_metadata = ?, updated_at = ? WHERE id = ?"
            params: list[object] = [dump_json(meta), time.time(), session_id]
            if epoch is not None:
                sql, params = sql + " AND lease_epoch = ?", [*params, epoch]
            if tx.execute(sql, params) != 1:
                self._fence(tx, session_id, epoch)
        return meta

    def set_artifact_contract(self, session_id: str, contract: object | None) -> None:
        """Store the artifact contract as JSON, or NULL for ``None``."""
        encoded = None if contract is None else dump_json(contract)
        self._update_session(session_id, "artifact_contract_json = ?", (encoded,))

    def create_invocation(self, *, session_id: str, kind: InvocationKind) -> InvocationRow:
        """Insert a ``running`` invocation of ``kind`` in a session."""
        _check_choice(kind, InvocationKind, "invocation kind")
        now = time.time()
        row = InvocationRow(_new_id(), session_id, kind, "running", now, now)
        self._write(
            "INSERT INTO invocations (id, session_id, kind, status, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (row.id, row.session_id, row.kind, row.status, row.created_at, row.updated_at),
        )
        return row

    def set_invocation_status(self, invocation_id: str, status: SessionStatus) -> None:
        """Set an invocation's status."""
        _check_choice(status, SessionStatus, "invocation status")
        sql = "UPDATE invocations SET status = ?, updated_at = ? WHERE id = ?"
        if self._write(sql, (status, time.time(), invocation_id)) != 1:
            raise UnknownIdError(f"unknown invocation id {invocation_id!r}")

    def create_play(self, *, session_id: str, invocation_id: str | None, playbook: str) -> PlayRow:
        """Insert a play (a playbook run) tied to its session and invocation."""
        row = PlayRow(_new_id(), session_id, invocation_id, playbook, time.time())
        self._write(
            "INSERT INTO plays (id, session_id, invocation_id, playbook, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (row.id, row.session_id, row.invocation_id, row.playbook, row.created_at),
        )
        return row

    def resolve_target(self, target: str) -> ResolvedTarget:
        """Resolve a session, invocation or play id, or a prefix, to its session.

        Sessions are searched first, then invocations, then plays. In the first
        table with any match, two or more matches are refused as ambiguous; a
        full 32-character id that matches exactly is taken without that check.

        Raises:
            UnknownIdError: The target is not 1-32 lowercase hex characters, or
                nothing matches it.
            AmbiguousIdError: The prefix matches several rows of one table.
        """
        if not isinstance(target, str) or not _HEX_ID.fullmatch(target):
            raise UnknownIdError(
                f"unknown id {quote_input(target)}: expected 1-32 lowercase hex characters"
            )
        with self.backend.transaction(write=False) as tx:
            for table, via in _TABLES:
                if len(target) == _ID_LEN:
                    rows = tx.query(f"SELECT id FROM {table} WHERE id = ?", (target,))
                else:  # the range keeps the primary-key index in use; substr is exact
                    rows = tx.query(
                        f"SELECT id FROM {table} WHERE id >= ? AND id < ?"
                        " AND substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
                        (target, target + "~", len(target), target, _MAX_CANDIDATES + 1),
                    )
                if len(rows) > 1:
                    shown = ", ".join(
                        [str(r["id"]) for r in rows[:_MAX_CANDIDATES]]
                        + (["..."] if len(rows) > _MAX_CANDIDATES else [])
                    )
                    raise AmbiguousIdError(
                        f"ambiguous id {quote_input(target)}: matches {table} {shown}"
                    )
                if rows:
                    return self._target_for(tx, via, str(rows[0]["id"]))
        raise UnknownIdError(
            f"unknown id {quote_input(target)}: no session, invocation or play matches"
        )

    @staticmethod
    def _target_for(tx: StateTransaction, via: TargetVia, matched: str) -> ResolvedTarget:
        row = tx.query(_TARGET_SQL[via], (matched,))[0]
        return ResolvedTarget(row["sid"], via, row["kind"], matched)

    def insert_control(
        self,
        *,
        session_id: str,
        verb: ControlVerb,
        payload: Mapping[str, Any] | None,
        require_running: bool = False,
        sender: str | None = None,
    ) -> ControlRow:
        """Queue a control: a uuid4-hex id, ``created_at`` now, not applied, no result.

        ``sender`` is stored as who queued it (``control.sender_id``'s form).

        With ``require_running`` the "session is running" check and the insert share one
        write transaction, and ``created_at`` is taken under that lock, strictly above the
        session's newest row. So the ``(created_at, id)`` order the poller applies is the
        order writers committed in (a timestamp taken before waiting for the lock would let
        a slower writer sort before a row already applied), and a session that finishes
        meanwhile either refuses the row or still sees it in its poller's final pass.

        Raises:
            RefusedError: ``require_running`` and the session no longer exists.
            NotRunningError: ``require_running`` and the session is not running.
        """
        _check_choice(verb, ControlVerb, "control verb")
        body = None if payload is None else dict(payload)
        with self.backend.transaction(write=True) as tx:
            # One writer per session at a time (SQLite: every writer), so created_at below
            # is taken in commit order, and a status change waits for this insert.
            self.backend.lock(tx, "session", session_id)
            created_at = time.time()
            if require_running:
                found = tx.query("SELECT * FROM sessions WHERE id = ?", (session_id,))
                if not found:
                    raise RefusedError(f"session {session_id} no longer exists")
                status = _effective_status(SessionRow.from_mapping(found[0]))
                if status != "running":
                    raise NotRunningError(
                        f"session {session_id} is {status}, not running: "
                        f"no consumer would apply the {verb}"
                    )
            row = _insert_control(tx, session_id, verb, body, created_at, sender)
        return row

    def redeliver_control(
        self, control_id: str, *, seen: str | None, to_session: str
    ) -> ControlRow | None:
        """Re-queue a message a dead process left behind as a new row of ``to_session``.

        In one write transaction: the old row, only if it still reads as it was ``seen``
        (``None``: pending; else its exact ``applying:<claimant>``), is stamped
        ``abandoned:redelivered:<new id>``, and a pending ``message`` row with the same
        text is inserted for ``to_session`` (payload ``{"text", "redelivered_from"}``),
        ``created_at`` above that session's newest row as for :meth:`insert_control`.

        Returns:
            The new row, or ``None`` (nothing written) when the old row is gone, is not a
            message, or changed since it was seen.
        """
        try:
            with self.backend.transaction(write=True) as tx:
                self.backend.lock(tx, "session", to_session)
                rows = tx.query(_CONTROL_BY_ID_SQL, (control_id,))
                old = ControlRow.from_mapping(rows[0]) if rows else None
                if old is None or old.verb != "message" or old.applied_at is not None:
                    return None
                if old.result != seen:
                    return None
                payload = old.payload if isinstance(old.payload, dict) else {}
                body = {"text": payload.get("text", ""), "redelivered_from": control_id}
                # The operator who sent it is still its sender; the re-queue is no new send.
                row = _insert_control(tx, to_session, "message", body, time.time(), old.sender)
                # Conditional again: on PostgreSQL another writer may have stamped the row
                # since the read above; then the insert is rolled back with it.
                changed = tx.execute(
                    "UPDATE session_controls SET applied_at = ?, result = ? WHERE id = ?"
                    " AND applied_at IS NULL AND COALESCE(result, '') = ?",
                    (time.time(), f"abandoned:redelivered:{row.id}", control_id, seen or ""),
                )
                if changed != 1:
                    raise _RowChangedError
        except _RowChangedError:
            return None
        return row

    def list_pending_controls(self, session_id: str) -> list[ControlRow]:
        """Unclaimed, unapplied controls of a session, oldest first by ``(created_at, id)``."""
        rows = self.backend.query(PENDING_CONTROLS_SQL, (session_id,))
        return [ControlRow.from_mapping(r) for r in rows]

    def list_controls(self, session_id: str) -> list[ControlRow]:
        """Every control of a session, oldest first by ``(created_at, id)``."""
        rows = self.backend.query(
            f"SELECT {_CONTROL_COLUMNS} FROM session_controls WHERE session_id = ?"
            " ORDER BY created_at, id",
            (session_id,),
        )
        return [ControlRow.from_mapping(r) for r in rows]

    def get_control(self, control_id: str) -> ControlRow | None:
        """The control with exactly this id, or ``None``."""
        rows = self.backend.query(_CONTROL_BY_ID_SQL, (control_id,))
        return ControlRow.from_mapping(rows[0]) if rows else None

    def count_controls(self) -> int:
        """Number of rows in ``session_controls``."""
        return int(self.backend.query("SELECT COUNT(*) AS n FROM session_controls")[0]["n"])

    def claim_control(self, control_id: str, claimant: str) -> bool:
        """Claim a pending control (``result = 'applying:<claimant>'``).

        Returns:
            ``True`` when this call took the claim; ``False`` when the row was
            already claimed, stamped, or does not exist.
        """
        sql = "UPDATE session_controls SET result = ? WHERE id = ?"
        sql += " AND result IS NULL AND applied_at IS NULL"
        return self._write(sql, (f"applying:{claimant}", control_id)) == 1

    def finalize_control(
        self, control_id: str, result: str, *, claimant: str | None = None
    ) -> bool:
        """Stamp ``result`` and ``applied_at`` on a row not yet stamped; return whether it was.

        Only an unclaimed row, or one claimed by ``claimant`` itself, is stamped: a consumer
        never overwrites another consumer's ``applying:`` claim.
        """
        sql = "UPDATE session_controls SET applied_at = ?, result = ? WHERE id = ?"
        sql += " AND applied_at IS NULL AND (result IS NULL OR result = ?)"
        claim = f"applying:{claimant}" if claimant is not None else None
        return self._write(sql, (time.time(), result, control_id, claim)) == 1

    def resolve_control(
        self, control_id: str, *, outcome: Literal["applied", "abandoned"], by: str | None = None
    ) -> ControlRow:
        """Record a human's verdict on a control left in ``applying`` (``ctl resolve``).

        Stores ``applied``, ``abandoned`` or ``abandoned:<by>`` and ``applied_at``.

        Raises:
            UnknownIdError: No control has this id.
            ControlNotApplyingError: The row is pending or already terminal; it
                is left unchanged.
        """
        _check_choice(outcome, Literal["applied", "abandoned"], "outcome")
        result = f"abandoned:{by}" if outcome == "abandoned" and by else outcome
        with self.backend.transaction(write=True) as tx:
            rows = tx.query(_CONTROL_BY_ID_SQL, (control_id,))
            if not rows:
                raise UnknownIdError(f"unknown control id {quote_input(control_id)}")
            current = ControlRow.from_mapping(rows[0])
            if not current.is_applying:
                state = "pending" if current.result is None else f"result {current.result!r}"
                raise ControlNotApplyingError(
                    f"control {control_id} is not applying ({state}); nothing changed"
                )
            now = time.time()
            tx.execute(
                "UPDATE session_controls SET applied_at = ?, result = ?"
                " WHERE id = ? AND applied_at IS NULL AND substr(result, 1, 8) = 'applying'",
                (now, result, control_id),
            )
        return ControlRow(current.id, current.session_id, current.verb, current.payload,
                          current.created_at, now, result, current.sender)  # fmt: skip

    def upsert_nodes(
        self, session_id: str, rows: Sequence[NodeUpdate], *, epoch: int | None = None
    ) -> None:
        """Publish node statuses in one transaction.

        A ``None`` ``node_id`` or ``assignee`` keeps the stored value; ``detail``
        always replaces it. With ``epoch`` the transaction first checks that the
        session still holds its lease at that epoch (decision 120).

        Raises:
            LeaseLostError: ``epoch`` was given and the lease was taken over; nothing
                was written.
            StateDBLostError: ``epoch`` was given and the session's row is gone.
        """
        now = time.time()
        with self.backend.transaction(write=True) as tx:
            self._fence(tx, session_id, epoch)
            for node in rows:
                tx.execute(
                    "INSERT INTO session_nodes (session_id, node_key, kind, node_id, assignee,"
                    " status, updated_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (session_id, node_key) DO UPDATE SET kind = excluded.kind,"
                    " node_id = COALESCE(excluded.node_id, session_nodes.node_id),"
                    " assignee = COALESCE(excluded.assignee, session_nodes.assignee),"
                    " status = excluded.status, updated_at = excluded.updated_at,"
                    " detail = excluded.detail",
                    (session_id, node.node_key, node.kind, node.node_id, node.assignee,
                     node.status, now, None if node.detail is None else dump_json(node.detail)),
                )  # fmt: skip

    def node_counts(self, session_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Session id -> node status -> how many published nodes have it (one query)."""
        if not session_ids:
            return {}
        marks = ", ".join("?" for _ in session_ids)
        rows = self.backend.query(
            "SELECT session_id, status, COUNT(*) AS n FROM session_nodes"
            f" WHERE session_id IN ({marks}) GROUP BY session_id, status",
            tuple(session_ids),
        )
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            out.setdefault(str(r["session_id"]), {})[str(r["status"])] = int(r["n"])
        return out

    def started_details(
        self, session_id: str, *, limit: int, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Details of the session's started nodes (not pending or paused), by ``node_key``."""
        rows = self.backend.query(
            "SELECT detail FROM session_nodes WHERE session_id = ?"
            " AND status NOT IN ('pending', 'paused') ORDER BY node_key LIMIT ? OFFSET ?",
            (session_id, limit, offset),
        )
        return [load_json(r["detail"]) or {} for r in rows]

    def last_node_update(self, session_id: str) -> float | None:
        """When a node of the session was last published, None when none was."""
        rows = self.backend.query(
            "SELECT MAX(updated_at) AS at FROM session_nodes WHERE session_id = ?", (session_id,)
        )
        at = rows[0]["at"] if rows else None
        return None if at is None else float(at)

    def list_nodes(
        self,
        session_id: str,
        *,
        keys: Sequence[str] | None = None,
        kind: NodeKind | None = None,
        detail: bool = True,
    ) -> list[NodeRow]:
        """Published node statuses of a session, by ``node_key``.

        ``keys`` limits the rows to those nodes (looked up by primary key), ``kind`` to
        planned or spawned ones; ``detail=False`` leaves ``detail`` unread (None), which on
        a 10,000-node run is most of the cost.
        """
        columns = "*" if detail else _NODE_COLUMNS_NO_DETAIL
        sql = f"SELECT {columns} FROM session_nodes WHERE session_id = ?"
        params: tuple[object, ...] = (session_id,)
        if kind is not None:
            sql, params = sql + " AND kind = ?", (session_id, kind)
        if keys is None:
            rows = self.backend.query(sql + " ORDER BY node_key", params)
            return [NodeRow.from_mapping(r) for r in rows]
        found: list[NodeRow] = []
        wanted = sorted(set(keys))
        for start in range(0, len(wanted), _KEYS_PER_QUERY):
            chunk = wanted[start : start + _KEYS_PER_QUERY]
            marks = ", ".join("?" for _ in chunk)
            rows = self.backend.query(f"{sql} AND node_key IN ({marks})", (*params, *chunk))
            found += (NodeRow.from_mapping(r) for r in rows)
        return sorted(found, key=lambda row: row.node_key)

    def effective_status(self, row: SessionRow, *, now: float | None = None) -> SessionStatus:
        """``running`` with a dead owner reads ``interrupted`` (see ``state.effective_status``)."""
        return _effective_status(row, now=now)

    def mark_interrupted_if_dead(self, session_id: str) -> bool:
        """Store ``interrupted`` for a ``running`` session whose owner is dead.

        The update is conditional on the row still being ``running`` with the
        same owner and heartbeat that were judged, so a racing heartbeat wins.

        Returns:
            Whether the row changed.
        """
        row = self.get_session(session_id)
        if row is None or row.status != "running":
            return False
        if owner_alive(row.owner_host, row.owner_pid, row.owner_started, row.heartbeat_at):
            return False
        sql = (
            "UPDATE sessions SET status = 'interrupted', updated_at = ? WHERE id = ?"
            " AND status = 'running' AND COALESCE(owner_pid, -1) = ?"
            " AND COALESCE(heartbeat_at, -1.0) = ?"
        )
        pid = -1 if row.owner_pid is None else row.owner_pid
        beat = -1.0 if row.heartbeat_at is None else row.heartbeat_at
        with self.backend.transaction(write=True) as tx:
            self.backend.lock(tx, "session", session_id)
            return tx.execute(sql, (time.time(), session_id, pid, beat)) == 1
