"""Tables, numbered migrations and typed rows of the state database.

The DDL below is written in the subset of SQL that SQLite and PostgreSQL share
(``TEXT``, ``REAL``, ``INTEGER``, ``JSON``, ``CHECK``, foreign keys, partial
indexes), so a second backend can apply the same migrations. Everything that
only SQLite understands (pragmas, ``BEGIN IMMEDIATE``, URI file names) lives in
:mod:`steerflow.state._sqlite`.

Migrations are numbered from 1 and applied in order, each in one write
transaction that also records its number in ``schema_version``. A migration is
never edited once released: a change to the schema is a new entry at the end of
:data:`MIGRATIONS`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import MISSING, dataclass, fields
from typing import Any, Protocol, TypeVar

from steerflow.errors import RefusedError
from steerflow.state._owner import Owner
from steerflow.state._vocab import (
    ControlVerb,
    InvocationKind,
    NodeKind,
    NodeStatus,
    Phase,
    SessionStatus,
    TargetVia,
)

__all__ = [
    "LEASE_COLUMNS_DDL",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_DDL",
    "SESSION_CONTROLS_DDL",
    "SESSION_CONTROLS_PENDING_INDEX_DDL",
    "ControlRow",
    "ControlVerb",
    "InvocationKind",
    "InvocationRow",
    "Migration",
    "NodeKind",
    "NodeRow",
    "NodeStatus",
    "NodeUpdate",
    "Phase",
    "PlayRow",
    "ResolvedTarget",
    "SessionRow",
    "SessionStatus",
    "StateBackend",
    "StateTransaction",
    "TargetVia",
    "dump_json",
    "load_json",
    "migrate",
]

SCHEMA_VERSION_DDL = """\
CREATE TABLE IF NOT EXISTS schema_version (
  version     INTEGER PRIMARY KEY,
  applied_at  REAL NOT NULL,
  description TEXT NOT NULL
)"""
"""The bookkeeping table; created before any migration runs."""

SESSIONS_DDL = """\
CREATE TABLE sessions (
  id                     TEXT PRIMARY KEY,
  kind                   TEXT NOT NULL CHECK(kind IN ('flow', 'play', 'agent')),
  status                 TEXT NOT NULL
                           CHECK(status IN ('running', 'completed', 'failed',
                                            'timed_out', 'interrupted')),
  phase                  TEXT NOT NULL DEFAULT 'planning'
                           CHECK(phase IN ('planning', 'executing', 'paused')),
  created_at             REAL NOT NULL,
  updated_at             REAL NOT NULL,
  node_metadata          JSON NOT NULL DEFAULT '{}',
  artifact_contract_json TEXT,
  prompt                 TEXT,
  run_id                 TEXT,
  owner_host             TEXT,
  owner_pid              INTEGER,
  owner_started          REAL,
  heartbeat_at           REAL
)"""

INVOCATIONS_DDL = """\
CREATE TABLE invocations (
  id          TEXT PRIMARY KEY,
  session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  kind        TEXT NOT NULL CHECK(kind IN ('flow', 'play', 'agent')),
  status      TEXT NOT NULL,
  created_at  REAL NOT NULL,
  updated_at  REAL NOT NULL
)"""

PLAYS_DDL = """\
CREATE TABLE plays (
  id             TEXT PRIMARY KEY,
  session_id     TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  invocation_id  TEXT REFERENCES invocations(id) ON DELETE CASCADE,
  playbook       TEXT NOT NULL,
  created_at     REAL NOT NULL
)"""

# The exact contract of ADR-0069 D1 (CONTRACT §2): columns, CHECK, cascade, partial index.
SESSION_CONTROLS_DDL = """\
CREATE TABLE session_controls (
  id          TEXT PRIMARY KEY,
  session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  verb        TEXT NOT NULL CHECK(verb IN ('pause', 'resume', 'message', 'stop')),
  payload     JSON,
  created_at  REAL NOT NULL,
  applied_at  REAL,
  result      TEXT
)"""

SESSION_CONTROLS_PENDING_INDEX_DDL = """\
CREATE INDEX idx_session_controls_pending
  ON session_controls(session_id, applied_at) WHERE applied_at IS NULL"""

SESSION_NODES_DDL = """\
CREATE TABLE session_nodes (
  session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  node_key    TEXT NOT NULL,
  kind        TEXT NOT NULL CHECK(kind IN ('planned', 'spawned')),
  node_id     TEXT,
  assignee    TEXT,
  status      TEXT NOT NULL,
  updated_at  REAL NOT NULL,
  detail      JSON,
  PRIMARY KEY (session_id, node_key)
)"""

# One row per resume of a source run, written in the same write transaction as the
# resumed session, so the check "who already resumes this source" and the claim are
# one atomic step (docs/decisions.md: one resume per source). The source is a run
# id, not a session: a run directory may have no session row (a copied or hand-made
# checkpoint).
RESUME_CLAIMS_DDL = """\
CREATE TABLE resume_claims (
  session_id     TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
  source_run_id  TEXT NOT NULL,
  fork           INTEGER NOT NULL DEFAULT 0 CHECK(fork IN (0, 1)),
  created_at     REAL NOT NULL
)"""


@dataclass(frozen=True)
class Migration:
    """One numbered step of the schema.

    Attributes:
        version: Position of the step, starting at 1, without gaps.
        description: One line recorded in ``schema_version``.
        statements: DDL statements applied in order inside one transaction.
        apply: A step that needs values read inside the transaction (run after
            ``statements``, in the same transaction).
    """

    version: int
    description: str
    statements: tuple[str, ...]
    apply: Callable[[StateTransaction], None] | None = None


_STATUS_CHECK_V1 = "'timed_out', 'interrupted')"
_STATUS_CHECK_V3 = "'timed_out', 'interrupted', 'stopped')"


def _widen_checks(tx: StateTransaction, edits: tuple[tuple[str, str, str], ...], what: str) -> None:
    """Replace ``old`` by ``new`` in each ``(table, old, new)``'s stored CHECK, in place.

    SQLite cannot alter a CHECK, and rebuilding a table would cascade-delete every child
    row while foreign keys are on (they cannot be turned off inside the migration's
    transaction). A widened CHECK accepts every stored row, so the stored DDL is edited
    in place, the documented procedure for loosening a constraint; bumping
    ``schema_version`` makes every connection re-read it. A definition edited by hand is
    refused (the transaction rolls back) rather than a migration recorded whose CHECK
    would still refuse the new values. PostgreSQL drops and re-adds the constraint.
    """
    version = int(tx.query("PRAGMA schema_version")[0]["schema_version"])
    tx.execute("PRAGMA writable_schema = ON")
    try:
        for table, old, new in edits:
            tx.execute(
                "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table'"
                " AND name = ?",
                (old, new, table),
            )
            stored = tx.query(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            )
            if not stored or new not in str(stored[0]["sql"]):
                raise RefusedError(
                    f"state database: the {table} table's CHECK has an unexpected"
                    f" definition; cannot {what}"
                )
        tx.execute(f"PRAGMA schema_version = {version + 1}")
    finally:
        tx.execute("PRAGMA writable_schema = OFF")


def _allow_stopped_status(tx: StateTransaction) -> None:
    """Widen ``sessions.status``'s CHECK by ``stopped`` (the status of ``ctl stop``)."""
    edit = ("sessions", _STATUS_CHECK_V1, _STATUS_CHECK_V3)
    _widen_checks(tx, (edit,), "add 'stopped' (schema migration 3)")


