"""Settling recorded artifacts through the real CLI (Amendment 1 rows 2, 7, 9; issue 12).

A plan's ``script:`` nodes write their declared files (role ``artifacts`` and entry
``artifacts``); one independent node fails once, so the run ends failed and is resumed
with ``--retry-failed``. Between the runs a recorded file is tampered with: each way is
refused (exit 3) naming node and file with the source checkpoint byte for byte unchanged,
and ``--rerun-unsettled`` re-runs exactly the affected node and its dependents.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, read_invocations, run_cli, write_yaml
from resume_support import (
    SourceGuard,
    invocation_counts,
    new_runs,
    resume,
    run_dirs,
    run_plan,
    single_run,
    write_script,
)

from steerflow.state import StateDB

# a -> b -> c, and d, f on their own: a (role writer) and b, d (entry) declare files,
# f fails on its first invocation.
PLAN: dict[str, Any] = {
    "name": "artifacts",
    "roles": {"writer": {"artifacts": ["out/report.md"]}},
    "plan": [
        {"agent_id": "a", "assignee": "writer", "instruction": "write the report"},
        {"agent_id": "b", "instruction": "add b", "depends_on": ["a"], "artifacts": ["b.txt"]},
        {"agent_id": "c", "instruction": "read b", "depends_on": ["b"]},
        {"agent_id": "d", "instruction": "write d", "artifacts": ["d.txt"]},
        {"agent_id": "f", "instruction": "flaky"},
    ],
}
SCRIPT: dict[str, Any] = {
    "a": {"artifacts": {"out/report.md": "report A\n"}},
    "b": {"artifacts": {"b.txt": "bbbbbbbb"}},
    "d": {"artifacts": {"d.txt": "dddd"}},
    "f": {"fail_once": "flaky once"},
}


def _source(tmp_path: Path, *extra: object, plan: dict[str, Any] = PLAN) -> tuple[Path, Path]:
    """Run the plan (exit 1: f failed); (home, run dir)."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", SCRIPT)
    result = run_plan(home, write_yaml(tmp_path / "plan.yaml", plan), script, *extra)
    assert result.returncode == 1, result.explain()
    assert {n["id"]: n["status"] for n in result.json["nodes"]} == {
        "a": "completed",
        "b": "completed",
        "c": "completed",
        "d": "completed",
        "f": "failed",
    }
    return home, single_run(home)


def _delete(path: Path) -> str:
    path.unlink()
    return "missing"


def _truncate(path: Path) -> str:
    os.truncate(path, 3)
    return "size"


def _same_size_same_mtime(path: Path) -> str:
    before = path.stat()
    path.write_bytes(b"B" * before.st_size)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    return "digest"


def _symlink(path: Path) -> str:
    twin = path.parent.parent / "twin.txt"  # identical bytes: only following it would pass
    twin.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(twin)
    return "not_regular"


def _directory(path: Path) -> str:
    path.unlink()
    path.mkdir()
    return "not_regular"


TAMPER: dict[str, Callable[[Path], str]] = {
    "delete": _delete,
    "truncate": _truncate,
    "same-size-and-mtime": _same_size_same_mtime,
    "symlink": _symlink,
    "directory": _directory,
}


def _refused(result: CliResult, code: str = "artifacts-unsettled") -> dict[str, Any]:
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["status"] == "refused"
    assert body["error"]["code"] == code, result.explain()
    return body


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_a_tampered_artifact_refuses_the_resume_naming_node_and_file(
    tmp_path: Path, how: str
) -> None:
    home, run_dir = _source(tmp_path)
    reason = TAMPER[how](run_dir / "artifacts" / "b" / "b.txt")
    guard = SourceGuard.of(run_dir)
    calls = len(read_invocations(home))

    body = _refused(resume(home, run_dir.name, "--retry-failed", "--json"))
    message = body["error"]["message"]
    assert "node 'b': artifact 'b.txt': expected 8 bytes blake2b:" in message
    assert [(u["node"], u["path"], u["reason"]) for u in body["unsettled"]] == [
        ("b", "b.txt", reason)
    ]
    guard.assert_unchanged()  # the source checkpoint (and every file of the run) untouched
    assert run_dirs(home) == [run_dir], "a refused resume created a run directory"
    assert len(read_invocations(home)) == calls, "a refused resume invoked a node"

    verify = run_cli(home, "verify", run_dir.name)
    assert verify.returncode == 3, verify.explain()
    assert "node 'b': artifact 'b.txt'" in verify.stdout
    guard.assert_unchanged()


