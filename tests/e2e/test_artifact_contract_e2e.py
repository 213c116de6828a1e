"""Declared artifacts through a whole run: the contract on record before anything runs,
spawned legs added before they start, the live check, and the entries' ``artifacts``."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster
from flow_support import child_env, read_invocations, run_cli, write_yaml

from steerflow import load_checkpoint
from steerflow.executor import EventBus, FlowEvent
from steerflow.orchestrate import FlowOptions, run_flow

pytestmark = pytest.mark.timeout(120)


def _contracts(home: Path) -> list[Any]:
    with sqlite3.connect(home / "state.db") as db:
        rows = db.execute("SELECT artifact_contract_json FROM sessions").fetchall()
    return [None if text is None else json.loads(text) for (text,) in rows]


def _digest(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=32).hexdigest()


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    script = write_yaml(
        tmp_path / "script.yaml",
        {
            "draft": {
                "artifacts": {"out/report.md": "report", "patch.diff": "diff"},
                "spawn": [
                    {
                        "agent_id": "fix-1",
                        "assignee": "coder",
                        "instruction": "fix",
                        "artifacts": ["fix.txt"],
                    }
                ],
            },
            "fix-1": {"artifacts": {"fix.txt": "fixed", "patch.diff": "d2"}},
        },
    )
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "model": f"script:{script}",
            "reactive": "all",
            "roles": {"coder": {"artifacts": ["patch.diff"]}},
            "plan": [
                {"agent_id": "research", "instruction": "read"},
                {
                    "agent_id": "draft",
                    "assignee": "coder",
                    "instruction": "write",
                    "artifacts": ["out/report.md"],
                    "depends_on": ["research"],
                },
            ],
        },
    )
    return script, plan


async def test_the_contract_is_on_record_before_each_leg_starts(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    home = tmp_path / "home"
    _, plan = _setup(tmp_path)
    seen: dict[str, Any] = {}

    def on_event(event: FlowEvent) -> None:
        if event.type == "node_started" and event.node_key:
            # what another process would read from the state DB at this very moment
            blockbuster.deactivate()
            try:
                seen[event.node_key] = _contracts(home)[-1]
            finally:
                blockbuster.activate()

    events = EventBus()
    events.subscribe(on_event)
    result = await run_flow(FlowOptions(plan_path=plan), home=home, events=events)
    assert result.status == "completed", result.warnings
    root = str(Path(result.run_dir or "") / "artifacts")
    planned = {"draft": ["patch.diff", "out/report.md"]}
    assert seen["research"] == {"version": 1, "root": root, "legs": planned}
    assert seen["draft"]["legs"] == planned
    # the spawned leg is on record, under its spawn id, before it starts
    whole = {**planned, "fix-1": ["patch.diff", "fix.txt"]}
    assert seen["fix-1"] == {"version": 1, "root": root, "legs": whole}
    assert _contracts(home) == [seen["fix-1"]]

    state, _ = load_checkpoint(result.run_dir or "")
    # the checkpoint's copy: planned legs in config, the spawned leg in its entry
    assert state["config"]["artifact_contract"] == seen["research"]
    (fix,) = state["spawned"]
    assert (fix["spawn_id"], fix["declared_artifacts"]) == ("fix-1", ["patch.diff", "fix.txt"])
    assert fix["artifacts"] == [
        {"path": "fix.txt", "bytes": 5, "digest": _digest(b"fixed")},
        {"path": "patch.diff", "bytes": 2, "digest": _digest(b"d2")},
    ]
    assert state["ops"]["draft"]["artifacts"] == [
        {"path": "out/report.md", "bytes": 6, "digest": _digest(b"report")},
        {"path": "patch.diff", "bytes": 4, "digest": _digest(b"diff")},
    ]
    assert "artifacts" not in state["ops"]["research"]


def test_a_run_killed_after_the_contract_has_it_on_record_and_ran_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _, plan = _setup(tmp_path)
    killed = run_cli(
        home,
        "flow",
        "--plan",
        plan,
        "--json",
        env=child_env(STEERFLOW_FAULT="exit:after:artifact-contract"),
    )
    assert killed.returncode == 137, killed.explain()
    (contract,) = _contracts(home)
    assert contract["legs"] == {"draft": ["patch.diff", "out/report.md"]}
    assert read_invocations(home) == []


def test_a_run_that_declares_nothing_still_records_an_empty_contract(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "p.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    result = run_cli(home, "flow", "--plan", plan, "--json")
    assert result.returncode == 0, result.explain()
    (contract,) = _contracts(home)
    root = str(Path(result.json["run_dir"]) / "artifacts")
    assert contract == {"version": 1, "root": root, "legs": {}}


def test_a_save_dir_is_the_contract_root(tmp_path: Path) -> None:
    home, saved = tmp_path / "home", tmp_path / "saved"
    _, plan = _setup(tmp_path)
    result = run_cli(home, "flow", "--plan", plan, "--save", saved, "--json")
    assert result.returncode == 0, result.explain()
    (contract,) = _contracts(home)
    assert contract["root"] == str(saved.absolute())
    assert (saved / "fix-1" / "fix.txt").read_text() == "fixed"


def test_a_missing_artifact_fails_its_node_and_the_flow(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {"a": {"artifacts": {"other.txt": "x"}}})
    plan = write_yaml(
        tmp_path / "p.yaml",
        {
            "model": f"script:{script}",
            "plan": [
                {"agent_id": "a", "instruction": "x", "artifacts": ["want.txt"]},
                {"agent_id": "b", "instruction": "y", "depends_on": ["a"]},
            ],
        },
    )
    result = run_cli(home, "flow", "--plan", plan, "--json")
    assert result.returncode == 1, result.explain()
    nodes = {n["id"]: n for n in result.json["nodes"]}
    assert nodes["a"]["status"] == "failed" and "want.txt (missing)" in nodes["a"]["error"]
    assert nodes["b"]["status"] == "skipped"


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ({"plan_artifacts": ["../escape"]}, "plan[0] ('a').artifacts[0]"),
        ({"plan_artifacts": ["/etc/passwd"]}, "plan[0] ('a').artifacts[0]"),
        ({"plan_artifacts": ["ok", "a//b"]}, "plan[0] ('a').artifacts[1]"),
        ({"role_artifacts": ["x/../y"]}, "roles.coder.artifacts[0]"),
    ],
)
def test_a_bad_declared_path_is_a_usage_error_naming_the_entry(
    tmp_path: Path, where: dict[str, list[str]], named: str
) -> None:
    entry: dict[str, Any] = {"agent_id": "a", "assignee": "coder", "instruction": "x"}
    if "plan_artifacts" in where:
        entry["artifacts"] = where["plan_artifacts"]
    plan = write_yaml(
        tmp_path / "p.yaml",
        {"roles": {"coder": {"artifacts": where.get("role_artifacts", [])}}, "plan": [entry]},
    )
    result = run_cli(tmp_path / "home", "flow", "--plan", plan)
    assert result.returncode == 2, result.explain()
    assert named in result.stderr, result.explain()
