"""``db copy`` never copies a database onto itself, however the target is spelled (issue 27).

SQLite: the same file by device and inode (a link, a hard link, ``H/../H``, three,
four or five slashes, percent-encoding, a linked parent). PostgreSQL: the same server
(system identifier), database (oid) and ``sessions`` table (the schema the URL's
``search_path`` picks), whatever host name, socket or option order reaches it; another
schema of the same database is another state database and is copied to. Each refusal
is exit 3 and writes nothing; real processes and a real server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, child_env, run_cli, write_yaml

from pg_support import PgServer
from steerflow.state import STATE_DB_URL_ENV, StateDB

PLAN = {"plan": [{"agent_id": "a", "instruction": "x"}, {"agent_id": "b", "instruction": "y"}]}


def _refused_as_itself(result: CliResult) -> None:
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["error"]["code"] == "refused", body
    assert "the source and the target are the same database" in body["error"]["message"]


def _rows(db: StateDB) -> dict[str, list[dict[str, Any]]]:
    return {
        t: db.backend.query(f"SELECT * FROM {t} ORDER BY 1, 2")
        for t in ("sessions", "session_nodes", "invocations", "resume_claims")
    }


@pytest.fixture
def sqlite_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home = tmp_path / "H"
    ran = run_cli(home, "flow", "--plan", write_yaml(tmp_path / "plan.yaml", PLAN), "--json")
    assert ran.returncode == 0, ran.explain()
    return home


def _spellings(tmp_path: Path, home: Path) -> dict[str, str]:
    db = home / "state.db"
    os.symlink(db, tmp_path / "link.db")
    os.link(db, tmp_path / "hard.db")
    os.symlink(home, tmp_path / "Hlink")
    return {
        "relative": "sqlite:///H/state.db",
        "absolute": f"sqlite:///{db}",
        "five-slashes": f"sqlite:////{db}",
        "dot-dot": "sqlite:///H/../H/state.db",
        "dot": "sqlite:///./H/state.db",
        "percent": "sqlite:///H/state%2Edb",
        "symlink": "sqlite:///link.db",
        "hard-link": "sqlite:///hard.db",
        "linked-parent": "sqlite:///Hlink/state.db",
    }


def test_every_spelling_of_the_sqlite_source_is_refused(tmp_path: Path, sqlite_home: Path) -> None:
    spellings = _spellings(tmp_path, sqlite_home)
    with StateDB.open(sqlite_home, create=False) as db:
        before = _rows(db)
    entries = sorted(p.name for p in tmp_path.iterdir())
    for name, url in spellings.items():
        result = run_cli(sqlite_home, "db", "copy", "--to", url, "--json", cwd=tmp_path)
        _refused_as_itself(result)
        # The source may also be named by --state-db, in yet another spelling.
        other = spellings["dot-dot" if name != "dot-dot" else "symlink"]
        named = run_cli(
            sqlite_home, "--state-db", other, "db", "copy", "--to", url, "--json", cwd=tmp_path
        )
        _refused_as_itself(named)
    assert sorted(p.name for p in tmp_path.iterdir()) == entries, "a refused copy made a file"
    with StateDB.open(sqlite_home, create=False) as db:
        assert _rows(db) == before
    # The control: another file is copied to.
    copied = run_cli(sqlite_home, "db", "copy", "--to", "sqlite:///copy.db", "--json", cwd=tmp_path)
    assert copied.returncode == 0, copied.explain()
    assert copied.json["rows"]["sessions"] == 1
    with StateDB.open_url(f"sqlite:///{tmp_path / 'copy.db'}", create=False) as db:
        assert _rows(db) == before


def test_every_spelling_of_the_postgresql_source_is_refused_but_another_schema_is_not(
    tmp_path: Path, pg: PgServer
) -> None:
    source = pg.new_database()  # postgresql://USER@127.0.0.1:PORT/DB?options=-csearch_path%3DS
    env = child_env(**{STATE_DB_URL_ENV: source})
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    assert run_cli(home, "flow", "--plan", plan, "--json", env=env).returncode == 0
    schema = source.rsplit("%3D", 1)[1]
    database = source.split("?")[0].rsplit("/", 1)[1]
    socket_dir = pg.data_dir.parent
    spellings = {
        "identical": source,
        "localhost": source.replace("@127.0.0.1:", "@localhost:"),
        "scheme": source.replace("postgresql://", "postgres://", 1),
        "unix-socket": f"postgresql://{pg.user}@/{database}?host={socket_dir}&port={pg.port}"
        f"&options=-csearch_path%3D{schema}",
        "search-path-with-public": f"{source},public",
        "dbname-parameter": f"postgresql://{pg.user}@127.0.0.1:{pg.port}/?dbname={database}"
        f"&options=-csearch_path%3D{schema}",
    }
    with StateDB.open_url(source, create=False) as db:
        before = _rows(db)
    for url in spellings.values():
        _refused_as_itself(run_cli(home, "db", "copy", "--to", url, "--json", env=env))
    with StateDB.open_url(source, create=False) as db:
        assert _rows(db) == before
    # Another schema of the same database is another state database: copied to.
    other = pg.new_database()
    assert other.split("?")[0] == source.split("?")[0]
    copied = run_cli(home, "db", "copy", "--to", other, "--json", env=env)
    assert copied.returncode == 0, copied.explain()
    with StateDB.open_url(other, create=False) as db:
        assert _rows(db) == before
