"""The SQLite backend of the state database: the only module that imports ``sqlite3``.

Everything specific to SQLite lives here: creating the file with mode 0600,
WAL mode, the busy timeout, ``BEGIN IMMEDIATE`` for writers, read-only URI
opens, ``PRAGMA data_version``, schema introspection, and the translation of
``sqlite3`` errors into steerflow's error classes (a lock wait that runs past
the busy timeout becomes :class:`~steerflow.errors.DatabaseBusyError`).

One :class:`SqliteBackend` holds one connection, opened with
``check_same_thread=False`` and guarded by a lock, so the synchronous
:class:`~steerflow.state.StateDB` methods may be called from worker threads
(``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from steerflow.errors import (
    DatabaseBusyError,
    RefusedError,
    SteerflowError,
    UsageError,
    quote_input,
)
from steerflow.home import make_private_dirs
from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL, Migration, StateTransaction

__all__ = ["SqliteBackend", "SqliteTransaction", "sqlite_path_from_url"]

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8


_EXPECTED = "expected a state database URL sqlite:///PATH or postgresql://..."
_PREFIX = "sqlite:///"


def _bad_url(url: str, why: str) -> UsageError:
    return UsageError(f"invalid state database URL {quote_input(url)}: {why}")


def sqlite_path_from_url(url: str) -> Path:
    """The database file named by a ``sqlite:///PATH`` URL, as an absolute path.

    As in SQLAlchemy: three slashes and a relative path (``sqlite:///rel/x.db``) name a
    file relative to the current directory, four (``sqlite:////abs/x.db``) an absolute
    one. The path is percent-decoded; a query, a fragment, a host, an empty path, a
    directory (a trailing slash) or a NUL byte is refused.

    A relative URL whose file is missing while the same text read as an absolute path
    names an existing file (``sqlite:///srv/state.db`` and ``/srv/state.db``) is refused
    too, naming both spellings: before this convention such a URL meant the absolute
    file, and opening a new, empty database in the current directory instead would hide
    every run it holds (docs/decisions.md). ``sqlite:///./srv/state.db`` is relative
    without that doubt.

    Raises:
        UsageError: The URL is not of that form, or is ambiguous as above.
    """
    if url[: len(_PREFIX)].lower() != _PREFIX:
        if url[:7].lower() == "sqlite:":
            how = f"write {_PREFIX}relative/path or {_PREFIX}/absolute/path (no host)"
            raise _bad_url(url, how)
        raise UsageError(f"{_EXPECTED}, got {quote_input(url)}")
    rest = url[len(_PREFIX) :]
    if "?" in rest or "#" in rest:
        raise _bad_url(url, "a query or fragment is not supported (write ? as %3F, # as %23)")
    try:
        text = unquote(rest, errors="strict")
    except UnicodeDecodeError:
        raise _bad_url(url, "its percent-encoding is not UTF-8") from None
    if not text:
        raise _bad_url(url, "it names no file")
    if "\x00" in text:
        raise _bad_url(url, "the path holds a NUL byte")
    if text.endswith("/") or text.rsplit("/", 1)[-1] in (".", ".."):
        raise _bad_url(url, "the path names a directory, not a database file")
    path = Path(text)
    if os.path.isdir(path):
        raise _bad_url(url, f"{str(path.absolute())!r} is a directory, not a database file")
    if path.is_absolute():
        return path
    relative = path.absolute()
    legacy = Path("/" + text)
    # ./ and ../ say "relative" in so many words: only a bare relative path is ambiguous.
    explicit = text.startswith(("./", "../"))
    if not explicit and not os.path.lexists(relative) and os.path.isfile(legacy):
        raise _bad_url(
            url,
            f"three slashes name a path relative to the current directory ({str(relative)!r}, "
            f"which does not exist), but {str(legacy)!r} does: for that file write "
            f"sqlite:///{quote(str(legacy))}, for the relative one sqlite:///./{rest}",
        )
    return relative


def _ensure_private_dir(directory: Path) -> None:
    """Create ``directory`` (and parents) when missing; chmod 0700 only what we created."""
    if directory.is_dir():
        return
    make_private_dirs(directory)  # each missing parent 0700 too, whatever the umask
    directory.chmod(_DIR_MODE)


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _is_busy(exc: sqlite3.Error) -> bool:
    if _primary_code(exc) in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return True
    message = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)


def _is_read_only(exc: sqlite3.Error) -> bool:
    return _primary_code(exc) == _SQLITE_READONLY or "readonly database" in str(exc).lower()


def _chmod_private(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.exists() and (path.stat().st_mode & 0o777) != _FILE_MODE:
            path.chmod(_FILE_MODE)


class SqliteTransaction:
    """Statements run inside one open transaction of a :class:`SqliteBackend`."""

    def __init__(self, backend: SqliteBackend) -> None:
        self._backend = backend

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run one parameterised statement and return its rows as dicts."""
        return self._backend._run_query(sql, params)

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run one parameterised write statement and return its row count."""
        return self._backend._run_execute(sql, params)


class SqliteBackend:
    """One SQLite connection to a state database file.

    Attributes:
        path: The database file.
        read_only: Whether the connection was opened ``mode=ro``.
        busy_timeout_s: Bound on every lock wait.
    """

    def __init__(
        self, connection: sqlite3.Connection, path: Path, *, read_only: bool, busy_timeout_s: float
    ) -> None:
        self._conn = connection
        self._lock = threading.RLock()
        self._closed = False
        self.path = path
        self.read_only = read_only
        self.busy_timeout_s = busy_timeout_s

    @classmethod
    def open(
        cls, path: Path, *, create: bool, read_only: bool, busy_timeout_s: float
    ) -> SqliteBackend:
        """Open (and, when allowed, create) the database file at ``path``.

        Args:
            path: The database file.
            create: Create the file (mode 0600), and its directory (mode 0700),
                when missing.
            read_only: Open with a ``mode=ro`` URI: the file and its directory are
                never created and nothing is written. (SQLite itself may create the
                ``-wal``/``-shm`` side files, with the file's mode: a WAL reader needs them.)
            busy_timeout_s: Bound on every lock wait, in seconds.

        Raises:
            RefusedError: The file is missing and may not be created.
            DatabaseBusyError: Switching to WAL mode waited past the bound.
        """
        if busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        if path.is_dir():
            raise UsageError(f"state database {str(path)!r} is a directory, not a database file")
        if not path.exists():
            if read_only or not create:
                raise RefusedError(f"no state database at {path}")
            if path.is_symlink():
                # SQLite would create the link's target with the umask's mode, not 0600,
                # somewhere the link chose: create only files we name ourselves.
                raise RefusedError(
                    f"state database {path} is a symbolic link to a missing file; "
                    "refusing to create a database through it"
                )
            _ensure_private_dir(path.parent)
            with contextlib.suppress(FileExistsError):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, _FILE_MODE)
                try:
                    os.fchmod(fd, _FILE_MODE)
                finally:
                    os.close(fd)
        try:
            if read_only:
                target, uri = path.absolute().as_uri() + "?mode=ro", True
            else:
                target, uri = str(path), False
            conn = sqlite3.connect(
                target,
                timeout=busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
                uri=uri,
            )
        except sqlite3.Error as exc:
            raise SteerflowError(f"cannot open state database at {path}: {exc}") from exc
        conn.row_factory = _dict_row
        backend = cls(conn, path, read_only=read_only, busy_timeout_s=busy_timeout_s)
        try:
            backend._configure()
        except BaseException:
            conn.close()
            raise
        return backend

    def _configure(self) -> None:
        with self._translate():
            self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            if not self.read_only:
                self._conn.execute("PRAGMA journal_mode = WAL").fetchall()
        if not self.read_only:
            for suffix in ("-wal", "-shm"):
                _chmod_private(self.path.with_name(self.path.name + suffix))

    @property
    def location(self) -> str:
        """The database file, as text for messages."""
        return str(self.path)

    def identity(self) -> tuple[object, ...]:
        """The device and inode of the file, links followed: one file, however it is named.

        Raises:
            SteerflowError: The file cannot be looked at.
        """
        try:
            found = os.stat(self.path)
        except OSError as exc:
            raise SteerflowError(
                f"cannot look at the state database {self.path}: {exc.strerror}"
            ) from exc
        return ("sqlite", found.st_dev, found.st_ino)

    @property
    def clock_sql(self) -> str:
        """This host's clock, read by SQLite itself (millisecond resolution)."""
        return "((julianday('now') - 2440587.5) * 86400.0)"

    @property
    def migrations(self) -> tuple[Migration, ...]:
        """The schema steps (written for SQLite)."""
        return MIGRATIONS

    @property
    def schema_version_ddl(self) -> str:
        """The ``schema_version`` table."""
        return SCHEMA_VERSION_DDL

    def lock(self, tx: StateTransaction, scope: str, key: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already serializes every write transaction."""

    def lock_for_migration(self, tx: StateTransaction) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already serializes every write transaction."""

    def watch_controls(self, session_id: str, callback: Callable[[], None]) -> None:
        """SQLite has no notifications: readers poll :meth:`data_version`."""
        return None

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise DatabaseBusyError(
                    f"database busy: {self.path} (lock wait exceeded {self.busy_timeout_s:g} s)"
                ) from exc
            if _is_read_only(exc):
                raise RefusedError(f"state database is read-only: {self.path}") from exc
            raise SteerflowError(f"state database error at {self.path}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise SteerflowError(f"state database is closed: {self.path}")

    def _run_query(self, sql: str, params: Sequence[object]) -> list[dict[str, Any]]:
        with self._lock:
            self._check_open()
            with self._translate():
                rows: list[dict[str, Any]] = self._conn.execute(sql, tuple(params)).fetchall()
                return rows

    def _run_execute(self, sql: str, params: Sequence[object]) -> int:
        with self._lock:
            self._check_open()
            with self._translate():
                return self._conn.execute(sql, tuple(params)).rowcount

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run one read statement outside any explicit transaction."""
        return self._run_query(sql, params)

    @contextlib.contextmanager
    def transaction(self, *, write: bool) -> Iterator[SqliteTransaction]:
        """Hold the connection for one transaction.

        Writers start with ``BEGIN IMMEDIATE`` so the write lock is taken (or the
        busy timeout runs out) up front, never half-way through; readers get a
        deferred ``BEGIN`` and one consistent snapshot. The transaction commits
        when the block ends and rolls back when it raises.

        Args:
            write: Take the write lock at the start.

        Raises:
            DatabaseBusyError: The lock wait ran past the busy timeout.
            RefusedError: A write on a read-only connection.
        """
        if write and self.read_only:
            raise RefusedError(f"state database is read-only: {self.path}")
        with self._lock:
            self._check_open()
            with self._translate():
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield SqliteTransaction(self)
                with self._translate():
                    self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        """The highest applied migration, or 0 when the bookkeeping table is missing."""
        tables = self._run_query(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
            ("schema_version",),
        )
        if not tables:
            return 0
        rows = self._run_query("SELECT MAX(version) AS version FROM schema_version", ())
        version = rows[0]["version"] if rows else None
        return int(version) if version is not None else 0

    def data_version(self) -> int:
        """``PRAGMA data_version`` of this connection.

        The value changes when another connection (in this or another process)
        commits a change to the file; this connection's own commits and reads
        leave it unchanged.
        """
        rows = self._run_query("PRAGMA data_version", ())
        return int(next(iter(rows[0].values())))

    def close(self) -> None:
        """Close the connection; later calls raise. Closing twice is harmless."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
