"""``steerflow.views``: the typed library readers agree with what the CLI prints (issue 14).

Runs are made by the real CLI in subprocesses; each reader's ``to_json()`` is compared
with the matching command's ``--json`` output, read after the run ended (so nothing
moves between the two reads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, run_cli, write_yaml

from steerflow import views
from steerflow.errors import NotRunningError, UnknownIdError


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


def _flow(home: Path, tmp_path: Path, script: dict[str, Any], *extra: object) -> CliResult:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "views",
            "plan": [
                {"agent_id": "a", "instruction": "first <b>bold</b>"},
                {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
                {"agent_id": "c", "instruction": "third", "depends_on": ["a"]},
            ],
        },
    )
    model = f"script:{write_yaml(tmp_path / 'script.yaml', script)}"
    return run_cli(home, "flow", "--plan", plan, "--model", model, "--json", *extra)


def _json(home: Path, *args: object) -> dict[str, Any]:
    result = run_cli(home, *args, "--json")
    assert result.returncode in (0, 1), result.explain()
    return result.json


def _same(view: dict[str, Any], printed: dict[str, Any]) -> None:
    """Equal as JSON (tuples are lists, numbers are numbers once printed)."""
    assert json.loads(json.dumps(view, default=str)) == printed


def test_readers_agree_with_show_runs_result_and_ctl_status(home: Path, tmp_path: Path) -> None:
    flow = _flow(home, tmp_path, {"a": {"response": "alpha"}, "b": {"response": "beta"}})
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]

    shown = views.show_run(home, run)
    assert isinstance(shown, views.RunView)
    # An ended run has no phase (issue 38 item 7; the stored column says `executing`).
    assert (shown.status, shown.phase, shown.kind) == ("completed", None, "flow")
    assert [n.id for n in shown.nodes] == ["a", "b", "c"]
    assert all(isinstance(n, views.NodeState) and n.status == "completed" for n in shown.nodes)
    assert shown.checkpoint_version == 3 and shown.checkpoint_exists
    _same(shown.to_json(), _json(home, "show", run))
    # A prefix of the run id resolves as it does for `show`.
    _same(views.show_run(home, run[:17]).to_json(), _json(home, "show", run[:17]))

    listed = views.list_runs(home)
    assert [r.run_id for r in listed] == [run]
    assert isinstance(listed[0], views.RunListing) and listed[0].status == "completed"
    _same({"runs": [r.to_json() for r in listed]}, _json(home, "runs"))
    assert views.list_runs(home, status="failed") == []

    node = views.node_detail(home, run, "b")
    assert isinstance(node, views.NodeDetail)
    assert (node.id, node.status, node.response) == ("b", "completed", "beta")
    assert node.instruction is not None and "alpha" in node.instruction
    assert node.depends_on == ("a",) and node.response_text == "beta"
    _same(node.to_json(), _json(home, "show", run, "b"))

    result = views.run_result(home, run)
    assert result.completed and result.source == "sinks"
    printed = _json(home, "result", run)
    assert printed.pop("exit_code") == 0
    _same(result.to_json(), printed)

    status = views.control_status(home, shown.session_id or "")
    assert isinstance(status, views.ControlStatus) and status.controls == ()
    _same(status.to_json(), _json(home, "ctl", "status", shown.session_id or ""))

    report = views.checkpoint_report(home, run)
    assert (report.status, report.version, report.error) == ("clean", 3, None)
    assert report.report == shown.checkpoint_recovery


def test_readers_name_what_they_cannot_find(home: Path, tmp_path: Path) -> None:
    assert views.list_runs(home) == []  # no state DB yet: nothing listed, nothing created
    assert not home.exists()
    flow = _flow(home, tmp_path, {})
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]
    with pytest.raises(UnknownIdError, match="no node 'zz'"):
        views.node_detail(home, run, "zz")
    with pytest.raises(UnknownIdError):
        views.show_run(home, "19990101T000000-abcdef")
    # The writers are ctl's: a finished session refuses, as `ctl pause` does (exit 3).
    with pytest.raises(NotRunningError):
        views.pause(home, flow.json["session_id"])
    ctl = run_cli(home, "ctl", "pause", flow.json["session_id"])
    assert ctl.returncode == 3, ctl.explain()


def test_checkpoint_report_refused_and_missing(home: Path, tmp_path: Path) -> None:
    flow = _flow(home, tmp_path, {})
    assert flow.returncode == 0, flow.explain()
    run_dir = Path(flow.json["run_dir"])
    checkpoint = run_dir / "checkpoint.json"
    checkpoint.write_text("{not json", encoding="utf-8")
    report = views.checkpoint_report(home, flow.json["run_id"])
    assert report.status == "refused" and report.error
    assert report.report is not None and report.report["status"] == "refused"
    # show reads the same loader and reports the same refusal.
    assert views.show_run(home, flow.json["run_id"]).checkpoint_recovery == report.report
    checkpoint.unlink()
    (run_dir / "checkpoint.json.journal").unlink(missing_ok=True)
    missing = views.checkpoint_report(home, flow.json["run_id"])
    assert (missing.status, missing.report, missing.version) == ("missing", None, None)


def test_resume_preflight_is_resume_dry_run(home: Path, tmp_path: Path) -> None:
    flow = _flow(home, tmp_path, {"a": {"response": "alpha"}, "b": {"fail": "broken on purpose"}})
    assert flow.returncode == 1, flow.explain()
    run = flow.json["run_id"]

    refused = views.resume_preflight(home, run)
    assert not refused.allowed and refused.refusal is not None
    dry = run_cli(home, "resume", run, "--dry-run", "--json")
    assert dry.returncode == refused.refusal.exit_code == 3, dry.explain()
    assert dry.json["error"] == {
        "code": refused.refusal.code,
        "message": refused.refusal.message,
    }
    assert "'b'" in refused.refusal.message  # the rule names the node it refuses on

    allowed = views.resume_preflight(home, run, retry_failed=True)
    assert allowed.allowed and allowed.refusal is None
    dry = run_cli(home, "resume", run, "--dry-run", "--retry-failed", "--json")
    assert dry.returncode == 0, dry.explain()
    assert list(allowed.nodes) == dry.json["nodes"]
    assert allowed.replayed == ["a", "c"] and allowed.to_run == ["b"]
    assert allowed.checkpoint_recovery == dry.json["checkpoint_recovery"]
    # Nothing was claimed or created: still one run, and a real resume is not refused.
    assert [r.run_id for r in views.list_runs(home)] == [run]
    with pytest.raises(UnknownIdError):
        views.resume_preflight(home, "19990101T000000-abcdef")
