"""Hostile and careless input (issue 11): path-safe ids, leg paths, --save modes, the plan
entry limit and consent for agent workers named by a file. Real CLI processes, real files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    chain_plan,
    child_env,
    node_status,
    read_invocations,
    run_cli,
    write_yaml,
)

from steerflow.checkpoint import load_checkpoint

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _run_dirs(home: Path) -> list[Path]:
    runs = home / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def _entries(n: int) -> list[dict[str, Any]]:
    return [{"agent_id": f"n{i:04d}", "instruction": f"task {i}"} for i in range(n)]


# -- 1. ids cannot name a path component -------------------------------------------------------


@pytest.mark.parametrize("bad", ["..", ".", ".hidden"])
def test_plan_id_naming_a_path_component_exits_2_naming_the_entry(
    home: Path, tmp_path: Path, bad: str
) -> None:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"plan": [{"agent_id": "a", "instruction": "x"}, {"agent_id": bad, "instruction": "y"}]},
    )
    result = run_cli(home, "flow", "--plan", plan)
    assert result.returncode == 2, result.explain()
    assert f"{plan}:4" in result.stderr and "plan[1].agent_id" in result.stderr
    assert _run_dirs(home) == []


def test_spawn_of_dotdot_is_rejected_and_the_run_stays_resumable(
    home: Path, tmp_path: Path
) -> None:
    plan = chain_plan(tmp_path / "plan.yaml", ("root", "last"))
    # Today's attack: a spawned `..` gets the run directory as its leg directory and its
    # artifact overwrites checkpoint.json. `last` fails once so there is something to resume.
    evil = {"agent_id": "..", "instruction": "x"}
    script = write_yaml(
        tmp_path / "script.yaml",
        {
            "root": {"spawn": [evil, {"agent_id": ".hidden", "instruction": "y"}]},
            "..": {"artifacts": {"checkpoint.json": "garbage"}},
            ".hidden": {"artifacts": {"x.txt": "hidden"}},
            "last": {"fail_once": "transient"},
        },
    )
    args = ["flow", "--plan", plan, "--model", f"script:{script}", "--reactive", "all", "--json"]
    first = run_cli(home, *args)
    assert first.returncode == 1, first.explain()
    out = first.json
    assert [(r["agent_id"], r["reason"]) for r in out["spawn_rejections"]] == [
        ("..", "invalid_id"),
        (".hidden", "invalid_id"),
    ]
    assert "invalid_id" in first.stderr  # printed like the other rejection reasons
    assert node_status(out) == {"root": "completed", "last": "failed"}
    assert out["checkpoint"]["persisted"] is True
    run_dir = Path(out["run_dir"])
    state, report = load_checkpoint(run_dir / "checkpoint.json")
    assert report["status"] == "clean" and state["session_id"] == out["session_id"]
    # Leg directories are lazy (decision 62): nobody wrote, so none exists, `..` least of all.
    assert sorted(p.name for p in (run_dir / "artifacts").iterdir()) == []

    resumed = run_cli(home, "resume", out["run_id"], "--retry-failed", "--json")
    assert resumed.returncode == 0, resumed.explain()
    assert node_status(resumed.json) == {"root": "completed", "last": "completed"}


@pytest.mark.parametrize("bad", ["../x.txt", "/abs/x.txt", "sub/../../x.txt"])
def test_script_artifact_outside_the_leg_fails_the_node(
    home: Path, tmp_path: Path, bad: str
) -> None:
    save = tmp_path / "save"
    plan = chain_plan(tmp_path / "plan.yaml", ("build", "after"))
    script = write_yaml(tmp_path / "script.yaml", {"build": {"artifacts": {bad: "escaped"}}})
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--save", save, "--json"
    )
    assert result.returncode == 1, result.explain()
    assert node_status(result.json) == {"build": "failed", "after": "skipped"}
    error = next(n for n in result.json["nodes"] if n["id"] == "build")["error"]
    assert bad in error and "artifact path" in error
    assert not (save / "x.txt").exists() and not (tmp_path / "x.txt").exists()
    assert not Path("/abs/x.txt").exists()


def test_symlinked_leg_subdirectory_fails_the_node(home: Path, tmp_path: Path) -> None:
    save, outside = tmp_path / "save", tmp_path / "outside"
    outside.mkdir()
    (save / "build").mkdir(parents=True)
    (save / "build" / "sub").symlink_to(outside, target_is_directory=True)
    (save / "other").symlink_to(outside, target_is_directory=True)  # a whole leg as a symlink
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {"agent_id": "build", "instruction": "x"},
                {"agent_id": "other", "instruction": "y"},
            ]
        },
    )
    script = write_yaml(
        tmp_path / "script.yaml",
        {"build": {"artifacts": {"sub/x.txt": "escaped"}}, "other": {"artifacts": {"y": "z"}}},
    )
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--save", save, "--json"
    )
    assert result.returncode == 1, result.explain()
    assert node_status(result.json) == {"build": "failed", "other": "failed"}
    errors = {n["id"]: n["error"] for n in result.json["nodes"]}
    assert "symlink" in errors["build"] and "sub/x.txt" in errors["build"]
    assert "symlink" in errors["other"]
    assert list(outside.iterdir()) == []


# -- 3. --save never changes an existing directory's mode --------------------------------------


@pytest.mark.parametrize("mode", [0o1777, 0o755])
def test_save_keeps_an_existing_directorys_mode(home: Path, tmp_path: Path, mode: int) -> None:
    save = tmp_path / "shared"
    save.mkdir()
    save.chmod(mode)
    script = write_yaml(tmp_path / "script.yaml", {"a": {"artifacts": {"out.txt": "x"}}})
    plan = chain_plan(tmp_path / "p.yaml")
    result = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--save", save)
    assert result.returncode == 0, result.explain()
    assert stat.S_IMODE(save.stat().st_mode) == mode
    assert stat.S_IMODE((save / "a").stat().st_mode) == 0o700  # what steerflow made is private


def test_save_creates_missing_directories_0700(home: Path, tmp_path: Path) -> None:
    save = tmp_path / "new" / "deeper"
    script = write_yaml(tmp_path / "script.yaml", {"a": {"artifacts": {"out.txt": "x"}}})
    plan = chain_plan(tmp_path / "p.yaml")
    old = os.umask(0o022)
    try:
        result = run_cli(
            home, "flow", "--plan", plan, "--model", f"script:{script}", "--save", save
        )
    finally:
        os.umask(old)
    assert result.returncode == 0, result.explain()
    for path in (tmp_path / "new", save, save / "a"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_save_naming_a_file_exits_2_and_leaves_no_run_dir(home: Path, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("mine")
    plan = chain_plan(tmp_path / "p.yaml")
    result = run_cli(home, "flow", "--plan", plan, "--save", not_a_dir / "sub")
    assert result.returncode == 2, result.explain()
    assert _run_dirs(home) == [] and not_a_dir.read_text() == "mine"


# -- 4. no silent truncation: --max-plan-entries -----------------------------------------------


def test_plan_over_the_default_limit_exits_2_naming_count_and_flag(
    home: Path, tmp_path: Path
) -> None:
    entries = _entries(1001)
    plan = write_yaml(tmp_path / "big.yaml", {"plan": entries})
    for args in (["flow", "--plan", plan], ["flow", "--plan", plan, "--dry-run"]):
        result = run_cli(home, *args)
        assert result.returncode == 2, result.explain()
        assert "1001" in result.stderr and "--max-plan-entries" in result.stderr
    as_json = run_cli(home, "flow", "--plan", plan, "--json")
    assert as_json.returncode == 2
    assert "1001" in as_json.json["error"]["message"]
    assert _run_dirs(home) == []

    (home / "playbooks").mkdir(parents=True, exist_ok=True)
    write_yaml(home / "playbooks" / "huge.yaml", {"plan": entries})
    played = run_cli(home, "play", "huge")
    assert played.returncode == 2, played.explain()
    assert "1001" in played.stderr and "--max-plan-entries" in played.stderr
    small = run_cli(home, "play", "huge", "--max-plan-entries", "5")
    assert small.returncode == 2 and "1001" in small.stderr
    assert _run_dirs(home) == []


def test_raised_limit_runs_every_entry_and_keeps_a_late_edge(home: Path, tmp_path: Path) -> None:
    entries = _entries(1500)
    entries[0]["depends_on"] = ["n1499"]  # the first entry waits for the last one
    plan = write_yaml(tmp_path / "big.yaml", {"concurrency": 64, "plan": entries})
    script = write_yaml(tmp_path / "script.yaml", {"n0000": {"fail_once": "transient"}})
    args = ["flow", "--plan", plan, "--model", f"script:{script}", "--json"]
    result = run_cli(home, *args, "--max-plan-entries", "1500")
    assert result.returncode == 1, result.explain()
    out = result.json
    assert len(out["nodes"]) == 1500 and out["warnings"] == []
    statuses = node_status(out)
    assert statuses.pop("n0000") == "failed"
    assert set(statuses.values()) == {"completed"}
    order = [line["node"] for line in read_invocations(home)]
    assert len(order) == 1500
    assert order.index("n1499") < order.index("n0000")

    # Resume reads the plan from the checkpoint: the limit of the new command does not apply.
    resumed = run_cli(home, "resume", out["run_id"], "--retry-failed", "--json")
    assert resumed.returncode == 0, resumed.explain()
    assert len(resumed.json["nodes"]) == 1500
    assert set(node_status(resumed.json).values()) == {"completed"}


def test_planner_reply_over_the_limit_is_an_invalid_reply(home: Path) -> None:
    # The echo planner answers with 4 entries: over a limit of 3 on both attempts.
    result = run_cli(home, "flow", "plan something", "--max-plan-entries", "3", "--json")
    assert result.returncode == 1, result.explain()
    message = result.json.get("error", {}).get("message", "") + result.stderr
    assert "invalid plan twice" in message and "4 entries" in message


# -- 5. agent workers named by a file need consent ---------------------------------------------


def _fake_worker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A stand-in ``claude``/``codex`` that records being started (it must never be)."""
    marker = tmp_path / "worker-started"
    fake = tmp_path / "fake-agent"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    fake.chmod(0o755)
    env = child_env(STEERFLOW_CLAUDE_BIN=str(fake), STEERFLOW_CODEX_BIN=str(fake))
    return env, marker