@pytest.mark.parametrize("how", ["delete", "truncate", "same-size-and-mtime"])
def test_rerun_unsettled_reruns_exactly_the_affected_node_and_its_dependents(
    tmp_path: Path, how: str
) -> None:
    home, run_dir = _source(tmp_path)
    b_txt = run_dir / "artifacts" / "b" / "b.txt"
    TAMPER[how](b_txt)
    result = resume(home, run_dir.name, "--retry-failed", "--rerun-unsettled", "--json")
    assert result.returncode == 0, result.explain()
    body = result.json
    assert body["status"] == "completed", result.explain()
    (new,) = new_runs(home, [run_dir])
    assert invocation_counts(home, run_id=new.name) == {"b": 1, "c": 1, "f": 1}
    assert [r["id"] for r in body["rerun_unsettled"]] == ["b", "c"]
    assert body["rerun_unsettled"][0]["unsettled"][0]["path"] == "b.txt"
    assert body["rerun_unsettled"][1]["unsettled"] == []
    assert "node 'b' runs again (--rerun-unsettled)" in result.stderr  # the progress line
    assert "node 'c' runs again (--rerun-unsettled): it depends on 'b'" in result.stderr
    # The re-run leg wrote into the source run's artifact root, so both runs settle.
    assert b_txt.read_bytes() == b"bbbbbbbb"
    assert not (new / "artifacts" / "b").exists()
    for run in (run_dir, new):
        verify = run_cli(home, "verify", run.name, "--json")
        assert verify.returncode == 0, verify.explain()
        assert {n["id"] for n in verify.json["nodes"]} == {"a", "b", "d"}
    if how == "delete":
        # The resumed run kept the replayed records: resuming it checks them as well.
        (run_dir / "artifacts" / "a" / "out" / "report.md").unlink()
        again = _refused(resume(home, new.name, "--json"))
        assert [(u["node"], u["reason"]) for u in again["unsettled"]] == [("a", "missing")]


def _leg_folder_symlink(path: Path) -> str:
    """The leg folder itself (``artifacts/b``) replaced by a link to an identical copy."""
    leg = path.parent
    twin = leg.parent / "twin-leg"
    shutil.copytree(leg, twin)
    shutil.rmtree(leg)
    leg.symlink_to(twin, target_is_directory=True)
    return "not_regular"


@pytest.mark.parametrize("how", ["symlink", "directory", "leg-folder-symlink"])
def test_a_rerun_that_could_not_write_its_file_is_refused_before_any_call(
    tmp_path: Path, how: str
) -> None:
    """A re-run leg never writes through a symlink or over a directory (decision 58), so a
    re-run it would refuse is refused up front: no model call, nothing created (decision
    102), instead of a node that fails after its call was paid for."""
    home, run_dir = _source(tmp_path)
    tamper = _leg_folder_symlink if how == "leg-folder-symlink" else TAMPER[how]
    tamper(run_dir / "artifacts" / "b" / "b.txt")
    guard = SourceGuard.of(run_dir)
    calls = len(read_invocations(home))
    body = _refused(resume(home, run_dir.name, "--retry-failed", "--rerun-unsettled", "--json"))
    message = body["error"]["message"]
    assert "--rerun-unsettled cannot re-run these nodes" in message
    assert "node 'b': artifact 'b.txt'" in message
    assert [(u["node"], u["reason"]) for u in body["unsettled"]] == [("b", "not_regular")]
    assert len(read_invocations(home)) == calls, "the refused resume paid for a call"
    assert run_dirs(home) == [run_dir], "a refused resume created a run directory"
    guard.assert_unchanged()


