"""State database URLs through the real CLI (issue 27 item 4, issue 26 item 5).

Every malformed ``sqlite://``/``postgresql://`` URL, given as ``--state-db`` or as
``STEERFLOW_STATE_DB_URL``, is exit 2 in one line (one JSON object with ``--json``),
before any command does anything, and never prints a password. ``sqlite:///REL`` is
relative to the current directory and ``sqlite:////ABS`` absolute, as in SQLAlchemy; a
three-slash URL that used to name an existing absolute file is refused, naming both
spellings, instead of quietly opening a new, empty database.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from flow_support import CliResult, child_env, run_cli, write_yaml

from pg_support import PgServer
from steerflow.state import STATE_DB_URL_ENV, StateDB

BAD_URLS = [
    "postgresql://[bad",
    "postgresql://u:hunter2@[bad",
    "postgresql://u:hun%ZZter2@db.example/steerflow",
    "postgresql://db.example:abc/steerflow",
    "postgresql://db.example:99999/steerflow",
    "postgresql://db.example:0/steerflow",
    "postgresql://db.example:5432:6/steerflow",
    "postgresql://db.example:-1/steerflow",
    "postgresql://h1,,h2/steerflow",
    "postgresql://h1:1,h2:2,h3:3,h4:4/steerflow?host=a,b",
    "postgresql://db.example/steerflow?nonsense=1",
    "postgresql:",
    "postgres:/db.example/steerflow",
    "mysql://u@db.example/steerflow",
    "postgres+psycopg://db.example/steerflow",
    "sqlite:",
    "sqlite://",
    "sqlite:///",
    "sqlite:////",
    "sqlite:state.db",
    "sqlite://host/state.db",
    "sqlite:///state.db?mode=ro",
    "sqlite:///state.db#frag",
    "sqlite:///x%00y.db",
    "sqlite:///x%FF.db",
    "sqlite:///dir/",
    "sqlite:///..",
    "",
]


def _one_line_usage(result: CliResult, *, as_json: bool) -> None:
    assert result.returncode == 2, result.explain()
    assert "Traceback" not in result.stderr, result.explain()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steerflow: error: "), result.explain()
    assert "hunter2" not in result.stdout + result.stderr, "a password was printed"
    if as_json:
        body = result.json
        assert (body["exit_code"], body["error"]["code"]) == (2, "usage"), body
    else:
        assert result.stdout == ""


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_state_db_url_is_exit_2_in_one_line(tmp_path: Path, url: str) -> None:
    home = tmp_path / "home"
    runs = run_cli(home, "--state-db", url, "runs", "--json", cwd=tmp_path)
    _one_line_usage(runs, as_json=True)
    _one_line_usage(run_cli(home, "--state-db", url, "runs", cwd=tmp_path), as_json=False)
    if url:  # an empty variable means "not set"
        env = child_env(**{STATE_DB_URL_ENV: url})
        _one_line_usage(run_cli(home, "runs", "--json", env=env, cwd=tmp_path), as_json=True)
    assert not home.exists(), "a refused URL created the home"
    assert list(tmp_path.iterdir()) == [], "a refused URL created a file"


@pytest.mark.parametrize(
    "url", ["postgresql://[bad", "postgresql://db.example:0/x", "sqlite:///dir/", "mysql://h/db"]
)
def test_bad_urls_stop_flow_and_db_copy_before_anything_is_done(tmp_path: Path, url: str) -> None:
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    flow = run_cli(home, "--state-db", url, "flow", "--plan", plan, "--json", cwd=tmp_path)
    _one_line_usage(flow, as_json=True)
    assert not home.exists(), "the flow started before its state DB URL was checked"
    assert run_cli(home, "flow", "--plan", plan, "--json").returncode == 0
    copy = run_cli(home, "db", "copy", "--to", url, "--json", cwd=tmp_path)
    _one_line_usage(copy, as_json=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "plan.yaml"]


def test_three_slashes_are_relative_to_the_current_directory(tmp_path: Path) -> None:
    """``sqlite:///REL/x.db`` is ``./REL/x.db``, never ``/REL/x.db`` (issue 26 item 5)."""
    rel = f"steerflow-rel-{uuid.uuid4().hex[:12]}"
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    try:
        url = f"sqlite:///{rel}/x.db"
        ran = run_cli(home, "--state-db", url, "flow", "--plan", plan, "--json", cwd=tmp_path)
        assert ran.returncode == 0, ran.explain()
        assert not Path(f"/{rel}").exists(), "three slashes were read as an absolute path"
        made = tmp_path / rel / "x.db"
        assert made.is_file() and not (home / "state.db").exists()
        assert made.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / rel).stat().st_mode & 0o777 == 0o700
        # Four slashes: the same file, absolute, from anywhere.
        absolute = f"sqlite:///{made}"
        assert absolute.startswith("sqlite:////")
        listed = run_cli(home, "--state-db", absolute, "runs", "--json", cwd=Path("/"))
        assert [r["session_id"] for r in listed.json["runs"]] == [ran.json["session_id"]]
        with StateDB.open_url(absolute, create=False) as db:
            assert db.path == made
    finally:
        shutil.rmtree(f"/{rel}", ignore_errors=True)


def test_a_three_slash_url_that_named_an_existing_absolute_file_is_refused(
    tmp_path: Path,
) -> None:
    """Before the convention changed it meant that file: no new, empty DB beside the cwd."""
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    existing = tmp_path / "team" / "state.db"
    made = run_cli(home, "--state-db", f"sqlite:///{existing}", "flow", "--plan", plan)
    assert made.returncode == 0, made.explain()
    old_style = f"sqlite://{existing}"  # three slashes in all: relative now
    cwd = tmp_path / "work"
    cwd.mkdir()
    refused = run_cli(home, "--state-db", old_style, "runs", "--json", cwd=cwd)
    _one_line_usage(refused, as_json=True)
    message = refused.json["error"]["message"]
    assert f"sqlite:///{existing}" in message and "sqlite:///./" in message, message
    assert list(cwd.iterdir()) == [], "the refused URL created a database in the cwd"
    # Written relative on purpose (or where the relative file exists), it is that file.
    (cwd / str(existing)[1:]).parent.mkdir(parents=True)
    fresh = run_cli(home, "--state-db", f"sqlite:///./{str(existing)[1:]}", "runs", cwd=cwd)
    assert fresh.returncode == 0, fresh.explain()


@pytest.mark.parametrize("spelling", ["postgresql:///{db}", "postgresql://{user}@:{port}/{db}"])
def test_a_url_with_no_host_means_libpqs_defaults(
    tmp_path: Path, pg: PgServer, spelling: str
) -> None:
    """As for psql, an absent host is ``PGHOST`` (else the default socket), not an error."""
    db = pg.new_database()
    parts = urlsplit(db)
    url = spelling.format(user=pg.user, port=pg.port, db=parts.path[1:]) + "?" + parts.query
    env = child_env(PGHOST="127.0.0.1", PGPORT=str(pg.port), PGUSER=pg.user)
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    ran = run_cli(home, "--state-db", url, "flow", "--plan", plan, "--json", env=env)
    assert ran.returncode == 0, ran.explain()
    listed = run_cli(home, "--state-db", db, "runs", "--json")
    assert [r["session_id"] for r in listed.json["runs"]] == [ran.json["session_id"]]
    assert not (home / "state.db").exists(), "a hostless URL fell back to the home's SQLite"
