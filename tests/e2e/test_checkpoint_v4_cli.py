"""The CLI's readers on a version 4 checkpoint (issue 43 item 4, decision 340).

A real ``flow --checkpoint-version 4`` run (echo model, compacting after every record,
so its manifest names several segments, its journals among them); then ``verify``,
``show --json``, the Studio's run page, ``db rebuild`` (into a new state DB) and ``resume``
read it, each a new process but the Studio (served over loopback from this one).
"""

from __future__ import annotations

import json
from pathlib import Path

from flow_support import run_cli
from test_studio_e2e import studio

PLAN = {
    "plan": [
        {"agent_id": "a", "instruction": "Do a."},
        {"agent_id": "b", "instruction": "Do b.", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "Do c.", "depends_on": ["b"]},
    ]
}


def test_verify_show_rebuild_and_resume_read_a_v4_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    flow = run_cli(
        home, "flow", "--plan", plan, "--model", "echo", "--checkpoint-version", "4",
        "--compact-records", "1", "--json",
    )  # fmt: skip
    assert flow.returncode == 0, flow.stderr
    run_id, run_dir = flow.json["run_id"], Path(flow.json["run_dir"])
    manifest = json.loads((run_dir / "checkpoint.json").read_text())
    assert manifest["version"] == 4 and len(manifest["segments"]) >= 2
    # Its compactions published their journals as segments (decision 395): the readers
    # below read that form.
    assert [ref for ref in manifest["segments"] if "journal" in ref]
    verify = run_cli(home, "verify", run_id)
    assert verify.returncode == 0, verify.stderr
    show = run_cli(home, "show", run_id, "--json")
    assert show.returncode == 0, show.stderr
    assert show.json["checkpoint"]["version"] == 4
    with studio(home) as served, served.client() as client:  # the Studio reads it too
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200, page.text
        assert "<dt>checkpoint</dt><dd>v4</dd>" in page.text
    (home / "state.db").rename(tmp_path / "old.db")
    rebuild = run_cli(home, "db", "rebuild")
    assert rebuild.returncode == 0, rebuild.stderr
    assert "1 registered" in rebuild.stdout
    resumed = run_cli(home, "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json["status"] == "completed"
    assert resumed.json["result"] == flow.json["result"]  # all replayed from version 4
    # ...into version 4 again: a batch stays linear across its resumes (decision 394)
    assert resumed.json["checkpoint"]["version"] == 4


def test_a_batch_left_on_version_3_is_told_to_use_version_4(tmp_path: Path) -> None:
    """CONTRACT §8 keeps version 3 the default; a flow that admits a batch says so once."""
    home = tmp_path / "home"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    base = ["flow", "--plan", plan, "--model", "echo", "--json"]
    hint = "give --checkpoint-version 4 (docs/batches.md)"
    told = run_cli(home, *base, "--max-plan-entries", "5000")
    assert told.returncode == 0, told.stderr
    assert told.stderr.count(hint) == 1 and told.json["checkpoint"]["version"] == 3
    for extra in (
        ["--max-plan-entries", "5000", "--checkpoint-version", "3"],  # chosen: no hint
        ["--max-plan-entries", "5000", "--checkpoint-version", "4"],
        ["--max-plan-entries", "1000"],  # no batch
    ):
        quiet = run_cli(home, *base, *extra)
        assert quiet.returncode == 0, quiet.stderr
        assert hint not in quiet.stderr, extra
