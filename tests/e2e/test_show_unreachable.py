"""``show`` of a run whose directory is gone from this home (SQLite state DB), end to end.

The state DB still knows the run (its session and ``session_nodes`` rows), so plain
``show`` prints status, phase and node statuses from the DB and says in one line that the
checkpoint is not reachable; what needs the checkpoint (``show RUN NODE``, ``resume``,
``verify``) refuses in one line with exit 3. (Across hosts on PostgreSQL:
``test_two_hosts_pg.py``.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from flow_support import run_cli, write_yaml
from resume_support import single_run


def _plan(path: Path) -> Path:
    entries: list[dict[str, Any]] = [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
    ]
    return write_yaml(path, {"name": "t", "plan": entries})


def test_show_reads_the_state_db_when_the_run_directory_is_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {"a": {"response": "alpha"}})
    flow = run_cli(
        home, "flow", "--plan", _plan(tmp_path / "plan.yaml"), "--model", f"script:{script}",
        "--json",
    )  # fmt: skip
    assert flow.returncode == 0, flow.explain()
    run, sid = flow.json["run_id"], flow.json["session_id"]
    before = run_cli(home, "show", run, "--json")
    assert before.returncode == 0, before.explain()
    assert before.json["reachable"] is True and before.json["checkpoint"]["exists"] is True
    run_dir = single_run(home)
    shutil.rmtree(run_dir)

    for target in (run, sid):
        view = run_cli(home, "show", target, "--json")
        assert view.returncode == 0, view.explain()
        got = view.json
        assert (got["run_id"], got["session_id"], got["status"]) == (run, sid, "completed")
        assert [(n["id"], n["status"]) for n in got["nodes"]] == [
            ("a", "completed"),
            ("b", "completed"),
        ]
        assert got["reachable"] is False and got["checkpoint"] is None
        assert got["checkpoint_recovery"] is None
        assert set(before.json) == set(got)  # the same keys as a reachable run
        assert got["summary"]["completed"] == 2

        human = run_cli(home, "show", target)
        assert human.returncode == 0, human.explain()
        assert "status: completed" in human.stdout
        unreachable = [line for line in human.stdout.splitlines() if "not reachable" in line]
        assert unreachable == [
            f"checkpoint: not reachable from this host (run directory {str(run_dir)!r} is "
            "missing); node detail, resume and verify need it"
        ], human.stdout
        assert any(
            line.split()[:2] == ["completed", "planned"] for line in human.stdout.splitlines()
        )

    for command in (("show", run, "a"), ("resume", run), ("verify", sid)):
        refused = run_cli(home, *command)
        assert refused.returncode == 3, (command, refused.explain())
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "is missing" in lines[0], (command, lines)
