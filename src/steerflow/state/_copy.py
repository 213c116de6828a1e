"""``steerflow db copy --to URL``: move a home's state database to another one.

Every row of every state table is upserted by primary key into the target, in one write
transaction, parents before children. The source is authoritative for its own rows, so a
row already in the target is brought up to date, and copying again changes nothing more:
the copy is idempotent, and one cut short (it rolls back) is simply run again.

A target is refused when it holds a session the source does not have (it is another
home's database) unless ``merge`` is asked for; then both homes' rows live side by side
(ids are uuid4: the sets never collide).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from steerflow.errors import RefusedError
from steerflow.state._db import StateDB
from steerflow.state._pg_admission import is_postgres_url
from steerflow.state._sqlite import sqlite_path_from_url

__all__ = ["COPY_TABLES", "CopyReport", "copy_state", "open_copy_target"]

COPY_TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sessions", ("id",)),
    ("invocations", ("id",)),
    ("plays", ("id",)),
    ("session_controls", ("id",)),
    ("session_nodes", ("session_id", "node_key")),
    ("resume_claims", ("session_id",)),
)
"""The tables copied, parents first, with their primary keys."""

_SHOWN = 5
_COLUMN = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class CopyReport:
    """What a copy did.

    Attributes:
        source: Where the rows came from (a path or a URL without its password).
        target: Where they went.
        rows: Rows upserted per table.
        foreign_sessions: Sessions in the target that the source does not have.
    """

    source: str
    target: str
    rows: dict[str, int]
    foreign_sessions: int

    def to_json(self) -> dict[str, object]:
        """The JSON form ``db copy --json`` prints."""
        return {
            "source": self.source,
            "target": self.target,
            "rows": dict(self.rows),
            "foreign_sessions": self.foreign_sessions,
        }


def _upsert_sql(table: str, columns: list[str], key: tuple[str, ...]) -> str:
    marks = ", ".join("?" for _ in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


def _itself(source: StateDB, target: str) -> RefusedError:
    return RefusedError(
        f"db copy: the source and the target are the same database: {target} is "
        f"{source.location}; nothing was copied"
    )


def open_copy_target(source: StateDB, url: str) -> StateDB:
    """Open (creating when missing) the target ``url`` of a copy from ``source``.

    A SQLite target that is the source's file (a link to it, another spelling of its
    path, a hard link) is refused before it is opened for writing; any other target is
    checked again, by identity, when :func:`copy_state` runs.

    Raises:
        RefusedError: The target is the source.
        UsageError: ``url`` is malformed.
    """
    if not is_postgres_url(url) and source.path is not None:
        path = sqlite_path_from_url(url)
        with contextlib.suppress(OSError):  # a missing target cannot be the source
            if os.path.samefile(path, source.path):
                raise _itself(source, str(path))
    return StateDB.open_url(url, create=True)


def copy_state(source: StateDB, target: StateDB, *, merge: bool = False) -> CopyReport:
    """Copy every state row of ``source`` into ``target`` (see the module doc).

    Raises:
        RefusedError: Source and target are the same database (by identity: the SQLite
            file's device and inode; the PostgreSQL server, database and ``sessions``
            table; see ``StateBackend.identity``); or ``target`` holds
            sessions ``source`` does not have and ``merge`` is false. Nothing is written.
        DatabaseBusyError: A lock wait on either side ran past its bound.
    """
    # By identity, not by spelling: a link, ``H/../H/state.db``, four slashes, another
    # host name for the same server all name the database being read.
    if source.location == target.location or source.backend.identity() == (
        target.backend.identity()
    ):
        raise _itself(source, target.location)
    with source.backend.transaction(write=False) as reader:
        data = {table: reader.query(f"SELECT * FROM {table}") for table, _ in COPY_TABLES}
    for table, rows in data.items():
        # Column names go into the INSERT's text (values are parameters): a source file
        # edited by hand must not be able to put SQL there.
        odd = sorted({c for row in rows for c in row if not _COLUMN.fullmatch(c)})
        if odd:
            raise RefusedError(
                f"db copy: the source's table {table} has a column named {odd[0]!r},"
                " which no steerflow schema has; nothing was copied"
            )
    ours = {str(row["id"]) for row in data["sessions"]}
    counts: dict[str, int] = {}
    with target.backend.transaction(write=True) as tx:
        theirs = [str(r["id"]) for r in tx.query("SELECT id FROM sessions ORDER BY id")]
        foreign = [sid for sid in theirs if sid not in ours]
        if foreign and not merge:
            shown = ", ".join(foreign[:_SHOWN]) + (", ..." if len(foreign) > _SHOWN else "")
            raise RefusedError(
                f"db copy: {target.location} is not empty: it holds {len(foreign)} session(s)"
                f" this home does not ({shown}); pass --merge to add this home's rows to them"
            )
        for table, key in COPY_TABLES:
            rows = data[table]
            for row in rows:
                columns = list(row)
                tx.execute(_upsert_sql(table, columns, key), [row[c] for c in columns])
            counts[table] = len(rows)
    return CopyReport(source.location, target.location, counts, len(foreign))
