"""Which URLs are PostgreSQL, and how long a process waits to be admitted (decision 361).

Kept apart from :mod:`steerflow.state._postgres` so that a process on the SQLite default
(every ``ctl``, ``show`` and most flows) decides "not PostgreSQL" and reads its connect
timeout without importing the backend, its logging and its psycopg glue (decision 391).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import re
from collections.abc import Iterator

from steerflow.errors import InvalidValueError, quote_input

__all__ = [
    "DB_CONNECT_TIMEOUT_ENV",
    "DEFAULT_DB_CONNECT_TIMEOUT_S",
    "PG_SCHEMES",
    "admission_wait",
    "connect_timeout_s",
    "is_postgres_url",
]

PG_SCHEMES = ("postgresql", "postgres")

DB_CONNECT_TIMEOUT_ENV = "STEERFLOW_DB_CONNECT_TIMEOUT_S"
"""How long a process waits for a full (or starting) server to admit it (decision 361)."""

DEFAULT_DB_CONNECT_TIMEOUT_S = 60.0
_MAX_CONNECT_TIMEOUT_S = 3600.0

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def is_postgres_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database (by its scheme; never raises)."""
    found = _SCHEME.match(url)
    return found is not None and found.group(1).lower() in PG_SCHEMES


_admission_override: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "steerflow_admission_wait", default=None
)


@contextlib.contextmanager
def admission_wait(seconds: float) -> Iterator[None]:
    """Within the block, wait at most ``seconds`` for a full server (0: do not wait).

    A flow that has finished reads its result back with 0: its checkpoint holds the
    result, so a full server is no reason to keep the operator waiting for it.
    """
    token = _admission_override.set(seconds)
    try:
        yield
    finally:
        _admission_override.reset(token)


def connect_timeout_s() -> float:
    """How long a new process waits to be admitted: ``STEERFLOW_DB_CONNECT_TIMEOUT_S``, else 60.

    Raises:
        InvalidValueError: The variable is not a number of seconds from 0 to 3600
            (a usage error, exit 2).
    """
    override = _admission_override.get()
    if override is not None:
        return override
    raw = os.environ.get(DB_CONNECT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_DB_CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= _MAX_CONNECT_TIMEOUT_S:
        raise InvalidValueError(
            DB_CONNECT_TIMEOUT_ENV,
            f"must be a number of seconds from 0 to {_MAX_CONNECT_TIMEOUT_S:g},"
            f" got {quote_input(raw)}",
        )
    return value
