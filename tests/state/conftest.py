"""Fixtures for the state-database tests: real SQLite files under ``tmp_path``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from steerflow.state import StateDB


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


@pytest.fixture
def db(home: Path) -> Iterator[StateDB]:
    """A freshly created state database."""
    with StateDB.open(home) as opened:
        yield opened


@pytest.fixture
def raw(db: StateDB) -> Iterator[sqlite3.Connection]:
    """A second, plain ``sqlite3`` connection to the same file (autocommit)."""
    assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        yield conn
    finally:
        conn.close()
