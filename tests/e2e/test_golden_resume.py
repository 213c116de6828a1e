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
from steerflow.checkpoint import entry_digest, load_checkpoint

GOLDEN = Path(make_golden.__file__).resolve().parent


@pytest.mark.parametrize("unit", sorted({**make_golden.UNITS, **make_golden.FROZEN}))
def test_resume_of_a_golden_unit_replays_exactly_the_recorded_nodes(
    tmp_path: Path, unit: str
) -> None:
    run_id = {**make_golden.UNITS, **make_golden.FROZEN}[unit][0]
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


def _copy_kind_unit(tmp_path: Path, unit: str) -> tuple[Path, Path, str]:
    run_id = make_golden.KIND_UNITS[unit]
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True, mode=0o700)
    source = home / "runs" / run_id
    shutil.copytree(GOLDEN / unit / "runs" / run_id, source)
    shutil.copy(GOLDEN / make_golden.SCRIPT, tmp_path / make_golden.SCRIPT)
    return home, source, run_id


@pytest.mark.parametrize("unit", ["agent-v3", "agent-v3-legacy"])
def test_resume_of_a_golden_agent_unit_runs_exactly_the_turn_in_flight(
    tmp_path: Path, unit: str
) -> None:
    """Both forms: turns 1 and 2 replayed (no call), turn 3 run once with its recorded
    prompt; the resumed checkpoint is in today's form (every turn says what it is)."""
    home, source, run_id = _copy_kind_unit(tmp_path, unit)
    guard = SourceGuard.of(source)
    dry = run_cli(home, "resume", run_id, "--dry-run", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.explain()
    assert [(n["id"], n["status"]) for n in dry.json["nodes"]] == [
        ("turn-1", "completed"),
        ("turn-2", "completed"),
        ("turn-3", "pending"),
    ]

    result = run_cli(home, "resume", run_id, "--json", cwd=tmp_path)

    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["status"] == "completed" and out["kind"] == "agent"
    guard.assert_unchanged()
    assert invocation_counts(home) == {"turn-3": 1}
    assert [(t["id"], t["replayed"]) for t in out["turns"]] == [
        ("turn-1", True),
        ("turn-2", True),
        ("turn-3", False),
    ]
    in_flight = make_golden.IN_FLIGHT
    assert out["turns"][2]["controls"] == in_flight["controls"]
    assert str(out["turns"][2]["response"]).count("add tests") == 1
    (resumed,) = new_runs(home, [source])
    state, report = load_checkpoint(resumed / CHECKPOINT)
    assert report["status"] == "clean" and "agent" not in state["flow_context"]
    for number, prompt, controls, response in make_golden.TURNS:
        entry = state["ops"][f"turn-{number}"]
        assert (entry["turn"], entry["instruction"], entry["controls"], entry["response"]) == (
            number,
            prompt,
            controls,
            response,
        )
        assert entry["result_digest"] == entry_digest(entry)
    turn3 = state["ops"]["turn-3"]
    assert (turn3["turn"], turn3["instruction"]) == (3, in_flight["instruction"])
    assert turn3["conversation"] == make_golden.CONVERSATION


@pytest.mark.parametrize("unit", ["escalation-v3", "escalation-v3-legacy"])
def test_resume_of_a_golden_escalation_unit_replays_the_chain_and_runs_b(
    tmp_path: Path, unit: str
) -> None:
    """The failed attempt and its retry are replayed (neither runs again, no flag needed);
    ``b`` runs once after the chain's end; the resumed retry entry carries its attempt."""
    home, source, run_id = _copy_kind_unit(tmp_path, unit)
    guard = SourceGuard.of(source)
    result = run_cli(home, "resume", run_id, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.explain()
    assert result.json["status"] == "completed"
    guard.assert_unchanged()
    assert invocation_counts(home) == {"b": 1}
    (resumed,) = new_runs(home, [source])
    state, _ = load_checkpoint(resumed / CHECKPOINT)
    assert state["ops"]["a"]["status"] == "failed"
    (retry,) = state["spawned"]
    plan_ids = {p["agent_id"]: p["node_id"] for p in state["plan"]}
    assert (retry["spawn_id"], retry["status"], retry["escalation"]) == ("a.esc1", "completed", 1)
    assert retry["escalated_from"] == retry["parent_id"] == plan_ids["a"]
    assert retry["result_digest"] == entry_digest(retry)
    assert "### a.esc1 (completed)\nrecorded: rescued" in str(state["ops"]["b"]["response"])