def test_a_role_s_artifacts_removed_between_runs_are_still_checked(tmp_path: Path) -> None:
    home, run_dir = _source(tmp_path)
    # Today's plan no longer declares anything for the writer role: irrelevant, the
    # resume reads the contract the source run persisted.
    write_yaml(tmp_path / "plan.yaml", {**PLAN, "roles": {"writer": {}}})
    (run_dir / "artifacts" / "a" / "out" / "report.md").unlink()
    body = _refused(resume(home, run_dir.name, "--retry-failed", "--json"))
    assert [(u["node"], u["path"]) for u in body["unsettled"]] == [("a", "out/report.md")]


def test_a_missing_persisted_contract_refuses_recorded_artifacts(tmp_path: Path) -> None:
    home, run_dir = _source(tmp_path)
    guard = SourceGuard.of(run_dir)
    with StateDB.open(home) as db:
        session = db.session_for_run(run_dir.name)
        assert session is not None and session.artifact_contract is not None
        db.set_artifact_contract(session.id, None)
    body = _refused(
        resume(home, run_dir.name, "--retry-failed", "--json"), code="artifact-contract-refused"
    )
    assert "state DB holds no artifact contract" in body["error"]["message"]
    verify = run_cli(home, "verify", run_dir.name, "--json")
    assert verify.returncode == 3 and verify.json["error"]["code"] == "artifact-contract-refused"
    guard.assert_unchanged()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # The DB's contract lost leg b's file: the copy declares what the DB does not.
        (
            lambda c: {**c, "legs": {k: v for k, v in c["legs"].items() if k != "b"}},
            "leg 'b' declares file 'b.txt' in the checkpoint but not in the state DB",
        ),
        # The DB's contract says leg d produces one more file than the checkpoint's copy.
        (
            lambda c: {**c, "legs": {**c["legs"], "d": ["d.txt", "extra.txt"]}},
            "leg 'd' declares file 'extra.txt' in the state DB but not in the checkpoint",
        ),
        (
            lambda c: {**c, "root": "/elsewhere"},
            "the artifact root is '/elsewhere' in the state DB",
        ),
    ],
)
def test_a_contract_that_differs_from_the_checkpoint_names_leg_and_file(
    tmp_path: Path, change: Callable[[dict[str, Any]], dict[str, Any]], named: str
) -> None:
    """Issue 26 item 6: "the two records disagree" named neither the leg nor the file."""
    home, run_dir = _source(tmp_path)
    guard = SourceGuard.of(run_dir)
    with StateDB.open(home) as db:
        session = db.session_for_run(run_dir.name)
        assert session is not None and session.artifact_contract is not None
        db.set_artifact_contract(session.id, change(session.artifact_contract))
    body = _refused(
        resume(home, run_dir.name, "--retry-failed", "--json"), code="artifact-contract-refused"
    )
    message = body["error"]["message"]
    assert "disagree" in message and named in message, message
    assert "sessions.artifact_contract_json" in message and "config.artifact_contract" in message
    assert read_invocations(home)  # the source ran; the refused resume added nothing:
    assert invocation_counts(home)["f"] == 1
    guard.assert_unchanged()


