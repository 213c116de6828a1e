"""Live control over ``session_controls``: writers, the poller and its target (D1-D3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerflow._lazy import lazy_exports

if TYPE_CHECKING:
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
        FrontEnd,
        Queued,
        check_budget,
        enqueue_control,
        open_existing_db,
        resolve_control,
        send_control,
        sender_id,
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
    "FrontEnd",
    "PollerState",
    "Queued",
    "SteeringTarget",
    "check_budget",
    "enqueue_control",
    "open_existing_db",
    "poll_interval",
    "resolve_control",
    "send_control",
    "sender_id",
    "session_target",
]


# Where each name lives (a submodule of this package), imported on first access.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CONTROL_LOG_MAX": "_poller",
        "ControlPoller": "_poller",
        "DB_BUSY_TIMEOUT_S": "_queue",
        "DEFAULT_POLL_S": "_poller",
        "MAX_MESSAGE_BYTES": "_queue",
        "POLL_ENV": "_poller",
        "PollerState": "_poller",
        "Queued": "_queue",
        "SteeringTarget": "_poller",
        "check_budget": "_queue",
        "enqueue_control": "_queue",
        "open_existing_db": "_queue",
        "poll_interval": "_poller",
        "resolve_control": "_queue",
        "CliVerb": "_queue",
        "send_control": "_queue",
        "sender_id": "_queue",
        "FrontEnd": "_queue",
        "session_target": "_queue",
    },
)
