"""Splice witnesses in checkpoints (Amendment 3 items 3-5): guarded, never lost.

An escalation retry's entry carries ``escalated_from`` (its logical operation) and
``parent_id`` (the attempt it replaces); they mean something only next to the planned
node ids (``plan[].node_id``).  The version 2 writer never publishes one without them
and the readers refuse one without them; every publication of a run with escalations,
through compaction and a version 2 -> 3 resume, keeps every witness.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import load_checkpoint, load_state
from steerflow.checkpoint._entries import EntryError, check_entry
from steerflow.errors import CheckpointRecoveryError, PersistenceError
from steerflow.executor import EventBus, FlowEvent
from steerflow.orchestrate import FlowOptions, prepare_resume, run_flow

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def blockbuster() -> None:
    """Off here: the inspector reads each publication synchronously, on the loop, at its
    acknowledgement, so that no later publication can replace it before it is read."""


RETRY = {
    "operation": "draft it",
    "instruction": "draft it",
    "assignee": "coder",
    "spawn_id": "draft.esc1",
    "escalated_from": "d" * 32,
    "parent_id": "d" * 32,
    "model": "echo",
}


def unguarded_v2(run_dir: Path) -> Path:
    """A v2 snapshot whose plan has no node ids but whose spawned entry has a splice."""
    run_dir.mkdir()
    doc = {
        "version": 2,
        "session_id": "0" * 32,
        "prompt": "p",
        "plan": [{"agent_id": "draft", "dep_indices": [], "assignee": "coder"}],
        "flow_context": {},
        "ops": {"draft": {"agent_id": "draft", "status": "failed", "response": {"error": "x"}}},
        "spawned": [{"node_id": "e" * 32, "status": "pending", "response": None, **RETRY}],
        "config": {},
    }
    path = run_dir / "checkpoint.json"
    path.write_text(json.dumps(doc))
    return path


def test_v2_reader_refuses_an_unguarded_splice(tmp_path: Path) -> None:
    path = unguarded_v2(tmp_path / "run")
    for load in (load_checkpoint, lambda p: load_state(p, v2_lenient=True)):
        with pytest.raises(CheckpointRecoveryError) as caught:
            load(path)
        refusal = caught.value.report["refusal"]
        assert refusal["reason"] == "unguarded-splice"
        assert refusal["entry"] == {"kind": "spawn", "node_id": "e" * 32, "spawn_id": "draft.esc1"}
        assert "draft.esc1" in str(caught.value)


def test_the_same_splice_next_to_planned_node_ids_loads(tmp_path: Path) -> None:
    path = unguarded_v2(tmp_path / "run")
    doc = json.loads(path.read_text())
    doc["plan"][0]["node_id"] = "d" * 32
    path.write_text(json.dumps(doc))
    state, report = load_state(path)
    assert report["status"] == "clean"
    assert (state.spawned[0].escalated_from, state.spawned[0].model) == ("d" * 32, "echo")


def test_an_ordinary_spawn_needs_no_planned_node_ids(tmp_path: Path) -> None:
    path = unguarded_v2(tmp_path / "run")
    doc = json.loads(path.read_text())
    del doc["spawned"][0]["escalated_from"]
    path.write_text(json.dumps(doc))
    load_state(path)


async def test_v2_writer_never_publishes_an_unguarded_splice(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    writer = make_writer(run, 2)  # ckpt_support's plan has no node ids
    await writer.flush()
    with pytest.raises(PersistenceError, match="plan's node ids"):
        await writer.record_spawned("e" * 32, status="pending", response=None, **RETRY)
    ordinary = {k: v for k, v in RETRY.items() if k not in ("escalated_from", "model")}
    await writer.record_spawned("f" * 32, status="pending", response=None, **ordinary)
    await writer.close()
    state, _ = load_checkpoint(run)
    assert [e["node_id"] for e in state["spawned"]] == ["f" * 32]
    seeded = [{"node_id": "e" * 32, "status": "pending", "response": None, **RETRY}]
    with pytest.raises(ValueError, match="plan's node ids"):
        make_writer(tmp_path / "seeded", 2, spawned=seeded)


async def test_v3_reader_refuses_an_unguarded_splice_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    writer = make_writer(run, 3)
    await writer.flush()
    await writer.record_spawned("e" * 32, status="pending", response=None, **RETRY)
    await writer.close()
    with pytest.raises(CheckpointRecoveryError) as caught:
        load_state(run)
    assert caught.value.report["refusal"]["reason"] == "unguarded-splice"


# -- every publication of an escalating run -------------------------------------------------

ESC = re.compile(r"\.esc[0-9]+\Z")


class Inspector:
    """Reads the checkpoint back at every ``checkpoint saved`` and checks its witnesses."""

    def __init__(self, run_parent: Path) -> None:
        self.run_parent = run_parent
        self.seen: dict[str, dict[str, Any]] = {}  # retry spawn id -> its first witness
        self.publications = 0
        self.problems: list[str] = []

    def __call__(self, event: FlowEvent) -> None:
        if event.type != "checkpoint_saved":
            return
        runs = sorted(p for p in self.run_parent.iterdir() if (p / "checkpoint.json").is_file())
        self.check(runs[-1])

    def check(self, run_dir: Path) -> None:
        self.publications += 1
        # The base or snapshot alone (what a base-only reader sees) must be guarded.
        alone = json.loads((run_dir / "checkpoint.json").read_text())
        if any(e.get("escalated_from") for e in alone["spawned"]) and not all(
            isinstance(p.get("node_id"), str) for p in alone["plan"]
        ):
            self.problems.append(f"publication {self.publications}: unguarded base")
        state, _ = load_checkpoint(run_dir)  # refuses an unguarded splice itself
        ids = {p["node_id"]: p["agent_id"] for p in state["plan"]}
        ids |= {e["node_id"]: e["spawn_id"] for e in state["spawned"]}
        present = {e["spawn_id"]: e for e in state["spawned"]}
        for key in self.seen:
            if key not in present or not present[key].get("escalated_from"):
                self.problems.append(f"publication {self.publications}: lost {key}")
        for key, entry in present.items():
            if not ESC.search(key):
                continue
            witness = (ids.get(entry.get("escalated_from")), ids.get(entry.get("parent_id")))
            if None in witness or not entry.get("model"):
                self.problems.append(f"publication {self.publications}: {key} -> {witness}")
            first = self.seen.setdefault(key, {"witness": witness, "model": entry.get("model")})
            if first != {"witness": witness, "model": entry.get("model")}:
                self.problems.append(f"publication {self.publications}: {key} changed")


def files(tmp_path: Path) -> tuple[Path, list[Path]]:
    scripts = [tmp_path / f"m{i}.yaml" for i in range(4)]
    behaviour = [
        {"a": {"fail": "x"}, "c": {"fail": "x"}},
        {"a.esc1": {"fail": "x"}},
        {"a.esc2": {"fail": "x"}},  # a.esc3 answers; c.esc1..3 fail once each way
        {"c.esc3": {"fail": "x"}},
    ]
    behaviour[1]["c.esc1"] = {"fail": "x"}
    behaviour[2]["c.esc2"] = {"fail": "x"}
    for script, data in zip(scripts, behaviour, strict=True):
        script.write_text(yaml.safe_dump(data))
    roles = {
        "worker": {
            "model": f"script:{scripts[0]}",
            "escalation": [f"script:{s}" for s in scripts[1:]],
        }
    }
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "roles": roles,
                "plan": [
                    {"agent_id": "a", "assignee": "worker", "instruction": "a"},
                    {"agent_id": "b", "instruction": "b", "depends_on": ["a"]},
                    {"agent_id": "c", "assignee": "worker", "instruction": "c"},
                    {"agent_id": "d", "instruction": "d", "depends_on": ["c", "b"]},
                ],
            }
        )
    )
    return plan, scripts


@pytest.mark.parametrize("version", [2, 3])
async def test_every_publication_keeps_every_splice_guarded(tmp_path: Path, version: int) -> None:
    plan, scripts = files(tmp_path)
    home = tmp_path / "home"
    runs = home / "runs"
    events = EventBus()
    inspector = Inspector(runs)
    events.subscribe(inspector)
    compaction = {"compact_records": 2} if version == 3 else {}
    first = await run_flow(
        FlowOptions(plan_path=plan, checkpoint_version=version, **compaction),
        home=home,
        events=events,
    )
    # c's ladder is exhausted: the run fails, and c.esc3 is a failed retry
    assert first.status == "failed", first.to_json()
    assert {n["id"]: n["status"] for n in first.nodes}["c.esc3"] == "failed"
    assert inspector.publications >= 8 and inspector.problems == []
    assert set(inspector.seen) == {"a.esc1", "a.esc2", "a.esc3", "c.esc1", "c.esc2", "c.esc3"}

    # the legacy (v2) or v3 source resumed into version 3 with compactions, retrying c.esc3
    scripts[3].write_text(yaml.safe_dump({}))
    seed = prepare_resume(home, first.run_id or "", retry_failed=True)
    resumed_events = EventBus()
    again = Inspector(runs)
    again.seen = dict(inspector.seen)
    resumed_events.subscribe(again)
    second = await run_flow(
        FlowOptions(resume=seed, checkpoint_version=3, compact_records=2),
        home=home,
        events=resumed_events,
    )
    assert second.status == "completed", second.to_json()
    assert again.publications >= 2
    # Witnesses are remapped to the new planned ids, so compare by key.
    assert again.problems == []
    state, _ = load_checkpoint(Path(second.run_dir or ""))
    by_key = {e["spawn_id"]: e for e in state["spawned"]}
    assert by_key["c.esc3"]["status"] == "completed"
    assert by_key["c.esc3"]["model"] == f"script:{scripts[3]}"


@pytest.mark.parametrize("member", ["escalated_from", "model"])
def test_the_splice_members_are_text_or_null(member: str) -> None:
    entry = {"node_id": "e" * 32, "status": "pending", "response": None, **RETRY}
    check_entry("spawn", {**entry, member: None})
    with pytest.raises(EntryError, match=f"{member} is not a string or null"):
        check_entry("spawn", {**entry, member: 5})