_STATUS_CHECK_V5 = "'timed_out', 'interrupted', 'stopped', 'budget_exhausted')"
_VERB_CHECK_V1 = "('pause', 'resume', 'message', 'stop')"
_VERB_CHECK_V5 = "('pause', 'resume', 'message', 'stop', 'budget')"


def _allow_budget(tx: StateTransaction) -> None:
    """Widen ``sessions.status`` by ``budget_exhausted`` and the control verbs by ``budget``."""
    edits = (
        ("sessions", _STATUS_CHECK_V3, _STATUS_CHECK_V5),
        ("session_controls", _VERB_CHECK_V1, _VERB_CHECK_V5),
    )
    _widen_checks(tx, edits, "widen it for budgets (schema migration 6)")


_VERB_CHECK_V8 = "('pause', 'resume', 'message', 'stop', 'budget', 'approve', 'deny')"


def _allow_approvals(tx: StateTransaction) -> None:
    """Widen the control verbs by ``approve`` and ``deny`` (issue 41), as migration 6 did."""
    edit = ("session_controls", _VERB_CHECK_V5, _VERB_CHECK_V8)
    _widen_checks(tx, (edit,), "widen it for approvals (schema migration 8)")


# The session's lease (docs/decisions.md, decision 120): the fencing token its owner holds,
# when the lease runs out by the database's own clock, and who took it over. A resume bumps
# the epoch of the session it takes over in the transaction that creates its own session,
# so every write the old owner fences on ``lease_epoch = <its epoch>`` matches no row after.
LEASE_COLUMNS_DDL = (
    "ALTER TABLE sessions ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE sessions ADD COLUMN lease_expires REAL",
    "ALTER TABLE sessions ADD COLUMN lease_taken_by TEXT",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="sessions, invocations, plays, session_controls, session_nodes",
        statements=(
            SESSIONS_DDL,
            "CREATE INDEX idx_sessions_created ON sessions(created_at, id)",
            "CREATE INDEX idx_sessions_run_id ON sessions(run_id)",
            INVOCATIONS_DDL,
            "CREATE INDEX idx_invocations_session ON invocations(session_id)",
            PLAYS_DDL,
            "CREATE INDEX idx_plays_session ON plays(session_id)",
            SESSION_CONTROLS_DDL,
            SESSION_CONTROLS_PENDING_INDEX_DDL,
            SESSION_NODES_DDL,
        ),
    ),
    Migration(
        version=2,
        description="resume_claims: one resume per source run",
        statements=(
            RESUME_CLAIMS_DDL,
            "CREATE INDEX idx_resume_claims_source ON resume_claims(source_run_id, created_at)",
        ),
    ),
    Migration(
        version=3,
        description="sessions.status accepts 'stopped' (ctl stop)",
        statements=(),
        apply=_allow_stopped_status,
    ),
    Migration(
        version=4,
        description="sessions.lease_epoch, lease_expires, lease_taken_by: leases with fencing",
        statements=LEASE_COLUMNS_DDL,
    ),
    Migration(
        version=5,
        description="sessions.name: the run's name (plan, playbook or prompt line)",
        statements=("ALTER TABLE sessions ADD COLUMN name TEXT",),
    ),
    Migration(
        version=6,
        description="sessions.status accepts 'budget_exhausted', controls the verb 'budget'",
        statements=(),
        apply=_allow_budget,
    ),
    Migration(
        version=7,
        description="session_controls.sender: who queued each control",
        statements=("ALTER TABLE session_controls ADD COLUMN sender TEXT",),
    ),
    Migration(
        version=8,
        description="session_controls accepts the verbs 'approve' and 'deny' (approvals)",
        statements=(),
        apply=_allow_approvals,
    ),
)
"""Every migration, oldest first."""

