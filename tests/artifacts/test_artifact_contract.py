"""Declaring artifacts: path rules, where a declaration comes from, the stored contract form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from steerflow.artifacts import (
    CONFIG_KEY,
    DECLARED_MEMBER,
    ArtifactContract,
    ContractError,
    checkpoint_contract,
    merge_declared,
)
from steerflow.errors import PlanValidationError
from steerflow.executor import build_graph
from steerflow.orchestrate._contract import resolve_contract
from steerflow.orchestrate._settings import RunSettings
from steerflow.plan import (
    SpawnSpec,
    artifact_path_problem,
    parse_plan,
    parse_reactive,
    plan_from_checkpoint,
    plan_to_checkpoint,
)

_DOTS = "must not have an empty or '.' component"
_UP = "must stay inside the leg directory (no '..' component)"
_LONG_PART = "has a component longer than 255 bytes"
BAD_PATHS = {
    "": "must be a non-empty relative path",
    "/etc/passwd": "must be relative to the leg directory, not absolute",
    "../outside": _UP,
    "a/../../b": _UP,
    "a/..": _UP,
    "a//b": _DOTS,
    "a/": _DOTS,
    "./a": _DOTS,
    "a/./b": _DOTS,
    "a\0b": "must not contain a NUL character",
    "x" * 256: _LONG_PART,
    "a/" + "é" * 128: _LONG_PART,
    "a/" * 511 + "bcd": "is longer than 1024 characters",
}
GOOD_PATHS = [
    "report.md",
    "out/report.md",
    "a/b/c.txt",
    ".hidden",
    "a..b",
    "...",
    "name with space.txt",
    "x" * 255,
    "é" * 127,
    "a/" * 511 + "bc",
]


@pytest.mark.parametrize(("path", "said"), BAD_PATHS.items())
def test_a_bad_artifact_path_has_a_problem(path: str, said: str) -> None:
    assert artifact_path_problem(path) == said


@pytest.mark.parametrize("path", GOOD_PATHS)
def test_a_relative_file_path_is_accepted(path: str) -> None:
    assert artifact_path_problem(path) is None


def test_a_non_string_path_has_a_problem() -> None:
    assert artifact_path_problem(3) and artifact_path_problem(None)


def _plan(**extra: Any) -> dict[str, Any]:
    return {
        "roles": extra.pop("roles", {}),
        "plan": [
            {"agent_id": "research", "instruction": "read"},
            {"agent_id": "draft", "instruction": "write", **extra},
        ],
    }


@pytest.mark.parametrize("path", ["/abs/file", "../up", "a//b"])
def test_a_plan_entry_with_a_bad_path_is_refused_naming_the_entry(path: str) -> None:
    with pytest.raises(PlanValidationError) as caught:
        parse_plan(_plan(artifacts=["ok.txt", path]), source="p.yaml")
    message = str(caught.value)
    assert "plan[1]" in message and "'draft'" in message and repr(path) in message
    assert caught.value.exit_code == 2


def test_a_role_with_a_bad_path_is_refused_naming_the_role() -> None:
    with pytest.raises(PlanValidationError, match=r"roles\.coder\.artifacts\[0\]"):
        parse_plan(_plan(roles={"coder": {"artifacts": ["../x"]}}), source="p.yaml")


def test_a_spawn_request_with_a_bad_path_is_not_a_valid_spawn() -> None:
    with pytest.raises(ValueError, match=r"artifacts\[1\]"):
        SpawnSpec.model_validate(
            {"agent_id": "fix-1", "instruction": "fix", "artifacts": ["ok", "/abs"]}
        )
    spec = SpawnSpec.model_validate({"agent_id": "fix-1", "instruction": "fix", "artifacts": ["a"]})
    assert spec.artifacts == ["a"]


def test_a_leg_declares_its_role_paths_then_its_own_each_once() -> None:
    plan = parse_plan(
        _plan(
            assignee="coder",
            artifacts=["notes.md", "patch.diff", "notes.md"],
            roles={"coder": {"artifacts": ["patch.diff", "log.txt"]}},
        ),
        source="p.yaml",
    )
    graph = build_graph(plan)
    assert graph.by_key["draft"].declared_artifacts == ("patch.diff", "log.txt", "notes.md")
    assert graph.by_key["research"].declared_artifacts == ()


def test_a_plan_entry_declaration_survives_the_checkpoint_plan_form() -> None:
    plan = parse_plan(_plan(artifacts=["out/a.md"]), source="p.yaml")
    stored = json.loads(json.dumps(plan_to_checkpoint(plan)))
    assert stored[1]["artifacts"] == ["out/a.md"] and "artifacts" not in stored[0]
    again = plan_from_checkpoint(stored, source="checkpoint")
    assert again.plan[1].artifacts == ["out/a.md"]


def test_merge_keeps_the_first_order_and_drops_repeats() -> None:
    assert merge_declared(["b", "a"], ["a", "c", "b"]) == ("b", "a", "c")
    assert merge_declared() == ()


def test_the_stored_form_sorts_legs_and_keeps_declared_order() -> None:
    contract = ArtifactContract(Path("/r")).with_leg("zeta", ["b", "a"]).with_leg("alpha", ["x"])
    contract = contract.with_leg("empty", [])
    stored = contract.to_json()
    assert stored == {"version": 1, "root": "/r", "legs": {"alpha": ["x"], "zeta": ["b", "a"]}}
    assert list(stored["legs"]) == ["alpha", "zeta"]
    assert json.dumps(stored) == json.dumps(contract.to_json())
    assert ArtifactContract.from_json(json.loads(json.dumps(stored))) == contract


def test_an_empty_contract_still_names_its_root() -> None:
    assert ArtifactContract(Path("/r")).to_json() == {"version": 1, "root": "/r", "legs": {}}


@pytest.mark.parametrize(
    "stored",
    [
        None,
        [],
        {"version": 1, "root": "/r"},
        {"version": 2, "root": "/r", "legs": {}},
        {"version": True, "root": "/r", "legs": {}},
        {"version": 1, "root": "relative", "legs": {}},
        {"version": 1, "root": "/r", "legs": []},
        {"version": 1, "root": "/r", "legs": {"../x": ["a"]}},
        {"version": 1, "root": "/r", "legs": {"a": []}},
        {"version": 1, "root": "/r", "legs": {"a": ["../b"]}},
        {"version": 1, "root": "/r", "legs": {"a": ["b", "b"]}},
        {"version": 1, "root": "/r", "legs": {"a": "b"}},
        {"version": 1, "root": "/r", "legs": {}, "extra": 1},
    ],
)
def test_anything_but_the_stored_form_is_refused(stored: object) -> None:
    with pytest.raises(ContractError):
        ArtifactContract.from_json(stored)


def test_the_checkpoint_contract_adds_the_spawned_declarations() -> None:
    config = {CONFIG_KEY: {"version": 1, "root": "/r", "legs": {"draft": ["p.diff"]}}}
    spawned = [
        {"node_id": "n1", "spawn_id": "fix-1", DECLARED_MEMBER: ["fix.diff"]},
        {"node_id": "n2", "spawn_id": "fix-2"},
    ]
    contract = checkpoint_contract(config, spawned)
    assert contract is not None
    assert dict(contract.legs) == {"draft": ("p.diff",), "fix-1": ("fix.diff",)}
    assert checkpoint_contract({}, spawned) is None
    with pytest.raises(ContractError):
        checkpoint_contract(config, [{"node_id": "n3", DECLARED_MEMBER: ["a"]}])
    with pytest.raises(ContractError):
        checkpoint_contract(config, [{"spawn_id": "s", DECLARED_MEMBER: ["/abs"]}])


def test_a_resumed_run_keeps_the_recorded_legs_not_todays_roles() -> None:
    plan = parse_plan(
        {
            "roles": {"coder": {"artifacts": ["today.txt"]}},
            "plan": [
                {"agent_id": "draft", "assignee": "coder", "instruction": "w"},
                {"agent_id": "other", "assignee": "coder", "instruction": "w"},
            ],
        },
        source="p.yaml",
    )
    settings = RunSettings(
        model="echo",
        reactive=parse_reactive("off"),
        max_ops=0,
        concurrency=1,
        save=None,
        playbook=None,
        kind="flow",
        roles={"coder": {"artifacts": ["today.txt"]}},
    )
    fresh = resolve_contract(build_graph(plan), settings, Path("/new"))
    assert dict(fresh.legs) == {"draft": ("today.txt",), "other": ("today.txt",)}

    recorded = ArtifactContract(Path("/old"), {"draft": ("then.txt",)})
    graph = build_graph(plan)
    resumed = resolve_contract(graph, settings, Path("/old"), recorded)
    assert resumed == recorded
    assert graph.by_key["draft"].declared_artifacts == ("then.txt",)
    assert graph.by_key["other"].declared_artifacts == ()

    # without the session's record, the copy in the source checkpoint's config counts
    copy = RunSettings.from_checkpoint_config(
        {**settings.to_checkpoint_config(), CONFIG_KEY: recorded.to_json()}
    )
    assert resolve_contract(build_graph(plan), copy, Path("/old")) == recorded
