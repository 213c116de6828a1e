"""``steerflow resume`` of a copy of each golden unit (``tests/golden/``) replays exactly it.

The golden units record ``research``, ``draft`` (witnessing ``fix-1`` and ``fix-2``) and
``fix-1`` as completed, ``fix-2`` as pending spawn intent, and never reach ``review``.  A
resume must replay the three recorded outcomes unchanged and invoke exactly ``fix-2`` and
``review``, once each, for the v2 snapshot, the v3 journal and the compacted v3 unit alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from flow_support import run_cli
from resume_support import (
    CHECKPOINT,
    SourceGuard,
    invocation_counts,
    new_runs,
    run_dirs,
)

from golden import make_golden
from steerflow.checkpoint import load_checkpoint

GOLDEN = Path(make_golden.__file__).resolve().parent


@pytest.mark.parametrize("unit", sorted(make_golden.UNITS))
def test_resume_of_a_golden_unit_replays_exactly_the_recorded_nodes(
    tmp_path: Path, unit: str
) -> None:
    run_id = make_golden.UNITS[unit][0]
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True, mode=0o700)
    source = home / "runs" / run_id
    shutil.copytree(GOLDEN / unit / "runs" / run_id, source)
    # The config names ``script:golden-script.yaml``: relative to the resume's directory.
    shutil.copy(GOLDEN / make_golden.SCRIPT, tmp_path / make_golden.SCRIPT)
    recorded, _ = load_checkpoint(source)
    guard = SourceGuard.of(source)

    result = run_cli(home, "resume", run_id, "--json", cwd=tmp_path)

    assert result.returncode == 0, result.explain()
    assert result.json["status"] == "completed", result.explain()
    guard.assert_unchanged()
    assert invocation_counts(home) == {"fix-2": 1, "review": 1}
    (resumed,) = new_runs(home, [source])
    assert len(run_dirs(home)) == 2
    state, report = load_checkpoint(resumed / CHECKPOINT)
    assert report["status"] == "clean"
    assert state["session_id"] != recorded["session_id"]
    for key in ("research", "draft"):
        assert state["ops"][key]["response"] == recorded["ops"][key]["response"]
        assert state["ops"][key]["result_digest"] == recorded["ops"][key]["result_digest"]
    assert state["ops"]["draft"]["spawned_ids"] == recorded["ops"]["draft"]["spawned_ids"]
    assert state["ops"]["review"]["status"] == "completed"
    assert str(state["ops"]["review"]["response"]).startswith("[echo review]")
    spawned = {e["spawn_id"]: e for e in state["spawned"]}
    assert sorted(spawned) == ["fix-1", "fix-2"]
    old = {e["spawn_id"]: e for e in recorded["spawned"]}
    assert spawned["fix-1"]["response"] == old["fix-1"]["response"]
    assert spawned["fix-1"]["node_id"] == old["fix-1"]["node_id"]
    assert spawned["fix-2"]["node_id"] == old["fix-2"]["node_id"]
    assert spawned["fix-2"]["status"] == "completed"
    assert str(spawned["fix-2"]["response"]).startswith("[echo fix-2]")
