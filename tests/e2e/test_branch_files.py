"""Branch files only where a resume can restore from them (issue 17, decision 64).

A node's conversation is persisted (``branches/<key>.json``) only if some node starts
from it: an ``inherit_context`` entry's first dependency, a spawned node's emitter, or a
spawned node's first dependency.  Each test runs the real CLI and then resumes, so the
rule is checked against what a resume actually needs: no degraded context, and the
conversation restored where it is inherited.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flow_support import node_status, write_yaml
from resume_support import resume, run_plan, single_run, write_script


def _branches(run_dir: Path) -> set[str]:
    folder = run_dir / "branches"
    if not folder.is_dir():
        return set()
    return {p.name.removesuffix(".json") for p in folder.iterdir() if p.suffix == ".json"}


def _messages(run_dir: Path, key: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads((run_dir / "branches" / f"{key}.json").read_text())
    return loaded


def _plan(path: Path, entries: list[dict[str, Any]]) -> Path:
    return write_yaml(path, {"name": "branches", "plan": entries})


def _resumed(home: Path, run_id: str, *flags: str) -> tuple[dict[str, Any], Path]:
    result = resume(home, run_id, *flags, "--json")
    assert result.returncode == 0, result.explain()
    body = result.json
    assert body["status"] == "completed", result.explain()
    assert body["degraded_context"] == []
    return body, Path(body["run_dir"])


def test_independent_nodes_write_no_branch_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    entries = [{"agent_id": f"n{i}", "instruction": f"step {i}"} for i in range(12)]
    entries.append({"agent_id": "join", "instruction": "join", "depends_on": ["n0", "n1"]})
    result = run_plan(home, _plan(tmp_path / "plan.yaml", entries), write_script(
        tmp_path / "script.yaml", {}
    ))  # fmt: skip
    assert result.returncode == 0, result.explain()
    assert set(node_status(result.json).values()) == {"completed"}
    assert _branches(single_run(home)) == set()


def test_inherited_chain_keeps_only_sources_and_resumes_with_the_conversation(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    entries = [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "x", "instruction": "step x"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"], "inherit_context": True},
        {"agent_id": "c", "instruction": "step c", "depends_on": ["b"], "inherit_context": True},
        {"agent_id": "d", "instruction": "step d", "depends_on": ["a"]},
    ]
    script = write_script(tmp_path / "script.yaml", {"b": {"fail_once": "transient"}})
    source = run_plan(home, _plan(tmp_path / "plan.yaml", entries), script)
    assert source.returncode == 1, source.explain()
    run_dir = single_run(home)
    assert _branches(run_dir) == {"a"}  # b failed; x and d are nobody's context
    a_turns = _messages(run_dir, "a")

    _, resumed = _resumed(home, source.json["run_id"], "--retry-failed")
    # a is replayed and still a source (a later resume of this run may need it); b ran
    # and is c's context; c is nobody's.
    assert _branches(resumed) == {"a", "b"}
    assert _messages(resumed, "a") == a_turns
    b_turns = _messages(resumed, "b")
    assert b_turns[: len(a_turns)] == a_turns  # b started from a's restored conversation
    assert [m["role"] for m in b_turns[len(a_turns) :]] == ["user", "assistant"]
    assert b_turns[len(a_turns)]["content"].startswith("step b")


def test_emitter_branch_is_saved_and_a_resume_rebuilds_the_child_with_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    entries = [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
    ]
    script = write_script(
        tmp_path / "script.yaml",
        {
            "a": {"spawn": [{"agent_id": "s1", "instruction": "fix it"}]},
            # s1 fails once; when it runs again it spawns, so its own branch (which
            # starts from the one it was rebuilt with) is persisted where we can read it.
            "s1": {"fail_once": "transient", "spawn": [{"agent_id": "s2", "instruction": "go"}]},
        },
    )
    source = run_plan(home, _plan(tmp_path / "plan.yaml", entries), script, "--reactive", "all")
    assert source.returncode == 1, source.explain()
    assert node_status(source.json) == {"a": "completed", "b": "completed", "s1": "failed"}
    run_dir = single_run(home)
    assert _branches(run_dir) == {"a"}
    a_turns = _messages(run_dir, "a")

    body, resumed = _resumed(home, source.json["run_id"], "--retry-failed")
    assert node_status(body)["s2"] == "completed"
    assert _branches(resumed) == {"a", "s1"}
    s1_turns = _messages(resumed, "s1")
    assert s1_turns[: len(a_turns)] == a_turns  # the rebuilt child cloned a's branch
    assert s1_turns[len(a_turns)]["content"].startswith("fix it")


def test_spawned_nodes_first_dependency_is_saved_even_when_recorded_earlier(
    tmp_path: Path,
) -> None:
    """A child not linked to its emitter names an already finished node first.

    The resume's degraded-context check looks at that node's branch, so it must be on
    disk although nothing needed it when its outcome was recorded.
    """
    home = tmp_path / "home"
    entries = [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b"},
    ]
    script = write_script(
        tmp_path / "script.yaml",
        {
            # a waits, so b is normally recorded (without a branch) before a spawns.
            "a": {
                "delay": 0.3,
                "spawn": [
                    {
                        "agent_id": "s1",
                        "instruction": "fix it",
                        "depends_on": ["b"],
                        "link_to_emitter": False,
                    }
                ],
            },
            "s1": {"fail_once": "transient"},
        },
    )
    source = run_plan(home, _plan(tmp_path / "plan.yaml", entries), script, "--reactive", "all")
    assert source.returncode == 1, source.explain()
    assert node_status(source.json) == {"a": "completed", "b": "completed", "s1": "failed"}
    run_dir = single_run(home)
    assert _branches(run_dir) == {"a", "b"}

    body, _ = _resumed(home, source.json["run_id"], "--retry-failed")
    assert node_status(body)["s1"] == "completed"
