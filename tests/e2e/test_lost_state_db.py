"""The checkpoint is enough: resuming a run whose state DB row is gone (issue 27, item 2).

A run ends unfinished (Ctrl-C, or its deadline), then its state DB is lost: the files
deleted, or the home moved to a fresh PostgreSQL database without ``db copy``. A run
that declares no artifacts resumes from its checkpoint alone (``--dry-run``, ``verify``
and the resume itself), its resume still holds the one claim on its source, and links
back to it. A run that declares artifacts is refused, naming the missing copy and
``--accept-checkpoint-contract``, which settles against the checkpoint's own copy.
Real processes throughout; every source checkpoint is byte for byte unchanged.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, finish, start_cli, stop, write_yaml
from resume_support import (
    SourceGuard,
    invocation_counts,
    new_runs,
    ops_of,
    resume,
    run_cli,
    run_dirs,
    run_plan,
    single_run,
    wait_for,
    write_script,
)

from pg_support import PgServer
from steerflow.artifacts import CONFIG_KEY
from steerflow.checkpoint import load_checkpoint
from steerflow.state import STATE_DB_URL_ENV, StateDB

CHAIN: dict[str, Any] = {
    "name": "chain",
    "plan": [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "step c", "depends_on": ["b"]},
    ],
}


@pytest.fixture(autouse=True)
def _sqlite_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source run writes the home's own SQLite file (a test may move it later)."""
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)


def _a_done_b_running(home: Path, proc: subprocess.Popen[str]) -> Path | None:
    if proc.poll() is not None:
        raise AssertionError(f"the flow exited early: {finish(proc).explain()}")
    dirs = run_dirs(home)
    if len(dirs) != 1 or not (dirs[0] / "checkpoint.json").is_file():
        return None
    try:
        done = ops_of(dirs[0]).get("a", {}).get("status") == "completed"
    except Exception:  # a torn read while the writer works: try again
        return None
    return dirs[0] if done and invocation_counts(home)["b"] == 1 else None


def _interrupted_source(tmp_path: Path, how: str) -> tuple[Path, Path, Path]:
    """Run a -> b -> c and end it while b runs; (home, run dir, script)."""
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", CHAIN)
    if how == "timeout":
        script = write_script(tmp_path / "script.yaml", {"b": {"delay": 2}})
        ended = run_plan(home, plan, script, "--timeout", "0.5")
        assert ended.returncode == 124, ended.explain()
        return home, single_run(home), script
    script = write_script(tmp_path / "script.yaml", {"b": {"delay": 120}})
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json")
    try:
        run_dir = wait_for(lambda: _a_done_b_running(home, proc), timeout=60, what="b running")
        proc.send_signal(signal.SIGINT)
        assert finish(proc, timeout=60).returncode == 130
    finally:
        stop(proc)
    return home, run_dir, script


def _delete_state_db(home: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'state.db'}{suffix}").unlink(missing_ok=True)
    assert not (home / "state.db").exists()


def _ok(result: CliResult) -> dict[str, Any]:
    assert result.returncode == 0, result.explain()
    return result.json


def _refused(result: CliResult, code: str) -> dict[str, Any]:
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["error"]["code"] == code, result.explain()
    return body


@pytest.mark.parametrize("where", ["deleted", "postgresql"])
@pytest.mark.parametrize("how", ["sigint", "timeout"])
def test_a_run_declaring_no_artifacts_resumes_from_its_checkpoint_alone(
    tmp_path: Path, how: str, where: str, monkeypatch: pytest.MonkeyPatch, request: Any
) -> None:
    """Ctrl-C or a deadline, then the DB is deleted or the home moved to PostgreSQL."""
    home, run_dir, script = _interrupted_source(tmp_path, how)
    source_session = load_checkpoint(run_dir / "checkpoint.json")[0]["session_id"]
    pending = sorted(k for k in "abc" if ops_of(run_dir).get(k, {}).get("status") != "completed")
    assert "a" not in pending and "c" in pending, pending
    if where == "deleted":
        _delete_state_db(home)
    else:  # a SQLite home moved to PostgreSQL without `db copy`
        server: PgServer = request.getfixturevalue("pg")
        monkeypatch.setenv(STATE_DB_URL_ENV, server.new_database())
    write_script(script, {})  # b is quick now
    guard = SourceGuard.of(run_dir)

    dry = _ok(resume(home, run_dir.name, "--dry-run", "--json"))
    assert dry["status"] == "planned"
    assert {n["id"]: n["status"] for n in dry["nodes"]}["a"] == "completed"
    assert any("declares no artifacts" in w for w in dry["warnings"]), dry["warnings"]
    verified = _ok(run_cli(home, "verify", run_dir.name, "--json"))
    assert (verified["status"], verified["contract_source"]) == ("settled", "checkpoint")
    assert run_dirs(home) == [run_dir], "a dry run or verify created a run"

    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert body["status"] == "completed"
    assert body["resumed_from"] == source_session
    assert any("declares no artifacts" in w for w in body["warnings"]), body["warnings"]
    (new_run,) = new_runs(home, [run_dir])
    counts = invocation_counts(home, run_id=new_run.name)
    assert sorted(counts) == pending and set(counts.values()) == {1}, counts

    # The rest of resume holds without the source's row: the link back, and the claim.
    shown = _ok(run_cli(home, "show", new_run.name, "--json"))
    assert (shown["resumed_from_run"], shown["resumed_from"]) == (run_dir.name, source_session)
    listed = {r["run_id"]: r for r in _ok(run_cli(home, "runs", "--json"))["runs"]}
    assert listed[new_run.name]["resumed_from_run"] == run_dir.name
    again = _refused(resume(home, run_dir.name, "--json"), "resume-claimed")
    assert f"steerflow resume {new_run.name}" in again["error"]["message"]
    assert new_runs(home, [run_dir]) == [new_run]


