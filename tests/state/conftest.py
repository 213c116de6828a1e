"""Fixtures for the state-database tests: a real SQLite file under ``tmp_path``, or a real
PostgreSQL database (``state_backend``, tests/conftest.py): ``db`` runs on both unless a
module pins ``state_backend`` to ``"sqlite"`` (its tests read SQLite's own catalog)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_support import PgRaw
from steerflow.state import STATE_DB_URL_ENV, StateDB


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


@pytest.fixture
def db(home: Path, state_backend: str) -> Iterator[StateDB]:
    """A freshly created state database on each backend."""
    with StateDB.open(home) as opened:
        yield opened


@pytest.fixture
def raw(db: StateDB, state_backend: str) -> Iterator[Any]:
    """A second, plain connection to the same database (autocommit, ``?`` placeholders)."""
    if state_backend == "postgresql":
        pg_raw = PgRaw(os.environ[STATE_DB_URL_ENV])
        try:
            yield pg_raw
        finally:
            pg_raw.close()
        return
    assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        yield conn
    finally:
        conn.close()
