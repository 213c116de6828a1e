"""Live control over ``session_controls``: writers, the poller and its target (D1-D3)."""

from __future__ import annotations

from steerflow.control._poller import (
    CONTROL_LOG_MAX,
    DEFAULT_POLL_S,
    POLL_ENV,
    ControlPoller,
    PollerState,
    SteeringTarget,
    poll_interval,
)
from steerflow.control._queue import (
    DB_BUSY_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    CliVerb,
    Queued,
    enqueue_control,
    open_existing_db,
    resolve_control,
    send_control,
    session_target,
)

__all__ = [
    "CONTROL_LOG_MAX",
    "DB_BUSY_TIMEOUT_S",
    "DEFAULT_POLL_S",
    "MAX_MESSAGE_BYTES",
    "POLL_ENV",
    "CliVerb",
    "ControlPoller",
    "PollerState",
    "Queued",
    "SteeringTarget",
    "enqueue_control",
    "open_existing_db",
    "poll_interval",
    "resolve_control",
    "send_control",
    "session_target",
]