def test_plan_naming_an_agent_worker_needs_consent(home: Path, tmp_path: Path) -> None:
    env, marker = _fake_worker(tmp_path)
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "model": "claude-code/x",
            "plan": [
                {"agent_id": "edit", "instruction": "change the code"},
                {"agent_id": "check", "instruction": "look", "depends_on": ["edit"]},
            ],
        },
    )
    refused = run_cli(home, "flow", "--plan", plan, "--json", env=env)
    assert refused.returncode == 2, refused.explain()
    message = refused.json["error"]["message"]
    assert "claude-code/x" in message and "edit" in message and "check" in message
    assert "--allow-agent-workers" in message
    assert not marker.exists() and _run_dirs(home) == []

    allowed = run_cli(home, "flow", "--plan", plan, "--allow-agent-workers", "--dry-run", env=env)
    assert allowed.returncode == 0, allowed.explain()
    same = run_cli(home, "flow", "--plan", plan, "--model", "claude-code/y", "--dry-run", env=env)
    assert same.returncode == 0, same.explain()
    assert not marker.exists()


def test_playbook_role_naming_an_agent_worker_needs_consent(home: Path, tmp_path: Path) -> None:
    env, marker = _fake_worker(tmp_path)
    (home / "playbooks").mkdir(parents=True)
    write_yaml(
        home / "playbooks" / "coding.yaml",
        {
            "roles": {"coder": {"model": "codex/gpt"}},
            "plan": [
                {"agent_id": "scope", "instruction": "read"},
                {"agent_id": "patch", "assignee": "coder", "instruction": "write"},
            ],
        },
    )
    refused = run_cli(home, "play", "coding", env=env)
    assert refused.returncode == 2, refused.explain()
    assert "codex/gpt" in refused.stderr and "patch" in refused.stderr
    assert "scope" not in refused.stderr.split("codex/gpt", 1)[1]  # scope runs echo
    # --model naming another worker is no consent for this one
    other = run_cli(home, "play", "coding", "--model", "claude-code/x", env=env)
    assert other.returncode == 2, other.explain()
    assert not marker.exists() and _run_dirs(home) == []
    dry = run_cli(home, "play", "coding", "--allow-agent-workers", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.explain()
    assert json.loads(dry.stdout)["status"] == "planned"


def test_a_synthesis_naming_an_agent_worker_needs_consent(home: Path, tmp_path: Path) -> None:
    env, marker = _fake_worker(tmp_path)
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "synthesis": {"instruction": "join", "model": "codex/gpt"},
            "plan": [{"agent_id": "scope", "instruction": "read"}],
        },
    )
    refused = run_cli(home, "flow", "--plan", plan, env=env)
    assert refused.returncode == 2, refused.explain()
    assert "codex/gpt" in refused.stderr and "the plan's synthesis" in refused.stderr
    assert "synthesis" in refused.stderr.split("codex/gpt", 1)[1]
    assert not marker.exists() and _run_dirs(home) == []
    dry = run_cli(home, "flow", "--plan", plan, "--allow-agent-workers", "--dry-run", "--json",
                  env=env)  # fmt: skip
    assert dry.returncode == 0, dry.explain()
    assert [n["id"] for n in json.loads(dry.stdout)["nodes"]] == ["scope", "synthesis"]