def test_an_original_run_with_save_is_settled_and_resumed_in_that_root(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    home, run_dir = _source(tmp_path, "--save", saved)
    assert (saved / "b" / "b.txt").is_file()
    assert not (run_dir / "artifacts" / "b").exists()
    assert run_cli(home, "verify", run_dir.name).returncode == 0

    other = resume(home, run_dir.name, "--retry-failed", "--save", tmp_path / "other", "--json")
    assert other.returncode == 2, other.explain()
    assert "is not the artifact root" in other.json["error"]["message"]

    (saved / "b" / "b.txt").write_bytes(b"tampered")
    refused = _refused(resume(home, run_dir.name, "--retry-failed", "--save", saved, "--json"))
    assert refused["unsettled"][0]["node"] == "b"

    result = resume(
        home, run_dir.name, "--retry-failed", "--rerun-unsettled", "--save", saved, "--json"
    )
    assert result.returncode == 0, result.explain()
    (new,) = new_runs(home, [run_dir])
    assert invocation_counts(home, run_id=new.name) == {"b": 1, "c": 1, "f": 1}
    assert (saved / "b" / "b.txt").read_bytes() == b"bbbbbbbb"
    assert not (new / "artifacts").exists() or not any((new / "artifacts").iterdir())
    verify = run_cli(home, "verify", new.name, "--json")
    assert verify.returncode == 0, verify.explain()
    assert verify.json["artifact_root"] == str(saved.absolute())


def test_spawned_leg_artifacts_are_found_under_the_spawn_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = {
        "name": "spawning",
        "plan": [
            {"agent_id": "e", "instruction": "emit"},
            {"agent_id": "f", "instruction": "flaky"},
        ],
    }
    script = write_script(
        tmp_path / "script.yaml",
        {
            "e": {
                "spawn": [
                    {
                        "agent_id": "fix-1",
                        "assignee": "coder",
                        "instruction": "fix it",
                        "artifacts": ["patch.diff"],
                    }
                ]
            },
            "fix-1": {"artifacts": {"patch.diff": "--- a\n+++ b\n"}},
            "f": {"fail_once": "flaky once"},
        },
    )
    result = run_plan(home, write_yaml(tmp_path / "plan.yaml", plan), script, "--reactive", "all")
    assert result.returncode == 1, result.explain()
    run_dir = single_run(home)
    leg = run_dir / "artifacts" / "fix-1"
    assert (leg / "patch.diff").is_file()
    verify = run_cli(home, "verify", run_dir.name, "--json")
    assert verify.returncode == 0, verify.explain()
    assert [(n["id"], n["kind"]) for n in verify.json["nodes"]] == [("fix-1", "spawned")]

    (leg / "patch.diff").unlink()
    guard = SourceGuard.of(run_dir)
    body = _refused(resume(home, run_dir.name, "--retry-failed", "--json"))
    assert [(u["node"], u["kind"], u["reason"]) for u in body["unsettled"]] == [
        ("fix-1", "spawned", "missing")
    ]
    guard.assert_unchanged()
    result = resume(home, run_dir.name, "--retry-failed", "--rerun-unsettled", "--json")
    assert result.returncode == 0, result.explain()
    (new,) = new_runs(home, [run_dir])
    assert invocation_counts(home, run_id=new.name) == {"fix-1": 1, "f": 1}
    assert (leg / "patch.diff").is_file()
    assert run_cli(home, "verify", new.name).returncode == 0


def test_verify_and_show_report_each_artifact_with_size_and_digest(tmp_path: Path) -> None:
    home, run_dir = _source(tmp_path)
    verify = run_cli(home, "verify", run_dir.name, "--json")
    assert verify.returncode == 0, verify.explain()
    body = verify.json
    assert body["status"] == "settled" and body["exit_code"] == 0 and body["checked"] == 3
    assert body["artifact_root"] == str(run_dir / "artifacts")
    records = {n["id"]: n["artifacts"] for n in body["nodes"]}
    assert records["b"][0]["path"] == "b.txt" and records["b"][0]["bytes"] == 8
    digest = records["b"][0]["digest"]
    assert digest.startswith("blake2b:") and len(digest) == len("blake2b:") + 64

    human = run_cli(home, "verify", run_dir.name)
    assert human.returncode == 0 and "settled: 3 recorded artifacts of 3 nodes" in human.stdout

    shown = run_cli(home, "show", run_dir.name)
    assert f"artifact b.txt  8 bytes  {digest}" in shown.stdout, shown.explain()
    node = run_cli(home, "show", run_dir.name, "b")
    assert f"b.txt  8 bytes  {digest}" in node.stdout, node.explain()

    shutil.rmtree(run_dir / "artifacts" / "d")
    unsettled = run_cli(home, "verify", run_dir.name, "--json")
    assert unsettled.returncode == 3
    assert unsettled.json["status"] == "unsettled" and unsettled.json["exit_code"] == 3
    assert unsettled.json["unsettled"] == [
        {
            "node": "d",
            "kind": "planned",
            "path": "d.txt",
            "reason": "missing",
            "expected": {"bytes": 4, "digest": records["d"][0]["digest"]},
            "found": {"bytes": None, "digest": None, "detail": None},
        }
    ]
