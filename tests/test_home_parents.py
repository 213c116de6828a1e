"""Directories steerflow creates above a home or a state DB are 0700 whatever the umask:
whoever can write a home's parent can rename the home away and put their own in its place."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from steerflow.home import ensure_private_dir
from steerflow.state import StateDB


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_a_home_with_missing_parents_gets_private_parents(tmp_path: Path) -> None:
    home = tmp_path / "a" / "b" / "home"
    ensure_private_dir(home)
    assert [_mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", home)] == [0o700] * 3


@pytest.mark.usefixtures("open_umask")
def test_a_state_db_url_with_missing_parents_gets_private_parents(tmp_path: Path) -> None:
    db_path = tmp_path / "q1" / "q2" / "state.db"
    StateDB.open_url(f"sqlite:///{db_path}").close()
    assert [_mode(tmp_path / "q1"), _mode(db_path.parent), _mode(db_path)] == [
        0o700,
        0o700,
        0o600,
    ]


@pytest.mark.usefixtures("open_umask")
def test_existing_parents_keep_their_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    ensure_private_dir(shared / "home")
    assert (_mode(shared), _mode(shared / "home")) == (0o755, 0o700)
