"""Every check that can be made before paying is made before paying (issue 26 item 4).

Real CLI processes on the ``script:`` model, whose every call is a line in
``<home>/script-invocations.jsonl``:

* ``--save DIR`` that cannot be written is refused up front (one line, exit 3, naming the
  folder and the cause) before any call, the planner's included (decision 102). The tests
  run as root (like CI), which writes anywhere; so the flow runs without
  ``CAP_DAC_OVERRIDE`` (``setpriv``) against a folder another user owns, as the issue's
  user did, or against a read-only filesystem.
* A synthesis over zero completed workers is skipped with its reason, unless the plan
  asks for it (``synthesis.when_all_failed: run``, decision 103).

The ``--rerun-unsettled`` pre-checks are in ``test_artifact_settle_e2e.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    PYTHON,
    CliResult,
    child_env,
    read_invocations,
    run_cli,
    show_in_process,
    write_yaml,
)

from steerflow.checkpoint import load_checkpoint
from steerflow.state import StateDB

SLOW_PLANNER = Path(__file__).resolve().with_name("ctl_slowplan.py")
#: Root without the capability that lets it ignore permission bits.
NO_DAC_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]

PLAN: dict[str, Any] = {
    "name": "build",
    "plan": [{"agent_id": "build", "instruction": "build it", "artifacts": ["out.txt"]}],
}


def _as_user_without_override(home: Path, *args: object) -> CliResult:
    argv = [*NO_DAC_OVERRIDE, PYTHON, "-m", "steerflow", "--home", str(home), *map(str, args)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=child_env(), check=False
    )
    return CliResult([str(a) for a in args], done.returncode, done.stdout, done.stderr)


@pytest.fixture
def others_folder(tmp_path: Path) -> Path:
    """A folder owned by another user (nobody), 0755: we may read it, not write it."""
    folder = tmp_path / "shared-build"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    folder.chmod(0o755)
    return folder


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "mounting a tmpfs needs root (CI runs as root)"
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.strip()}"
    try:
        yield mount
    finally:
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        assert done.returncode == 0, f"cannot unmount {mount}: {done.stderr.strip()}"


def _one_refusal(result: CliResult, folder: Path, cause: str) -> None:
    assert result.returncode == 3, result.explain()
    assert "Traceback" not in result.stderr, result.explain()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.explain()
    assert lines[0].startswith("steerflow: error: "), result.explain()
    assert str(folder) in lines[0] and cause in lines[0], lines[0]


def _nothing_ran(home: Path) -> None:
    assert read_invocations(home) == []
    runs = home / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], "a run directory was created"


def test_save_to_a_folder_we_cannot_write_is_refused_before_any_call(
    tmp_path: Path, others_folder: Path
) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "script.yaml", {"build": {"artifacts": {"out.txt": "x"}}})
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    result = _as_user_without_override(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--save", others_folder
    )
    _one_refusal(result, others_folder, "Permission denied")
    _nothing_ran(home)


def test_save_on_a_read_only_filesystem_is_refused_before_the_planner_is_called(
    tmp_path: Path, read_only_disk: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "release-plan").touch()  # the planner would answer at once: it must not be asked
    argv = [sys.executable, str(SLOW_PLANNER), "--home", str(home), "flow", "Plan it",
            "--model", "echo", "--save", str(read_only_disk)]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=child_env(), check=False
    )
    result = CliResult(argv, done.returncode, done.stdout, done.stderr)
    _one_refusal(result, read_only_disk, "Read-only file system")
    assert not (home / "planner-calls.log").exists(), "the planner was called"
    _nothing_ran(home)


# -- synthesis over zero completed workers ---------------------------------------------------


def _failing_workers(tmp_path: Path, **synthesis: str) -> CliResult:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "all-fail",
            "synthesis": {"instruction": "Summarize the results.", **synthesis},
            "plan": [
                {"agent_id": "a", "instruction": "first"},
                {"agent_id": "b", "instruction": "second"},
            ],
        },
    )
    script = write_yaml(tmp_path / "script.yaml", {"*": {"fail": "the model is down"}})
    return run_cli(
        tmp_path / "home", "flow", "--plan", plan, "--model", f"script:{script}", "--json"
    )


def test_a_synthesis_over_no_completed_worker_is_skipped_with_its_reason(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = _failing_workers(tmp_path)
    assert result.returncode == 1, result.explain()
    body = result.json
    assert body["status"] == "failed"
    assert sorted(line["node"] for line in read_invocations(home)) == ["a", "b"]
    nodes = {n["id"]: n for n in body["nodes"]}
    assert [nodes[k]["status"] for k in ("a", "b", "synthesis")] == ["failed", "failed", "skipped"]
    reason = nodes["synthesis"]["reason"]
    assert "no worker completed" in reason and "when_all_failed: run" in reason
    assert "node skipped synthesis" in result.stderr  # the progress line

    shown = show_in_process(home, str(body["run_id"]))
    assert {n["id"]: n["status"] for n in shown["nodes"]}["synthesis"] == "skipped"
    node = run_cli(home, "show", body["run_id"], "synthesis", "--json")
    assert node.returncode == 0, node.explain()
    assert node.json["note"] == f"skipped: {reason}, so it never ran"
    # Not an outcome: the checkpoint records none, so a resume decides again (decision 103).
    state, _ = load_checkpoint(Path(str(body["run_dir"])))
    assert set(state["ops"]) == {"a", "b"}
    with StateDB.open(home) as db:
        (row,) = [n for n in db.list_nodes(str(body["session_id"])) if n.node_key == "synthesis"]
    assert row.status == "skipped" and row.detail["skipped"] == reason


def test_when_all_failed_run_pays_for_a_synthesis_of_the_failures(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = _failing_workers(tmp_path, when_all_failed="run")
    assert result.returncode == 1, result.explain()
    assert sorted(line["node"] for line in read_invocations(home)) == ["a", "b", "synthesis"]
    state, _ = load_checkpoint(Path(str(result.json["run_dir"])))
    # The script fails every call, the synthesis's too; it was asked and it was made.
    assert state["ops"]["synthesis"]["status"] == "failed"
    assert state["config"]["synthesis"]["when_all_failed"] == "run"


def test_when_all_failed_is_checked_like_every_plan_key(tmp_path: Path) -> None:
    result = _failing_workers(tmp_path, when_all_failed="sometimes")
    assert result.returncode == 2, result.explain()
    error = result.json["error"]
    assert error["code"] == "plan-invalid"
    assert "synthesis.when_all_failed: Input should be 'skip' or 'run'" in error["message"]
    assert read_invocations(tmp_path / "home") == []
