"""The state tables on PostgreSQL: the SQLite migrations, translated, plus the NOTIFY trigger.

The migrations keep the numbers and descriptions of :data:`steerflow.state._schema.MIGRATIONS`
so ``schema_version`` means the same on both backends. Three things differ, each for a reason:

* ``REAL`` is ``DOUBLE PRECISION``: PostgreSQL's ``REAL`` is a 4-byte float, which would
  round epoch seconds to minutes and break the ``(created_at, id)`` order and the
  conditional heartbeat update.
* Id columns are ``TEXT COLLATE "C"``: ``resolve_target`` finds a prefix with the range
  ``id >= p AND id < p || '~'``, which is right only under byte order.
* Migration 1 adds a trigger that ``NOTIFY``s :data:`CONTROLS_CHANNEL` with the session id
  on every insert into ``session_controls``, so every writer (``ctl``, ``db copy``, a hand
  insert) wakes the flow that consumes the row; migration 3 widens the status CHECK with
  ``ALTER TABLE`` instead of SQLite's in-place edit of the stored DDL.
"""

from __future__ import annotations

import re

from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL, Migration

__all__ = ["CONTROLS_CHANNEL", "PG_MIGRATIONS", "PG_SCHEMA_VERSION_DDL", "to_postgres_ddl"]

CONTROLS_CHANNEL = "steerflow_controls"
"""The channel an insert into ``session_controls`` notifies, with the session id as payload."""

_NOTIFY_FUNCTION = f"""\
CREATE OR REPLACE FUNCTION steerflow_notify_control() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('{CONTROLS_CHANNEL}', NEW.session_id);
  RETURN NEW;
END
$$ LANGUAGE plpgsql"""

_NOTIFY_TRIGGER = """\
CREATE TRIGGER session_controls_notify AFTER INSERT ON session_controls
  FOR EACH ROW EXECUTE FUNCTION steerflow_notify_control()"""

_STATUS_V3 = (
    "ALTER TABLE sessions ADD CONSTRAINT sessions_status_check CHECK (status IN"
    " ('running', 'completed', 'failed', 'timed_out', 'interrupted', 'stopped'))"
)


_STATUS_V5 = (
    "ALTER TABLE sessions ADD CONSTRAINT sessions_status_check CHECK (status IN"
    " ('running', 'completed', 'failed', 'timed_out', 'interrupted', 'stopped',"
    " 'budget_exhausted'))"
)
_VERB_V5 = (
    "ALTER TABLE session_controls ADD CONSTRAINT session_controls_verb_check CHECK (verb IN"
    " ('pause', 'resume', 'message', 'stop', 'budget'))"
)


_VERB_V8 = (
    "ALTER TABLE session_controls ADD CONSTRAINT session_controls_verb_check CHECK (verb IN"
    " ('pause', 'resume', 'message', 'stop', 'budget', 'approve', 'deny'))"
)


def to_postgres_ddl(statement: str) -> str:
    """Translate one statement of the shared DDL to PostgreSQL's types (see the module doc)."""
    text = re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)
    text = re.sub(r"\b(id|session_id|invocation_id)(\s+)TEXT\b", r'\1\2TEXT COLLATE "C"', text)
    return text


def _translated(step: Migration) -> Migration:
    if step.apply is not None and step.version not in (3, 6, 8):
        raise NotImplementedError(f"migration {step.version} has no PostgreSQL translation")
    statements = tuple(to_postgres_ddl(s) for s in step.statements)
    if step.version == 1:
        statements += (_NOTIFY_FUNCTION, _NOTIFY_TRIGGER)
    elif step.version == 3:
        # The column CHECK of migration 1 is named <table>_<column>_check by PostgreSQL.
        statements = ("ALTER TABLE sessions DROP CONSTRAINT sessions_status_check", _STATUS_V3)
    elif step.version == 6:
        statements = (
            "ALTER TABLE sessions DROP CONSTRAINT sessions_status_check",
            _STATUS_V5,
            "ALTER TABLE session_controls DROP CONSTRAINT session_controls_verb_check",
            _VERB_V5,
        )
    elif step.version == 8:
        statements = (
            "ALTER TABLE session_controls DROP CONSTRAINT session_controls_verb_check",
            _VERB_V8,
        )
    return Migration(step.version, step.description, statements)


PG_SCHEMA_VERSION_DDL = to_postgres_ddl(SCHEMA_VERSION_DDL)
"""The bookkeeping table on PostgreSQL."""

PG_MIGRATIONS: tuple[Migration, ...] = tuple(_translated(step) for step in MIGRATIONS)
"""The migrations on PostgreSQL, numbered as on SQLite."""