SCHEMA_VERSION: int = MIGRATIONS[-1].version
"""The schema version this code writes and expects."""


def dump_json(value: object) -> str:
    """Encode ``value`` as compact, key-sorted JSON for a JSON/TEXT column."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def load_json(value: object) -> Any:
    """Decode a JSON column value; ``None`` stays ``None``.

    SQLite gives a column declared ``JSON`` numeric affinity, so a document that
    is a bare number may come back as a number rather than text.
    """
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return json.loads(str(value))


_RowT = TypeVar("_RowT")


def _build(cls: type[_RowT], row: Mapping[str, Any], **decoded: Any) -> _RowT:
    """Build dataclass ``cls`` from a ``column -> value`` mapping, with decoded overrides.

    A field with a default may be missing from the mapping (a row selected with an
    explicit column list that predates the column).
    """
    values = {
        f.name: row[f.name]
        for f in fields(cls)  # type: ignore[arg-type]
        if f.name not in decoded and (f.name in row or f.default is MISSING)
    }
    return cls(**values, **decoded)


def _json_object(value: object) -> dict[str, Any] | None:
    decoded = load_json(value)
    return decoded if isinstance(decoded, dict) else None


@dataclass(frozen=True)
class SessionRow:
    """One row of ``sessions``.

    Attributes:
        id: 32 lowercase hex characters.
        kind: ``flow``, ``play`` or ``agent``.
        status: The stored status; :func:`steerflow.state.effective_status` also
            accounts for a dead owner.
        phase: ``planning``, ``executing`` or ``paused``.
        created_at: Epoch seconds.
        updated_at: Epoch seconds of the last change to the row.
        node_metadata: Decoded JSON object (``run_id``, ``resumed_from``, control log, ...).
        artifact_contract_json: The stored artifact contract as JSON text, or ``None``.
        prompt: The prompt the session was started with, if any.
        run_id: The run id, if one was assigned.
        owner_host: Host name of the owning process.
        owner_pid: Process id of the owning process.
        owner_started: Start time (epoch seconds) of the owning process.
        heartbeat_at: Epoch seconds of the owner's last heartbeat.
        lease_epoch: The fencing token of the session's lease; a takeover raises it.
        lease_expires: When the lease runs out, in the database's clock (epoch seconds).
        lease_taken_by: The session that took the lease over, if one did.
        name: The run's name: plan ``name``, playbook name, else the prompt's first line.
    """

    id: str
    kind: InvocationKind
    status: SessionStatus
    phase: Phase
    created_at: float
    updated_at: float
    node_metadata: dict[str, Any]
    artifact_contract_json: str | None
    prompt: str | None
    run_id: str | None
    owner_host: str | None
    owner_pid: int | None
    owner_started: float | None
    heartbeat_at: float | None
    lease_epoch: int = 1
    lease_expires: float | None = None
    lease_taken_by: str | None = None
    #: The run's name (``run_name``); None for a row written before migration 5.
    name: str | None = None

    @property
    def artifact_contract(self) -> Any:
        """The decoded artifact contract, or ``None`` when none was stored."""
        return load_json(self.artifact_contract_json)

    @property
    def owner(self) -> Owner | None:
        """The owning process, or ``None`` when the row records none."""
        if self.owner_host is None or self.owner_pid is None:
            return None
        return Owner(host=self.owner_host, pid=self.owner_pid, started_at=self.owner_started)

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> SessionRow:
        """Build a row from a ``column -> value`` mapping."""
        return _build(cls, row, node_metadata=_json_object(row["node_metadata"]) or {})


@dataclass(frozen=True)
class InvocationRow:
    """One row of ``invocations``: a ``flow``, ``play`` or ``agent`` call inside a session."""

    id: str
    session_id: str
    kind: InvocationKind
    status: SessionStatus
    created_at: float
    updated_at: float

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> InvocationRow:
        """Build a row from a ``column -> value`` mapping."""
        return _build(cls, row)


@dataclass(frozen=True)
class PlayRow:
    """One row of ``plays``: a playbook run, tied to its session and invocation."""

    id: str
    session_id: str
    invocation_id: str | None
    playbook: str
    created_at: float

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> PlayRow:
        """Build a row from a ``column -> value`` mapping."""
        return _build(cls, row)


@dataclass(frozen=True)
class ControlRow:
    """One row of ``session_controls`` (ADR-0069 D1; result forms in CONTRACT §7).

    Attributes:
        id: 32 lowercase hex characters.
        session_id: The session the control is aimed at.
        verb: ``pause``, ``resume``, ``message`` or ``stop``.
        payload: ``None`` for pause/resume, ``{"text": ...}`` for a message.
        created_at: Epoch seconds of the insert.
        applied_at: Epoch seconds of the terminal stamp, or ``None``.
        result: ``None`` (pending), ``applying:<claimant>``, or a terminal form.
        sender: Who queued it, ``<front end>:<user>@<host>:<pid>``
            (``control.sender_id``); ``None`` for a row written before migration 7.
    """

    id: str
    session_id: str
    verb: ControlVerb
    payload: dict[str, Any] | None
    created_at: float
    applied_at: float | None
    result: str | None
    sender: str | None = None

    @property
    def is_pending(self) -> bool:
        """True while nobody has claimed or stamped the row."""
        return self.applied_at is None and self.result is None

    @property
    def is_applying(self) -> bool:
        """True while a consumer holds the claim (a prefix test, never equality)."""
        return self.applied_at is None and (self.result or "").startswith("applying")

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> ControlRow:
        """Build a row from a ``column -> value`` mapping."""
        return _build(cls, row, payload=_json_object(row["payload"]))


@dataclass(frozen=True)
class NodeUpdate:
    """A node status to publish with :meth:`steerflow.state.StateDB.upsert_nodes`.

    Attributes:
        node_key: The planned ``agent_id``, or a spawned node's ``spawn_id``.
        kind: ``planned`` or ``spawned``.
        status: The node's current status.
        node_id: The executor's node id; ``None`` keeps a previously stored one.
        assignee: The role the node runs as; ``None`` keeps a previously stored one.
        detail: Extra JSON-able facts (usage, error); replaces the stored detail.
    """

    node_key: str
    kind: NodeKind
    status: NodeStatus
    node_id: str | None = None
    assignee: str | None = None
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NodeRow:
    """One row of ``session_nodes``: the live status of one node of a session."""

    session_id: str
    node_key: str
    kind: NodeKind
    node_id: str | None
    assignee: str | None
    status: NodeStatus
    updated_at: float
    detail: dict[str, Any] | None

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> NodeRow:
        """Build a row from a ``column -> value`` mapping."""
        return _build(cls, row, detail=_json_object(row["detail"]))


@dataclass(frozen=True)
class ResolvedTarget:
    """A ``ctl`` target resolved to its session (ADR-0069 D1).

    Attributes:
        session_id: The session the target belongs to.
        via: Which table matched: ``session``, ``invocation`` or ``play``.
        invocation_kind: The matched invocation's kind, or for a session or play
            match the kind of the session.
        matched_id: The full id of the matched row.
    """

    session_id: str
    via: TargetVia
    invocation_kind: str | None
    matched_id: str | None = None


class StateTransaction(Protocol):
    """Statements inside one open transaction of a backend."""

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run a statement and return its rows as ``column -> value`` dicts."""
        ...

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a write statement and return the number of rows it changed."""
        ...


class StateBackend(Protocol):
    """What :class:`steerflow.state.StateDB` needs from a database driver.

    SQL handed to a backend uses ``?`` placeholders and the SQL that SQLite and
    PostgreSQL share; a backend for a driver with another placeholder style
    rewrites them. Backends raise steerflow errors only: a lock wait past the
    bound is :class:`~steerflow.errors.DatabaseBusyError`.
    """

    @property
    def location(self) -> str:
        """Where the database is, for messages (a path, or a URL without secrets)."""
        ...

    @property
    def read_only(self) -> bool:
        """Whether writes are refused."""
        ...

    @property
    def clock_sql(self) -> str:
        """An SQL expression for the database's own clock, in epoch seconds (a float).

        Leases expire by this clock, never by a caller's (decision 120): on SQLite the
        clock of the host the database file is on, on PostgreSQL the server's.
        """
        ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """Run one read statement on its own."""
        ...

    def transaction(self, *, write: bool) -> AbstractContextManager[StateTransaction]:
        """One transaction; a write transaction takes the write lock at its start."""
        ...

    def schema_version(self) -> int:
        """The highest applied migration, or 0 on an empty database."""
        ...

    @property
    def migrations(self) -> tuple[Migration, ...]:
        """The schema steps in this backend's dialect, numbered as :data:`MIGRATIONS`."""
        ...

    @property
    def schema_version_ddl(self) -> str:
        """The ``schema_version`` table in this backend's dialect."""
        ...

    def lock(self, tx: StateTransaction, scope: str, key: str) -> None:
        """Serialize ``tx`` with every other transaction that locks ``(scope, key)``.

        Held until ``tx`` ends; the wait is bounded like any lock wait. A backend
        whose write transactions already exclude one another does nothing.
        """
        ...

    def lock_for_migration(self, tx: StateTransaction) -> None:
        """Serialize migrations across processes (see :meth:`lock`)."""
        ...

    def data_version(self) -> int:
        """A number that changes when another connection commits (at least a control)."""
        ...

    def watch_controls(
        self, session_id: str, callback: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Call ``callback`` on each control inserted for ``session_id``; ``None`` if unable.

        Returns the function that stops the calls, or ``None`` when the backend has
        no notifications (its readers poll :meth:`data_version`).
        """
        ...

    def identity(self) -> tuple[object, ...]:
        """What makes this database the same as another however its URL is spelled.

        Two backends with equal identities read and write the same tables (``db copy``
        refuses to copy a database onto itself).
        """
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def migrate(backend: StateBackend) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`, in one write transaction.

    The backend's migration lock is taken first, so of several processes opening a new
    database at once one migrates and the others find it done.

    Raises:
        RefusedError: The schema is newer than this code, or it is older and the
            backend is read-only.
        DatabaseBusyError: The write lock could not be taken within the bound.
    """
    current = backend.schema_version()
    if current == SCHEMA_VERSION:
        return
    if current > SCHEMA_VERSION:
        raise RefusedError(
            f"state database {backend.location} has schema version {current};"
            f" this steerflow knows up to {SCHEMA_VERSION}"
        )
    if backend.read_only:
        raise RefusedError(
            f"state database {backend.location} has schema version {current}, needs"
            f" {SCHEMA_VERSION}; open it once without read_only to migrate"
        )
    with backend.transaction(write=True) as tx:
        backend.lock_for_migration(tx)
        tx.execute(backend.schema_version_ddl)
        found = tx.query("SELECT MAX(version) AS version FROM schema_version")[0]["version"]
        current = int(found) if found is not None else 0  # another process may have migrated
        for step in backend.migrations:
            if step.version <= current:
                continue
            for statement in step.statements:
                tx.execute(statement)
            if step.apply is not None:
                step.apply(tx)
            tx.execute(
                "INSERT INTO schema_version (version, applied_at, description) VALUES (?, ?, ?)",
                (step.version, time.time(), step.description),
            )