# a (role writer) and b declare files; f fails once, so the run ends failed (exit 1).
ARTIFACTS: dict[str, Any] = {
    "name": "artifacts",
    "roles": {"writer": {"artifacts": ["out/report.md"]}},
    "plan": [
        {"agent_id": "a", "assignee": "writer", "instruction": "write the report"},
        {"agent_id": "b", "instruction": "add b", "depends_on": ["a"], "artifacts": ["b.txt"]},
        {"agent_id": "f", "instruction": "flaky"},
    ],
}
WRITES: dict[str, Any] = {
    "a": {"artifacts": {"out/report.md": "report A\n"}},
    "b": {"artifacts": {"b.txt": "bbbbbbbb"}},
    "f": {"fail_once": "flaky once"},
}


def test_declared_artifacts_without_the_db_copy_need_accept_checkpoint_contract(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", WRITES)
    source = run_plan(home, write_yaml(tmp_path / "plan.yaml", ARTIFACTS), script)
    assert source.returncode == 1, source.explain()
    run_dir = single_run(home)
    state, _ = load_checkpoint(run_dir / "checkpoint.json")
    _delete_state_db(home)
    guard = SourceGuard.of(run_dir)
    before = invocation_counts(home)

    for result in (
        resume(home, run_dir.name, "--retry-failed", "--json"),
        resume(home, run_dir.name, "--retry-failed", "--dry-run", "--json"),
        run_cli(home, "verify", run_dir.name, "--json"),
    ):
        message = _refused(result, "artifact-contract-refused")["error"]["message"]
        assert "state DB's copy of the artifact contract is missing" in message, message
        assert "--accept-checkpoint-contract" in message and "'a', 'b'" in message, message
    guard.assert_unchanged()
    assert run_dirs(home) == [run_dir] and invocation_counts(home) == before

    verified = _ok(run_cli(home, "verify", run_dir.name, "--accept-checkpoint-contract", "--json"))
    assert (verified["status"], verified["contract_source"], verified["checked"]) == (
        "settled",
        "checkpoint",
        2,
    )
    assert any("--accept-checkpoint-contract" in w for w in verified["warnings"])

    # The checkpoint's copy is really what is settled against: a changed file is caught.
    report = run_dir / "artifacts" / "a" / "out" / "report.md"
    report.write_text("report B\n")
    tampered = _refused(
        resume(home, run_dir.name, "--retry-failed", "--accept-checkpoint-contract", "--json"),
        "artifacts-unsettled",
    )
    assert [(u["node"], u["path"]) for u in tampered["unsettled"]] == [("a", "out/report.md")]
    report.write_text("report A\n")

    body = _ok(
        resume(home, run_dir.name, "--retry-failed", "--accept-checkpoint-contract", "--json")
    )
    guard.assert_unchanged()
    assert {n["id"]: n["status"] for n in body["nodes"]} == dict.fromkeys("abf", "completed")
    said = [w for w in body["warnings"] if "--accept-checkpoint-contract" in w]
    assert said and "checkpoint's own copy" in said[0], body["warnings"]
    (new_run,) = new_runs(home, [run_dir])
    assert invocation_counts(home, run_id=new_run.name) == {"f": 1}
    # The resumed run persisted the contract again: its own resume needs no flag.
    new_state, _ = load_checkpoint(new_run / "checkpoint.json")
    assert new_state["config"][CONFIG_KEY] == state["config"][CONFIG_KEY]
    with StateDB.open(home, create=False) as db:
        row = db.session_for_run(new_run.name)
        assert row is not None and row.artifact_contract == state["config"][CONFIG_KEY]
    assert _ok(run_cli(home, "verify", new_run.name, "--json"))["contract_source"] == "state_db"
