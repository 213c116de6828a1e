"""Live control over ``session_controls``: writers, the poller and its target (D1–D3)."""

from __future__ import annotations

from steerflow.control._poller import DEFAULT_POLL_S, POLL_ENV, ControlPoller, SteeringTarget
from steerflow.control._queue import (
    ALLOWED_KINDS,
    Queued,
    enqueue_control,
    open_existing_db,
    resolve_control,
)

__all__ = [
    "ALLOWED_KINDS",
    "DEFAULT_POLL_S",
    "POLL_ENV",
    "ControlPoller",
    "Queued",
    "SteeringTarget",
    "enqueue_control",
    "open_existing_db",
    "resolve_control",
]
