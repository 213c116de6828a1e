"""The state database: sessions, invocations, plays, session controls and node status.

Open it with :meth:`StateDB.open`; see :mod:`steerflow.state._db` for the facade,
:mod:`steerflow.state._schema` for the tables, and :mod:`steerflow.state._owner`
for how a dead owner turns a ``running`` session into ``interrupted``.
"""

from __future__ import annotations

from steerflow.state._claims import ResumeClaim, ResumedBy
from steerflow.state._copy import CopyReport, copy_state, open_copy_target
from steerflow.state._db import (
    BUSY_TIMEOUT_S,
    STATE_DB_URL_ENV,
    ResolvedTarget,
    StateDB,
    db_exists,
    normalize_state_db_url,
)
from steerflow.state._lease import DEFAULT_LEASE_S, LEASE_ENV, holds_lease, lease_seconds
from steerflow.state._owner import (
    HEARTBEAT_STALE_S,
    HOST_ID_ENV,
    Owner,
    effective_status,
    owner_alive,
    process_start_time,
    this_host,
)
from steerflow.state._pg_admission import DB_CONNECT_TIMEOUT_ENV, admission_wait, connect_timeout_s
from steerflow.state._schema import (
    SCHEMA_VERSION,
    ControlRow,
    ControlVerb,
    InvocationKind,
    InvocationRow,
    NodeKind,
    NodeRow,
    NodeStatus,
    NodeUpdate,
    Phase,
    PlayRow,
    SessionRow,
    SessionStatus,
    StateBackend,
    StateTransaction,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "DB_CONNECT_TIMEOUT_ENV",
    "DEFAULT_LEASE_S",
    "HEARTBEAT_STALE_S",
    "HOST_ID_ENV",
    "LEASE_ENV",
    "SCHEMA_VERSION",
    "STATE_DB_URL_ENV",
    "ControlRow",
    "ControlVerb",
    "CopyReport",
    "InvocationKind",
    "InvocationRow",
    "NodeKind",
    "NodeRow",
    "NodeStatus",
    "NodeUpdate",
    "Owner",
    "Phase",
    "PlayRow",
    "ResolvedTarget",
    "ResumeClaim",
    "ResumedBy",
    "SessionRow",
    "SessionStatus",
    "StateBackend",
    "StateDB",
    "StateTransaction",
    "admission_wait",
    "connect_timeout_s",
    "copy_state",
    "db_exists",
    "effective_status",
    "holds_lease",
    "lease_seconds",
    "normalize_state_db_url",
    "open_copy_target",
    "owner_alive",
    "process_start_time",
    "this_host",
]
