"""Home and file modes, WAL, open modes and the schema version."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from steerflow.errors import RefusedError, UsageError
from steerflow.state import SCHEMA_VERSION, StateDB


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_home_is_0700_and_db_is_0600(home: Path) -> None:
    with StateDB.open(home) as db:
        assert db.path == home / "state.db"
        assert _mode(home) == 0o700
        assert _mode(home / "state.db") == 0o600
        for suffix in ("-wal", "-shm"):
            side = home / f"state.db{suffix}"
            if side.exists():
                assert _mode(side) == 0o600


def test_existing_home_mode_is_left_alone(home: Path) -> None:
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    StateDB.open(home).close()
    assert _mode(home) == 0o755
    assert _mode(home / "state.db") == 0o600


def test_wal_mode_foreign_keys_and_busy_timeout(home: Path) -> None:
    with StateDB.open(home, busy_timeout_s=2.5) as db:
        assert db.backend.query("PRAGMA foreign_keys")[0]["foreign_keys"] == 1
        assert db.backend.query("PRAGMA busy_timeout")[0]["timeout"] == 2500
    conn = sqlite3.connect(home / "state.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == (
            SCHEMA_VERSION
        )
    finally:
        conn.close()


def test_reopen_is_idempotent(home: Path) -> None:
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow").id
    with StateDB.open(home) as db:
        assert db.get_session(sid) is not None
        rows = db.backend.query("SELECT version FROM schema_version")
        assert [r["version"] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_create_false_refuses_missing_db_and_creates_nothing(home: Path) -> None:
    with pytest.raises(RefusedError, match="no state database at"):
        StateDB.open(home, create=False)
    assert not home.exists()


def test_a_dangling_symlink_is_not_created_through(tmp_path: Path) -> None:
    """SQLite would create the link's target with the umask's mode (0644), not 0600."""
    link, victim = tmp_path / "copy.db", tmp_path / "elsewhere" / "victim.db"
    victim.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(RefusedError, match="symbolic link to a missing file"):
        StateDB.open_url(f"sqlite:///{link}")
    assert not victim.exists() and link.is_symlink()


@pytest.mark.parametrize("under", ["state.db", "sub/state.db"])
def test_a_path_through_a_regular_file_is_a_usage_error_naming_it(
    tmp_path: Path, under: str
) -> None:
    # The cleanup of the aside-built file used to raise its own ENOTDIR, replacing this
    # error with a bare "[Errno 20] Not a directory" (exit 1).
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UsageError, match=r"file.*(is not a directory|Not a directory)"):
        StateDB.open_url(f"sqlite:///{tmp_path / 'file' / under}")
    assert (tmp_path / "file").read_text() == "not a directory"


def test_read_only_refuses_missing_db_and_creates_nothing(home: Path) -> None:
    with pytest.raises(RefusedError, match=r"no state database at .*state\.db"):
        StateDB.open(home, read_only=True)
    assert not home.exists()


def test_read_only_reads_and_refuses_writes(home: Path) -> None:
    with StateDB.open(home) as db:
        sid = db.create_session(kind="play", prompt="p").id
    with StateDB.open(home, read_only=True) as ro:
        row = ro.get_session(sid)
        assert row is not None and row.prompt == "p"
        with pytest.raises(RefusedError, match="read-only"):
            ro.insert_control(session_id=sid, verb="pause", payload=None)
        with pytest.raises(RefusedError, match="read-only"):
            ro.create_session(kind="flow")
    with StateDB.open(home) as db:
        assert db.count_controls() == 0
        assert len(db.list_sessions()) == 1


def test_read_only_refuses_unmigrated_file(home: Path) -> None:
    home.mkdir(mode=0o700)
    (home / "state.db").touch()
    with pytest.raises(RefusedError, match="schema version 0"):
        StateDB.open(home, read_only=True)


def test_newer_schema_is_refused(home: Path) -> None:
    StateDB.open(home).close()
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.execute(
        "INSERT INTO schema_version (version, applied_at, description) VALUES (?, 0, 'x')",
        (SCHEMA_VERSION + 1,),
    )
    conn.close()
    with pytest.raises(RefusedError, match="schema version"):
        StateDB.open(home)


def test_closed_db_raises_and_close_twice_is_harmless(home: Path) -> None:
    db = StateDB.open(home)
    db.close()
    db.close()
    with pytest.raises(Exception, match="closed"):
        db.list_sessions()


def test_state_db_url_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "elsewhere" / "custom.db"
    monkeypatch.setenv("STEERFLOW_STATE_DB_URL", f"sqlite:///{target}")  # four slashes: absolute
    with StateDB.open(tmp_path / "home") as db:
        assert db.path == target
        db.create_session(kind="flow")
    assert _mode(target) == 0o600
    monkeypatch.setenv("STEERFLOW_STATE_DB_URL", "mysql://u@h/db")
    with pytest.raises(UsageError, match="sqlite:///PATH or postgresql://"):
        StateDB.open(tmp_path / "home")


def test_concurrent_first_opens_migrate_once(home: Path) -> None:
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            with StateDB.open(home) as db:
                db.create_session(kind="flow")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with StateDB.open(home) as db:
        assert len(db.list_sessions()) == 6
        rows = db.backend.query("SELECT version FROM schema_version")
        assert [r["version"] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_first_open_races_with_other_processes_without_busy_errors(tmp_path: Path) -> None:
    """A brand-new state DB is linked into place complete: a process that opens it at
    the same moment never sees it half-initialized (that once failed with 'database busy')."""
    code = (
        "import sys; from pathlib import Path; from steerflow.state import StateDB\n"
        "with StateDB.open(Path(sys.argv[1])) as db: db.create_session(kind='flow')\n"
    )
    for trial in range(20):
        home = tmp_path / f"home{trial}"
        creators = [
            subprocess.Popen([sys.executable, "-c", code, str(home)], stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        opened = 0
        while any(p.poll() is None for p in creators):
            if (home / "state.db").exists():
                with StateDB.open(home, create=False) as db:  # a reader such as `runs`
                    db.list_sessions()
                opened += 1
        errors = [p.communicate()[1].decode() for p in creators]
        assert [p.returncode for p in creators] == [0, 0, 0], errors
        with StateDB.open(home, create=False) as db:
            assert len(db.list_sessions()) == 3
        assert not [n for n in os.listdir(home) if n.endswith(".init")]
