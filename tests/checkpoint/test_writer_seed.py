"""Initial entries (``ops=`` / ``spawned=``): part of the first publication, never journaled.

A resumed run hands the writer everything it replays; the first snapshot (v2) or base
(v3) must already hold all of it, sealed exactly as a recorded entry would be.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow import _faults
from steerflow.checkpoint import CheckpointWriter, load_checkpoint, result_digest

OPS = {"research": {"status": "completed", "response": {"found": [1, 2.5, None]}}}
SPAWNED = [
    {
        "node_id": "n-done",
        "status": "completed",
        "response": "fixed",
        "operation": "fix it",
        "assignee": "coder",
        "instruction": "fix it",
        "parent_id": "p-research",
        "spawn_id": "fix",
        "context": None,
        "depends_on": ["research"],
        "emitter_workload": "team",
    },
    {"node_id": "n-later", "status": "pending", "response": None, "spawn_id": "later"},
]


def _load(run: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return load_checkpoint(run / "checkpoint.json")


async def _flush_and_close(writer: CheckpointWriter) -> None:
    await writer.flush()
    await writer.close()


@pytest.mark.parametrize("version", [2, 3])
def test_first_publication_holds_the_initial_entries(tmp_path: Path, version: int) -> None:
    writer = make_writer(tmp_path, version, ops=OPS, spawned=SPAWNED)
    seen: list[str] = []
    _faults.set_fault_hook(lambda step, when: seen.append(f"{when}:{step}"))

    async def go() -> None:
        await writer.flush()
        # Nothing but the flush was written: the entries rode in the initial publication.
        state, report = _load(tmp_path)
        assert state["ops"]["research"]["response"] == {"found": [1, 2.5, None]}
        assert [e["node_id"] for e in state["spawned"]] == ["n-done", "n-later"]
        if version == 3:
            assert (tmp_path / "checkpoint.json.journal").read_bytes() == b""
            assert report["records_applied"] == 0
        await writer.close()

    asyncio.run(go())
    assert "before:journal-lf" not in seen
    state, _ = _load(tmp_path)
    research = state["ops"]["research"]
    assert research["agent_id"] == "research"
    assert research["result_digest"] == result_digest(research["response"])
    done, later = state["spawned"]
    assert done["result_digest"] == result_digest("fixed")
    assert done["emitter_workload"] == "team" and done["depends_on"] == ["research"]
    # Missing spawned members are filled as record_spawned fills them.
    assert later["operation"] is None and later["parent_id"] is None
    assert later["response"] is None and later["result_digest"] == result_digest(None)


@pytest.mark.parametrize("version", [2, 3])
def test_records_after_the_seed_upsert_it(tmp_path: Path, version: int) -> None:
    writer = make_writer(tmp_path, version, ops=OPS, spawned=SPAWNED)

    async def go() -> None:
        await writer.flush()
        await writer.record_spawned(
            "n-later", status="completed", response="done later", spawn_id="later"
        )
        await writer.record("draft", status="completed", response="D", flow_context={"k": 1})
        await writer.close()

    asyncio.run(go())
    state, _ = _load(tmp_path)
    assert set(state["ops"]) == {"research", "draft"}
    assert [(e["node_id"], e["status"]) for e in state["spawned"]] == [
        ("n-done", "completed"),
        ("n-later", "completed"),
    ]
    assert state["flow_context"] == {"k": 1}


def test_compaction_and_reconcile_keep_the_seed(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, 3, ops=OPS, spawned=SPAWNED, max_records=1)

    async def go() -> None:
        await writer.flush()
        for i in range(3):  # every record after the first compacts
            await writer.record("draft", status="completed", response=f"D{i}")
        await writer.close()

    asyncio.run(go())
    state, _ = _load(tmp_path)
    assert set(state["ops"]) == {"research", "draft"}
    assert len(state["spawned"]) == 2


def test_a_given_matching_digest_is_accepted(tmp_path: Path) -> None:
    ops = {
        "research": {"status": "completed", "response": "R", "result_digest": result_digest("R")}
    }
    asyncio.run(_flush_and_close(make_writer(tmp_path, 3, ops=ops)))
    assert _load(tmp_path)[0]["ops"]["research"]["result_digest"] == result_digest("R")


@pytest.mark.parametrize(
    ("ops", "spawned", "needle"),
    [
        ({"a": {"status": "completed", "response": "R", "result_digest": "blake2b:00"}}, None,
         "result_digest"),
        ({"a": {"agent_id": "b", "status": "completed", "response": "R"}}, None, "agent_id"),
        ({"a": {"status": "pending", "response": None}}, None, "status"),
        ({"a": {"status": "completed"}}, None, "response"),
        (None, [{"status": "completed", "response": "R"}], "node_id"),
        (None, [{"node_id": "x", "status": "pending", "response": "R"}], "pending"),
        (None, [{"node_id": "x", "status": "done", "response": "R"}], "status"),
        (None, [{"node_id": "x", "status": "completed", "response": 1},
                {"node_id": "x", "status": "completed", "response": 2}], "repeats"),
        (None, [{"node_id": "x", "status": "completed", "response": float("nan")}], "non-finite"),
    ],
)  # fmt: skip
def test_bad_initial_entries_are_refused_before_anything_is_written(
    tmp_path: Path, ops: Any, spawned: Any, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        make_writer(tmp_path, 3, ops=ops, spawned=spawned)
    assert list(tmp_path.iterdir()) == []


def test_no_seed_keeps_the_empty_first_publication(tmp_path: Path) -> None:
    asyncio.run(_flush_and_close(make_writer(tmp_path, 2)))
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["ops"] == {} and doc["spawned"] == []
