"""Runs carry a ``name`` (CONTRACT §11), stored with the session by migration 5.

The flow and the reads are real ``steerflow`` subprocesses; the listing tests write real
sessions into a real state DB (SQLite, and PostgreSQL through ``state_backend``).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from ctl_support import run_cli, write_yaml
from test_studio_e2e import studio

from steerflow import views
from steerflow.orchestrate._claim import NAME_CHARS, run_name
from steerflow.state import SCHEMA_VERSION, StateDB
from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL


def test_run_name_prefers_plan_then_playbook_then_the_prompts_first_line() -> None:
    assert run_name("weekly report", "demo", "prompt") == "weekly report"
    assert run_name(None, "demo", "prompt") == "demo"
    assert run_name(None, None, "\n  fix the build  \nthen more") == "fix the build"
    assert run_name("  ", None, "x" * 200) == "x" * NAME_CHARS
    assert run_name(None, None, None) is None and run_name(None, None, " \n ") is None


def test_flow_records_its_plan_name_in_runs_and_show(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_yaml(
        tmp_path / "plan.yaml",
        {"name": "quarterly numbers", "plan": [{"agent_id": "a", "instruction": "one"}]},
    )
    write_yaml(tmp_path / "script.yaml", {})
    done = run_cli(
        home, "flow", "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]
    (listed,) = json.loads(run_cli(home, "runs", "--json").stdout)["runs"]
    assert listed["name"] == "quarterly numbers"
    assert json.loads(run_cli(home, "show", run, "--json").stdout)["name"] == "quarterly numbers"
    assert "quarterly numbers" in run_cli(home, "runs").stdout
    assert "name: quarterly numbers" in run_cli(home, "show", run).stdout


class _Tx:
    """What a migration's ``apply`` needs of a transaction, over a bare connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[dict[str, object]]:
        return [dict(row) for row in self.conn.execute(sql, params)]

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> int:
        return self.conn.execute(sql, params).rowcount


def test_migration_5_adds_the_name_to_an_older_state_db(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.execute(SCHEMA_VERSION_DDL)
    conn.row_factory = sqlite3.Row
    for step in MIGRATIONS[:4]:  # a state DB as the release before names left it
        for statement in step.statements:
            conn.execute(statement)
        if step.apply is not None:
            step.apply(_Tx(conn))  # type: ignore[arg-type]
        conn.execute("INSERT INTO schema_version VALUES (?, 0, 'old')", (step.version,))
    conn.execute(
        "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at)"
        " VALUES ('a' || hex(randomblob(15)), 'flow', 'completed', 'executing', 1, 1)"
    )
    conn.close()
    with StateDB.open(home) as db:
        versions = [r["version"] for r in db.backend.query("SELECT version FROM schema_version")]
        assert versions[-1] == SCHEMA_VERSION >= 5
        (old,) = db.list_sessions()
        assert old.name is None  # a row from before the column reads as unnamed
    assert [r.name for r in views.list_runs(home)] == [None]


@pytest.mark.usefixtures("state_backend")
def test_text_filter_and_pages_on_both_backends(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with StateDB.open(home) as db:
        for i in range(7):
            row = db.create_session(
                kind="flow", name=f"Nightly_{i} 100%" if i % 2 else f"adhoc {i}"
            )
            db.set_session_status(row.id, "completed")
    nightly = views.list_runs(home, limit=None, text="nightly_")
    assert [r.name for r in nightly] == ["Nightly_5 100%", "Nightly_3 100%", "Nightly_1 100%"]
    assert [r.name for r in views.list_runs(home, limit=2, offset=1, text="NIGHTLY")] == [
        "Nightly_3 100%", "Nightly_1 100%"
    ]  # fmt: skip
    # A LIKE wildcard in the text is a character, not a pattern.
    assert views.list_runs(home, text="_5 1") and not views.list_runs(home, text="y%")
    assert len(views.list_runs(home, limit=None, text="%")) == 3


def test_studio_runs_page_finds_by_text_and_pages_newest_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with StateDB.open(home) as db:
        for i in range(60):
            row = db.create_session(
                kind="flow", name=f"job {i:02d}" + (" <b>x</b>" if i == 7 else "")
            )
            db.set_session_status(row.id, "failed" if i % 3 == 0 else "completed")
    with studio(home) as s, s.client() as client:
        first = client.get("/runs").text
        assert first.index("job 59") < first.index("job 58") and "job 09" not in first
        assert 'rel="next" href="/runs?page=1"' in first and 'rel="prev"' not in first
        second = client.get("/runs?page=1").text
        assert "job 09" in second and "job 59" not in second and 'rel="next"' not in second
        found = client.get("/runs", params={"q": "JOB 0", "status": "failed"}).text
        names = [f"job 0{i}" for i in range(10)]
        assert [n for n in names if f">{n}<" in found or f">{n} " in found] == [
            "job 00", "job 03", "job 06", "job 09"
        ]  # fmt: skip
        assert "job 07 &lt;b&gt;x&lt;/b&gt;" not in found  # completed: filtered out
        assert "<b>x</b>" not in client.get("/runs", params={"q": "07"}).text
        live = client.get("/api/runs", params={"q": "job 0", "status": "failed"}).json()
        assert len(live["runs"]) == 4
