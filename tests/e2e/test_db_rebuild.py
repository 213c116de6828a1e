"""``steerflow db rebuild``: a lost state DB gets its runs back from their files (issue 27).

A home with a completed run, an interrupted one, a resume of it and an agent run loses
its state DB. ``db rebuild`` registers each run again (session id, kind, status, the
resume's claim on its source) into a new DB, SQLite or PostgreSQL; run twice it changes
nothing; what it cannot read (links, names that are not run ids, missing or malformed
checkpoints) is reported and left exactly as it was. Real processes throughout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from flow_support import CliResult, finish, run_unprivileged, start_cli, stop, write_yaml
from resume_support import (
    invocation_counts,
    new_runs,
    ops_of,
    resume,
    run_cli,
    run_dirs,
    run_plan,
    wait_for,
    write_script,
)

from steerflow.checkpoint import load_checkpoint
from steerflow.state import STATE_DB_URL_ENV, StateDB
from steerflow.studio import listen

CHAIN: dict[str, Any] = {
    "name": "chain",
    "plan": [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
    ],
}
TABLES = ("sessions", "session_nodes", "resume_claims", "invocations", "plays")


def _ok(result: CliResult) -> dict[str, Any]:
    assert result.returncode == 0, result.explain()
    return result.json


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links by target, files by digest), without following links."""
    out: dict[str, str] = {}
    for top, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _tables(home: Path) -> dict[str, list[dict[str, Any]]]:
    with StateDB.open(home, create=False) as db:
        return {t: db.backend.query(f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}


def _sessions(home: Path) -> dict[str, tuple[str, str, str]]:
    """run id -> (session id, kind, stored status)."""
    with StateDB.open(home, create=False) as db:
        return {str(s.run_id): (s.id, s.kind, s.status) for s in db.list_sessions(limit=None)}


def _names(home: Path) -> dict[str, str | None]:
    """run id -> the run's stored name."""
    with StateDB.open(home, create=False) as db:
        return {str(s.run_id): s.name for s in db.list_sessions(limit=None)}


@contextmanager
def _studio_client(home: Path) -> Iterator[httpx.Client]:
    """A real Studio on loopback (a thread of this process), and a client past its token."""
    listening = listen(home, port=0)
    thread = threading.Thread(target=listening.run, name="studio", daemon=True)
    thread.start()
    try:
        wait_for(lambda: listening.server.started, timeout=30, what="the studio to start")
        base = listening.url.split("/?", 1)[0]
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get(listening.url.removeprefix(base)).status_code == 303
            yield client
    finally:
        listening.server.should_exit = True
        thread.join(timeout=30)


def _delete_state_db(home: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'state.db'}{suffix}").unlink(missing_ok=True)


def _interrupted(home: Path, plan: Path, script: Path) -> Path:
    """A flow stopped by SIGINT once a is checkpointed and b runs (exit 130)."""
    known = run_dirs(home)
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json")

    def a_done() -> Path | None:
        if proc.poll() is not None:
            raise AssertionError(f"the flow exited early: {finish(proc).explain()}")
        fresh = new_runs(home, known)
        if len(fresh) != 1 or not (fresh[0] / "checkpoint.json").is_file():
            return None
        try:
            done = ops_of(fresh[0]).get("a", {}).get("status") == "completed"
        except Exception:  # a torn read while the writer works: try again
            return None
        return fresh[0] if done and invocation_counts(home, run_id=fresh[0].name)["b"] else None

    try:
        run_dir = wait_for(a_done, timeout=60, what="a checkpointed while b runs")
        proc.send_signal(signal.SIGINT)
        assert finish(proc, timeout=60).returncode == 130
    finally:
        stop(proc)
    return run_dir


def _home_with_runs(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """completed, interrupted, its resume (completed), an agent run, and four odd entries."""
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", CHAIN)
    quick = write_script(tmp_path / "quick.yaml", {})
    assert run_plan(home, plan, quick).returncode == 0
    (completed,) = run_dirs(home)
    slow = write_script(tmp_path / "slow.yaml", {"b": {"delay": 120}})
    interrupted = _interrupted(home, plan, slow)
    write_script(slow, {})
    assert _ok(resume(home, interrupted.name, "--json"))["status"] == "completed"
    (resumed,) = new_runs(home, [completed, interrupted])
    agent = run_cli(home, "agent", "say hi", "--model", "echo", "--json")
    assert agent.returncode == 0, agent.explain()
    (agent_run,) = new_runs(home, [completed, interrupted, resumed])
    runs = home / "runs"
    outside = tmp_path / "outside" / "20200101T000000-0000aa"
    outside.mkdir(parents=True)
    (outside / "checkpoint.json").write_bytes((completed / "checkpoint.json").read_bytes())
    (runs / "20200101T000000-0000aa").symlink_to(outside)  # a link out of the home
    (runs / "notes").mkdir()  # not a run id
    (runs / "20200101T000001-0000bb").mkdir(mode=0o700)  # no checkpoint
    broken = runs / "20200101T000002-0000cc"
    broken.mkdir(mode=0o700)
    (broken / "checkpoint.json").write_text('{"version": 3, "session_id": ')
    return home, {
        "completed": completed,
        "interrupted": interrupted,
        "resumed": resumed,
        "agent": agent_run,
    }


@pytest.mark.parametrize("target", ["sqlite", "postgresql"])
def test_rebuild_registers_every_run_once_and_twice_changes_nothing(
    tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch, request: Any
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home, runs = _home_with_runs(tmp_path)
    expected = _sessions(home)
    names = _names(home)
    # The plan's name, kept by its resume too; the agent is named by its task.
    assert {k: names[p.name] for k, p in runs.items()} == {
        "completed": "chain",
        "interrupted": "chain",
        "resumed": "chain",
        "agent": "say hi",
    }
    _delete_state_db(home)
    if target == "postgresql":  # the new DB is a PostgreSQL one
        monkeypatch.setenv(STATE_DB_URL_ENV, request.getfixturevalue("pg").new_database())
    files = _tree(home / "runs")
    outside = _tree(tmp_path / "outside")

    first = _ok(run_cli(home, "db", "rebuild", "--json"))
    assert (first["registered"], first["known"], first["skipped"]) == (4, 0, 4), first
    by_name = {r["run_id"]: r for r in first["runs"]}
    assert by_name["20200101T000000-0000aa"]["reason"] == "a symbolic link (never followed)"
    assert by_name["notes"]["reason"] == "not a run id"
    assert "no checkpoint.json" in by_name["20200101T000001-0000bb"]["reason"]
    assert "malformed-json" in by_name["20200101T000002-0000cc"]["reason"]
    statuses = {k: by_name[p.name]["status"] for k, p in runs.items()}
    assert statuses == {
        "completed": "completed",
        "interrupted": "interrupted",
        "resumed": "completed",
        "agent": "completed",
    }
    rebuilt = _sessions(home)
    assert {run: (sid, kind) for run, (sid, kind, _) in rebuilt.items()} == {
        run: (sid, kind) for run, (sid, kind, _) in expected.items()
    }
    assert _names(home) == names, "db rebuild lost or changed a run's name"
    shown_name = _ok(run_cli(home, "show", runs["completed"].name, "--json"))["name"]
    assert shown_name == "chain"
    tables = _tables(home)

    second = _ok(run_cli(home, "db", "rebuild", "--json"))
    assert (second["registered"], second["known"], second["skipped"]) == (0, 4, 4), second
    assert _tables(home) == tables, "a second rebuild changed the state DB"
    assert _tree(home / "runs") == files and _tree(tmp_path / "outside") == outside

    # runs and show see them again; the resume's claim on its source is back.
    listed = {r["run_id"]: r for r in _ok(run_cli(home, "runs", "--json"))["runs"]}
    assert set(listed) == {p.name for p in runs.values()}
    assert listed[runs["resumed"].name]["resumed_from_run"] == runs["interrupted"].name
    assert [b["run_id"] for b in listed[runs["interrupted"].name]["resumed_by"]] == [
        runs["resumed"].name
    ]
    shown = _ok(run_cli(home, "show", runs["interrupted"].name, "--json"))
    assert shown["status"] == "interrupted" and shown["kind"] == "flow"
    assert {n["id"]: n["status"] for n in shown["nodes"]} == {"a": "completed", "b": "pending"}
    with _studio_client(home) as client:  # and the Studio: its Runs page lists them
        page = client.get("/runs")
        assert page.status_code == 200, page.text
        assert all(p.name in page.text for p in runs.values())
    again = resume(home, runs["interrupted"].name, "--json")
    assert again.returncode == 3, again.explain()
    assert again.json["error"]["code"] == "resume-claimed"
    assert f"steerflow resume {runs['resumed'].name}" in again.json["error"]["message"]


def test_rebuild_leaves_the_runs_the_db_already_knows_as_they_are(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", CHAIN)
    assert run_plan(home, plan, write_script(tmp_path / "s.yaml", {})).returncode == 0
    (run_dir,) = run_dirs(home)
    before = _tables(home)
    text = run_cli(home, "db", "rebuild")
    assert text.returncode == 0, text.explain()
    assert f"known       {run_dir.name}" in text.stdout
    assert "0 registered, 1 already known, 0 skipped" in text.stdout
    assert _tables(home) == before

    # A session the DB has under another run id still blocks the checkpoint's session id.
    session_id = load_checkpoint(run_dir / "checkpoint.json")[0]["session_id"]
    with StateDB.open(home) as db, db.backend.transaction(write=True) as tx:
        tx.execute("DELETE FROM sessions")
        tx.execute(
            "INSERT INTO sessions (id, kind, status, created_at, updated_at, run_id)"
            " VALUES (?, 'flow', 'failed', 1.0, 1.0, '20200101T000000-000000')",
            (session_id,),
        )
    body = _ok(run_cli(home, "db", "rebuild", "--json"))
    assert (body["registered"], body["known"]) == (0, 1)
    assert _sessions(home) == {"20200101T000000-000000": (session_id, "flow", "failed")}


def test_a_runs_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (home / "runs").symlink_to(tmp_path / "elsewhere")
    refused = run_cli(home, "db", "rebuild", "--json")
    assert refused.returncode == 3, refused.explain()
    assert "is a symlink" in json.loads(refused.stdout)["error"]["message"]


GOLDEN_V3 = Path(__file__).resolve().parents[1] / "golden" / "v3" / "runs"
COPY = "20000101T000000-000000"  # sorts before any run made today


def test_a_copied_run_directory_is_not_registered_in_place_of_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cp -a runs/A runs/B``: the checkpoint records A, so B is a copy (decision 247)."""
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", CHAIN)
    assert run_plan(home, plan, write_script(tmp_path / "s.yaml", {})).returncode == 0
    (run_dir,) = run_dirs(home)
    expected = _sessions(home)
    shutil.copytree(run_dir, home / "runs" / COPY, symlinks=True)
    _delete_state_db(home)

    body = _ok(run_cli(home, "db", "rebuild", "--json"))
    by_name = {r["run_id"]: r for r in body["runs"]}
    assert by_name[run_dir.name]["outcome"] == "registered", body
    assert by_name[COPY]["outcome"] == "skipped", body
    assert by_name[COPY]["reason"].startswith(f"a copy of run {run_dir.name}"), body
    assert _sessions(home) == expected
    listed = _ok(run_cli(home, "runs", "--json"))["runs"]
    assert [r["run_id"] for r in listed] == [run_dir.name]


def test_copies_of_a_run_that_records_no_run_id_are_all_reported_none_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint from before run ids were recorded cannot say which directory is the run."""
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home = tmp_path / "home"
    (golden,) = GOLDEN_V3.iterdir()
    runs = home / "runs"
    runs.mkdir(parents=True)
    os.chmod(home, 0o700)
    copies = [golden.name, "20260101T000001-00bb03"]
    for name in copies:
        shutil.copytree(golden, runs / name, symlinks=True)
    assert "run_id" not in load_checkpoint(runs / golden.name)[0]["config"]

    body = _ok(run_cli(home, "db", "rebuild", "--json"))
    assert (body["registered"], body["skipped"]) == (0, 2), body
    for run, other in (copies, copies[::-1]):
        reason = next(r["reason"] for r in body["runs"] if r["run_id"] == run)
        assert f"is also in {other}" in reason and "remove the copy" in reason, reason
    shutil.rmtree(runs / copies[1])  # the copy removed, the run registers
    again = _ok(run_cli(home, "db", "rebuild", "--json"))
    assert (again["registered"], again["skipped"]) == (1, 0), again


def test_an_unreadable_checkpoint_is_reported_with_the_loaders_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run directory ``db rebuild`` may not search is not "a run that saved nothing"."""
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", CHAIN)
    assert run_plan(home, plan, write_script(tmp_path / "s.yaml", {})).returncode == 0
    (run_dir,) = run_dirs(home)
    _delete_state_db(home)
    os.chmod(run_dir, 0)
    try:  # as a process file permissions apply to, even when the tests run as root
        done = run_unprivileged(home, "db", "rebuild", "--json")
    finally:
        os.chmod(run_dir, 0o700)
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)["runs"]
    assert entry["outcome"] == "skipped", entry
    assert "no checkpoint.json" not in entry["reason"], entry
    assert entry["reason"].startswith("checkpoint refused: "), entry
    assert "unreadable-checkpoint" in entry["reason"], entry
