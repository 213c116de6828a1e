"""A state DB lost under a live flow stops its admission with a typed error (issue 27).

Before, SQLite kept writing to the unlinked (or renamed-over) inode, the flow finished
exit 0 and the run was simply gone from ``runs``. Now the lease renewal notices: the
path no longer names the file the connection has open (deleted, replaced), or the file
lost its write permission; on PostgreSQL the tables are gone (a replaced database).
The flow admits nothing more, lets the call in flight finish into its checkpoint, and
exits 1 (``StateDBLostError``) with one line naming what happened and the run to resume.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ctl_support import clean_env, independent_plan, live_flow, run_cli, wait_for, write_yaml
from flow_support import read_invocations

from pg_support import PgRaw, PgServer
from steerflow.checkpoint import load_checkpoint
from steerflow.state import LEASE_ENV, STATE_DB_URL_ENV, StateDB

NODES = 8


def _completed(home: Path, run_id: str) -> set[str]:
    path = home / "runs" / run_id / "checkpoint.json"
    if not path.exists():
        return set()
    state, _ = load_checkpoint(path)
    return {k for k, e in state["ops"].items() if e.get("status") == "completed"}


def _start(tmp_path: Path) -> tuple[Path, list[str]]:
    home = tmp_path / "home"
    keys = independent_plan(tmp_path / "plan.yaml", NODES)
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": 0.6}})
    return home, keys


def _args(tmp_path: Path) -> list[str]:
    return ["--plan", str(tmp_path / "plan.yaml"), "--model",
            f"script:{tmp_path / 'script.yaml'}", "--concurrency", "1"]  # fmt: skip


def _lose_sqlite(how: str, home: Path, tmp_path: Path) -> None:
    db = home / "state.db"
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            with_suffix = Path(f"{db}{suffix}")
            if with_suffix.exists():
                with_suffix.unlink()
    elif how == "replaced":
        other = tmp_path / "other-home"
        StateDB.open(other).close()  # another, valid state database
        os.rename(other / "state.db", db)
    else:
        db.chmod(0o400)


def _check_stopped(home: Path, flow: object, keys: list[str], words: str) -> set[str]:
    code = flow.finish(timeout=60)  # type: ignore[attr-defined]
    stderr = flow.stderr()  # type: ignore[attr-defined]
    assert code == 1, stderr
    line = [ln for ln in stderr.splitlines() if "stopped admitting" in ln]
    assert len(line) == 1, stderr
    run_id = flow.run_id  # type: ignore[attr-defined]
    assert words in line[0] and f"steerflow resume {run_id}" in line[0], line[0]
    done = _completed(home, run_id)
    invoked = [ln["node"] for ln in read_invocations(home)]
    # Admission stopped: not every node ran; what ran, ran once, and every call that
    # finished was recorded (the one in flight when the DB went included).
    assert len(invoked) == len(set(invoked)) < len(keys), invoked
    assert done == set(invoked), (done, invoked)
    return done


@pytest.mark.parametrize("how", ["deleted", "replaced", "unwritable"])
@pytest.mark.timeout(180)
def test_sqlite_lost_under_a_live_flow(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home, keys = _start(tmp_path)
    with live_flow(home, _args(tmp_path), env={LEASE_ENV: "2"}) as flow:
        wait_for(lambda: len(_completed(home, flow.run_id)) >= 2, timeout=60,
                 what="two nodes completed", alive=flow.proc)  # fmt: skip
        _lose_sqlite(how, home, tmp_path)
        words = {"deleted": "was deleted", "replaced": "was replaced",
                 "unwritable": "was made unwritable"}[how]  # fmt: skip
        done = _check_stopped(home, flow, keys, words)
    if how == "unwritable":
        # The session row is intact: once writable again, the run resumes from its
        # checkpoint and runs only what the stopped flow had not.
        (home / "state.db").chmod(0o600)
        again = run_cli(home, "resume", flow.run_id, "--json", env=clean_env())
        assert again.returncode == 0, again.stderr
        invoked = [ln["node"] for ln in read_invocations(home)]
        assert sorted(invoked) == sorted(keys), invoked
        assert len(done) < len(keys)


@pytest.mark.timeout(180)
def test_postgres_replaced_under_a_live_flow(
    tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, url)
    home, keys = _start(tmp_path)
    schema = url.rsplit("search_path%3D", 1)[1]
    with live_flow(home, _args(tmp_path), env={LEASE_ENV: "2"}) as flow:
        wait_for(lambda: len(_completed(home, flow.run_id)) >= 2, timeout=60,
                 what="two nodes completed", alive=flow.proc)  # fmt: skip
        raw = PgRaw(url)
        try:  # a new, empty database where the old one was
            raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
            raw.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            raw.close()
        _check_stopped(home, flow, keys, "lost its tables")
