"""One resume per source: the claim taken with the resumed session (docs/decisions.md).

Real SQLite files; liveness is real (this process is alive, a reaped child is dead);
the race test runs real processes that claim the same source at the same moment.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from steerflow.errors import ResumeClaimedError
from steerflow.state import SCHEMA_VERSION, Owner, ResumeClaim, SessionRow, StateDB
from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL
from waiting import wait_until

SOURCE = "20260101T000000-aaaaaa"


def _claim(
    source: str = SOURCE, *, fork: bool = False, checkpointed: set[str] | None = None
) -> ResumeClaim:
    return ResumeClaim(source, fork=fork, has_checkpoint=(checkpointed or set()).__contains__)


def _dead_owner() -> Owner:
    """An owner whose process has exited (and been reaped) on this host."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return Owner(host=socket.gethostname(), pid=child.pid, started_at=None)


def _resume(
    db: StateDB, run_id: str, claim: ResumeClaim, *, owner: Owner | None = None
) -> SessionRow:
    return db.create_session(kind="flow", run_id=run_id, owner=owner, resume=claim)


def _session_count(db: StateDB) -> int:
    return int(db.backend.query("SELECT COUNT(*) AS n FROM sessions")[0]["n"])


def test_migration_from_version_1_adds_the_claims_table(home: Path) -> None:
    home.mkdir(mode=0o700)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.execute(SCHEMA_VERSION_DDL)
    for statement in MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 0, 'v1')")
    conn.execute(
        "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at)"
        " VALUES ('a' || hex(randomblob(15)), 'flow', 'completed', 'executing', 1, 1)"
    )
    conn.close()
    with StateDB.open(home) as db:
        versions = [r["version"] for r in db.backend.query("SELECT version FROM schema_version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 2
        assert _session_count(db) == 1  # older rows survive the migration
        held = _resume(db, "20260101T000001-bbbbbb", _claim())
        assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == [held.id]


def test_a_live_holder_refuses_a_second_claim_and_nothing_is_written(db: StateDB) -> None:
    holder = _resume(db, "20260101T000001-bbbbbb", _claim())  # owned by this live process
    with pytest.raises(ResumeClaimedError) as refused:
        _resume(db, "20260101T000002-cccccc", _claim())
    assert refused.value.exit_code == 3
    assert refused.value.holder_session_id == holder.id
    assert holder.id in str(refused.value) and SOURCE in str(refused.value)
    assert "--fork" in str(refused.value)
    assert _session_count(db) == 1, "a refused claim inserted its session"
    assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == [holder.id]
    with pytest.raises(ResumeClaimedError):
        db.check_resume(_claim())  # the read-only preflight agrees


def test_a_fork_is_never_refused_and_is_listed_as_one(db: StateDB) -> None:
    holder = _resume(db, "20260101T000001-bbbbbb", _claim())
    fork = _resume(db, "20260101T000002-cccccc", _claim(fork=True))
    listed = db.resumed_by([SOURCE, "20990101T000000-ffffff"])
    assert [(b.session_id, b.fork, b.status) for b in listed[SOURCE]] == [
        (holder.id, False, "running"),
        (fork.id, True, "running"),
    ]
    assert "20990101T000000-ffffff" not in listed  # never resumed: absent


def test_a_dead_holder_without_a_checkpoint_does_not_block(db: StateDB) -> None:
    dead = _resume(db, "20260101T000001-bbbbbb", _claim(), owner=_dead_owner())
    assert db.effective_status(dead) == "interrupted"
    taker = _resume(db, "20260101T000002-cccccc", _claim())
    # The dead claim held nothing resumable: it is dropped, its session row stays.
    assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == [taker.id]
    assert db.get_session(dead.id) is not None


def test_a_dead_holder_with_a_checkpoint_refuses_naming_the_newest_run(db: StateDB) -> None:
    first_run, second_run = "20260101T000001-bbbbbb", "20260101T000002-cccccc"
    first = _resume(db, first_run, _claim(), owner=_dead_owner())
    _resume(db, second_run, _claim(first_run), owner=_dead_owner())
    checkpointed = {first_run, second_run}
    with pytest.raises(ResumeClaimedError) as refused:
        _resume(db, "20260101T000003-dddddd", _claim(checkpointed=checkpointed))
    assert refused.value.holder_session_id == first.id
    assert refused.value.newest_run_id == second_run
    message = str(refused.value)
    assert first_run in message and f"steerflow resume {second_run}" in message
    with pytest.raises(ResumeClaimedError) as middle:  # the middle of the chain, too
        _resume(db, "20260101T000004-eeeeee", _claim(first_run, checkpointed=checkpointed))
    assert middle.value.newest_run_id == second_run
    # A fork is still allowed, and a plain resume of the newest run is.
    _resume(db, "20260101T000005-ffffff", _claim(fork=True, checkpointed=checkpointed))
    _resume(db, "20260101T000006-abcdef", _claim(second_run, checkpointed=checkpointed))


def test_a_source_that_still_runs_refuses_every_resume_even_a_fork(db: StateDB) -> None:
    source = db.create_session(kind="flow", run_id=SOURCE)  # owned by this live process
    for claim in (_claim(), _claim(fork=True)):
        with pytest.raises(ResumeClaimedError) as refused:
            _resume(db, "20260101T000001-bbbbbb", claim)
        assert refused.value.exit_code == 3
        assert refused.value.holder_session_id == source.id
        assert refused.value.newest_run_id == SOURCE
        message = str(refused.value)
        assert f"run {SOURCE} is still running (session {source.id}" in message
        assert "SIGINT" in message and f"steerflow resume {SOURCE}" in message
        with pytest.raises(ResumeClaimedError):
            db.check_resume(claim)  # the read-only preflight agrees
    assert _session_count(db) == 1, "a refused resume inserted its session"
    assert db.resumed_by([SOURCE]) == {}
    # Once it has stopped it is resumable.
    db.set_session_status(source.id, "completed")
    taker = _resume(db, "20260101T000002-cccccc", _claim())
    assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == [taker.id]


def test_a_source_whose_owner_died_is_resumable(db: StateDB) -> None:
    source = db.create_session(kind="flow", run_id=SOURCE, owner=_dead_owner())
    assert db.effective_status(source) == "interrupted"  # stored as running
    db.check_resume(_claim())
    taker = _resume(db, "20260101T000001-bbbbbb", _claim())
    assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == [taker.id]


TESTS = Path(__file__).resolve().parents[1]


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


_CLAIMER = """\
import json, os, sys
from pathlib import Path
from waiting import wait_until
from steerflow.errors import ResumeClaimedError
from steerflow.state import ResumeClaim, StateDB

home, source, run_id, barrier, done, release = sys.argv[1:7]
db = StateDB.open(Path(home))
Path(done + ".ready").touch()
wait_until(Path(barrier).exists, timeout=60, what=barrier, interval=0.001)
claim = ResumeClaim(source, fork=False, has_checkpoint=lambda _: False)
try:
    row = db.create_session(kind="flow", run_id=run_id, resume=claim)
    out = {"ok": row.id}
except ResumeClaimedError as exc:
    out = {"refused": exc.holder_session_id}
# Published whole (write, then rename): the test polls for the file and reads it at once.
Path(done + ".tmp").write_text(json.dumps(out))
os.replace(done + ".tmp", done)
# Stay alive (a live holder) until every claimer has tried.
wait_until(Path(release).exists, timeout=60, what=release, interval=0.01)
db.close()
"""


def test_claims_from_processes_at_the_same_moment_admit_exactly_one(
    tmp_path: Path, home: Path
) -> None:
    StateDB.open(home).close()
    barrier, release = tmp_path / "go", tmp_path / "release"
    done = [tmp_path / f"done-{i}" for i in range(4)]
    procs = []
    for i, path in enumerate(done):
        args = [str(home), SOURCE, f"20260101T00000{i}-abcdef", str(barrier), str(path)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _CLAIMER, *args, str(release)],
                # tests/ on the path: the claimer waits with waiting.py
                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *_pythonpath()])},
            )
        )
    try:
        wait_until(
            lambda: all(Path(f"{p}.ready").exists() for p in done),
            timeout=60,
            what="every claimer ready at the barrier",
        )
        barrier.touch()
        wait_until(lambda: all(p.exists() for p in done), timeout=60, what="every claim tried")
        results = [json.loads(p.read_text()) for p in done]
    finally:
        release.touch()
        for proc in procs:
            proc.wait(timeout=30)
    winners = [r["ok"] for r in results if "ok" in r]
    assert len(winners) == 1, results
    assert [r["refused"] for r in results if "refused" in r] == winners * 3
    with StateDB.open(home) as db:
        assert _session_count(db) == 1
        assert [b.session_id for b in db.resumed_by([SOURCE])[SOURCE]] == winners
