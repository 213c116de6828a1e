"""The witness refusal names the child that is missing, by its spawn id (issue 38 item 7).

In process, over hand-made version 2 checkpoints (the end-to-end cases, on real runs,
are in ``tests/e2e/test_spawn_witness.py``): an emitter ``a`` lists its child ``s1`` in
``spawned_ids``; the child's entry is gone, or exists but names another parent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from steerflow.checkpoint import entry_digest, load_state, result_digest
from steerflow.errors import FlowResumeError
from steerflow.resume import plan_replay

A, B, CHILD = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex


def _spawn(node_id: str, spawn_id: str, parent: str, depends_on: str) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "status": "pending",
        "response": None,
        "operation": f"work {spawn_id}",
        "assignee": "coder",
        "instruction": f"work {spawn_id}",
        "parent_id": parent,
        "spawn_id": spawn_id,
        "context": None,
        "depends_on": [depends_on],
    }


def _planned(agent_id: str, node_id: str, deps: list[int]) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "dep_indices": deps,
        "assignee": None,
        "instruction": agent_id,
        "node_id": node_id,
    }


def _refusal(tmp_path: Path, spawned: list[dict[str, Any]], spawn_id_of: Any = None) -> str:
    """``a`` completed (witnessing CHILD), ``b`` not recorded; the resume's refusal."""
    emitter = {"agent_id": "a", "status": "completed", "response": "A"}
    emitter["spawned_ids"] = [CHILD]
    emitter["result_digest"] = entry_digest(emitter)
    assert emitter["result_digest"] != result_digest("A")  # the witness is covered
    doc = {
        "version": 2,
        "session_id": uuid.uuid4().hex,
        "prompt": "",
        "plan": [_planned("a", A, []), _planned("b", B, [0])],
        "flow_context": {},
        "ops": {"a": emitter},
        "spawned": spawned,
        "config": {"model_spec": "echo", "reactive_spec": "all", "kind": "flow"},
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint.json").write_text(json.dumps(doc))
    state, _ = load_state(run_dir / "checkpoint.json", v2_lenient=True)
    with pytest.raises(FlowResumeError) as refused:
        plan_replay(state, run_dir, spawn_id_of=spawn_id_of)
    return str(refused.value)


def test_a_lost_child_is_named_by_the_spawn_id_its_run_published(tmp_path: Path) -> None:
    asked: list[str] = []

    def published(node_id: str) -> str | None:
        asked.append(node_id)
        return "s1"

    message = _refusal(tmp_path, [], published)
    assert message.startswith(f"spawned node 's1' (node_id {CHILD!r}) has no entry"), message
    assert "node 'a' lists it among its spawns" in message
    assert asked == [CHILD]


def test_a_lost_child_whose_spawn_id_is_unknown_says_so(tmp_path: Path) -> None:
    message = _refusal(tmp_path, [], lambda _node_id: None)
    assert message.startswith(f"a spawned node of unknown spawn_id (node_id {CHILD!r})")
    assert "node 'a'" in message
    assert _refusal(tmp_path / "again", []) == message  # no lookup at all: the same


def test_a_child_whose_parent_was_changed_to_an_unrecorded_node(tmp_path: Path) -> None:
    message = _refusal(tmp_path, [_spawn(CHILD, "s1", B, "a")], lambda _node_id: "never")
    assert message.startswith(
        f"spawned node 's1' (node_id {CHILD!r}): its entry exists but names parent "
        f"{B!r} (node 'b'), whose outcome is not recorded"
    ), message
    assert "node 'a' lists it among its spawns" in message and "no entry" not in message


def test_a_child_whose_parent_was_changed_to_a_dropped_spawn(tmp_path: Path) -> None:
    """The forged parent is another pending child, itself dropped under ``b``."""
    other = uuid.uuid4().hex
    spawned = [_spawn(other, "s2", B, "b"), _spawn(CHILD, "s1", other, "s2")]
    message = _refusal(tmp_path, spawned)
    assert message.startswith(
        f"spawned node 's1' (node_id {CHILD!r}): its entry exists but names parent "
        f"{other!r} (spawned node 's2')"
    ), message
