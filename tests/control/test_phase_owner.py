"""The control poller is the only writer of ``sessions.phase`` (issue 16, item 6)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import steerflow
from steerflow.control import ControlPoller
from steerflow.executor import Steering
from steerflow.state import StateDB

SRC = Path(steerflow.__file__).parent


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    with StateDB.open(tmp_path / "home") as opened:
        yield opened


def _phase(db: StateDB, sid: str) -> str:
    row = db.get_session(sid)
    assert row is not None
    return row.phase


def test_only_the_poller_calls_set_session_phase() -> None:
    callers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.parent.name != "state"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "set_session_phase"
    )
    assert callers == ["control/_poller.py"]


async def test_start_executing_publishes_the_phase_before_returning(
    tmp_path: Path, db: StateDB
) -> None:
    sid = db.create_session(kind="flow", node_metadata={}).id
    steering = Steering()
    poller = ControlPoller(tmp_path / "home", sid, steering, interval=0.01, db=db)
    assert _phase(db, sid) == "planning"
    await poller.start_executing()
    assert poller.executing
    assert _phase(db, sid) == "executing"


async def test_start_executing_while_paused_publishes_paused(tmp_path: Path, db: StateDB) -> None:
    sid = db.create_session(kind="flow", node_metadata={}).id
    steering = Steering()
    steering.pause()  # e.g. a pause applied while the plan was being made
    poller = ControlPoller(tmp_path / "home", sid, steering, interval=0.01, db=db)
    await poller.start_executing()
    assert _phase(db, sid) == "paused"


async def test_a_run_that_ends_before_the_poller_opened_its_db_still_shows_executing(
    tmp_path: Path, db: StateDB
) -> None:
    """start_executing before the poller's own connection exists: its final pass publishes."""
    sid = db.create_session(kind="flow", node_metadata={}).id
    poller = ControlPoller(tmp_path / "home", sid, Steering(), interval=0.01)
    await poller.start_executing()  # no connection yet: nothing written
    assert _phase(db, sid) == "planning"
    await poller.stop()  # the run ended at once
    await poller.run()  # only the final pass runs
    assert poller.state == "stopped"
    assert _phase(db, sid) == "executing"
