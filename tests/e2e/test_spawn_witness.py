"""Emitters witness their spawns (issue 10 item 3): ``spawned_ids`` and the resume rule.

A completed emitter's entry lists the node ids of the spawns it had accepted.  When a
listed child has no entry of its own (a hand-deleted spawned entry or pending intent),
``steerflow resume`` refuses with exit 3 naming the missing child by its spawn id (the
run published it in the state DB; issue 38 item 7: it was named by its emitter and
internal node id) and its emitter, instead of finishing the flow without ever running
the child.  A child whose entry exists but names another parent (a forged
``parent_id``) is refused for that, not reported as missing.  Every refusal here also
proves that the source files are unchanged and that nothing was invoked.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from flow_support import finish, node_status, read_invocations, start_cli, stop, write_yaml
from resume_support import (
    Crafted,
    SourceGuard,
    invocation_counts,
    resume,
    run_dirs,
    run_plan,
    single_run,
    wait_checkpoint,
    wait_for,
    write_script,
)

from steerflow.checkpoint import entry_digest, load_checkpoint

CHECKPOINT = "checkpoint.json"
JOURNAL = "checkpoint.json.journal"

SPAWNING_A = {
    "response": "A",
    "spawn": [{"agent_id": "s1", "assignee": "coder", "instruction": "fix it"}],
}


def _plan(path: Path) -> Path:
    return write_yaml(
        path,
        {
            "name": "witness",
            "plan": [
                {"agent_id": "a", "instruction": "step a"},
                {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
            ],
        },
    )


def _completed_spawning_run(tmp_path: Path, version: str) -> tuple[Path, Path]:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"a": SPAWNING_A, "s1": {"response": "S1"}})
    result = run_plan(
        home, _plan(tmp_path / "plan.yaml"), script, "--reactive", "all",
        "--checkpoint-version", version,
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    assert node_status(result.json) == {"a": "completed", "b": "completed", "s1": "completed"}
    return home, single_run(home)


def _child_node_id(run_dir: Path, spawn_id: str = "s1") -> str:
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    ids = [e["node_id"] for e in state["spawned"] if e.get("spawn_id") == spawn_id]
    assert len(ids) == 1, state["spawned"]
    return str(ids[0])


def _delete_from_v2(run_dir: Path, node_id: str) -> None:
    path = run_dir / CHECKPOINT
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    doc["spawned"] = [e for e in doc["spawned"] if e["node_id"] != node_id]
    path.write_text(json.dumps(doc))


def _delete_from_journal(run_dir: Path, node_id: str) -> None:
    """Drop the child's journal lines and renumber the rest, so the journal stays valid."""
    journal = run_dir / JOURNAL
    records = [json.loads(line) for line in journal.read_bytes().splitlines()]
    assert any(r["kind"] == "spawn" and r["entry"]["node_id"] == node_id for r in records)
    kept = [r for r in records if not (r["kind"] == "spawn" and r["entry"]["node_id"] == node_id)]
    for seq, record in enumerate(kept, start=1):
        record["seq"] = seq
    journal.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in kept))


def _compact_into_base(run_dir: Path) -> None:
    """Publish the folded unit as a new base with an empty journal, as a compaction does."""
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    base = {"version": 3, "generation": uuid.uuid4().hex, "journal_seq": 0}
    base.update({k: v for k, v in state.items() if k not in ("version", "generation")})
    (run_dir / CHECKPOINT).write_text(json.dumps(base))
    (run_dir / JOURNAL).write_bytes(b"")


def _delete_from_base(run_dir: Path, node_id: str) -> None:
    path = run_dir / CHECKPOINT
    doc = json.loads(path.read_text())
    assert doc["version"] == 3 and (run_dir / JOURNAL).read_bytes() == b""
    doc["spawned"] = [e for e in doc["spawned"] if e["node_id"] != node_id]
    path.write_text(json.dumps(doc))


def _refused_naming(home: Path, run_dir: Path, *fragments: str) -> dict[str, Any]:
    guard = SourceGuard.of(run_dir)
    before_runs, before_calls = run_dirs(home), len(read_invocations(home))
    result = resume(home, run_dir.name, "--json")
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["status"] == "refused" and body["error"]["code"] == "resume-refused", body
    assert body["run_id"] == run_dir.name  # the refusal names its source run
    for fragment in fragments:
        assert fragment in body["error"]["message"], (fragment, body["error"]["message"])
    guard.assert_unchanged()
    assert run_dirs(home) == before_runs, "a refused resume created a run directory"
    assert len(read_invocations(home)) == before_calls, "a refused resume invoked a node"
    return dict(body)


# == the writer side: the emitter's entry lists its accepted children ========================


@pytest.mark.parametrize("version", ["3", "2"])
def test_emitter_entry_lists_its_spawned_children(tmp_path: Path, version: str) -> None:
    _, run_dir = _completed_spawning_run(tmp_path, version)
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    child = _child_node_id(run_dir)
    emitter = state["ops"]["a"]
    assert emitter["spawned_ids"] == [child]
    assert emitter["result_digest"] == entry_digest(emitter)
    # Entries of operations that spawned nothing carry no member (today's shape).
    assert "spawned_ids" not in state["ops"]["b"]
    assert all("spawned_ids" not in e for e in state["spawned"])


# == the resume rule ============================================================================


@pytest.mark.parametrize(("version", "where"), [("2", "snapshot"), ("3", "journal"), ("3", "base")])
def test_deleted_spawned_leaf_is_refused(tmp_path: Path, version: str, where: str) -> None:
    home, run_dir = _completed_spawning_run(tmp_path, version)
    child = _child_node_id(run_dir)
    if where == "snapshot":
        _delete_from_v2(run_dir, child)
    elif where == "journal":
        _delete_from_journal(run_dir, child)
    else:
        _compact_into_base(run_dir)
        _delete_from_base(run_dir, child)
    state, report = load_checkpoint(run_dir / CHECKPOINT)
    assert report["status"] == "clean" and state["spawned"] == []
    body = _refused_naming(home, run_dir, "spawned node 's1'", "node 'a'", child)
    assert body["error"]["message"].startswith("spawned node 's1'")


@pytest.mark.parametrize("version", ["3", "2"])
def test_deleted_pending_intent_of_a_completed_emitter_is_refused(
    tmp_path: Path, version: str
) -> None:
    """Kill the flow while s1 (accepted, recorded as pending intent) runs, then delete the
    intent: the emitter a is completed, so without the witness a resume would finish the
    flow and s1 would never run."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"a": SPAWNING_A, "s1": {"delay": 60}})
    proc = start_cli(
        home, "flow", "--plan", _plan(tmp_path / "plan.yaml"), "--model", f"script:{script}",
        "--reactive", "all", "--checkpoint-version", version,
    )  # fmt: skip
    try:
        wait_checkpoint(
            home,
            lambda s: (
                {"a", "b"} <= set(s["ops"])
                and any(
                    e.get("spawn_id") == "s1" and e["status"] == "pending" for e in s["spawned"]
                )
            ),
            what="a and b completed, s1 pending",
        )
        wait_for(lambda: invocation_counts(home)["s1"] == 1, timeout=10, what="s1 in flight")
        proc.send_signal(signal.SIGKILL)
        assert finish(proc, timeout=10).returncode == -signal.SIGKILL
    finally:
        stop(proc)
    run_dir = single_run(home)
    child = _child_node_id(run_dir)
    if version == "2":
        _delete_from_v2(run_dir, child)
    else:
        _delete_from_journal(run_dir, child)
    write_script(tmp_path / "script.yaml", {"a": SPAWNING_A})  # s1 would now be quick
    body = _refused_naming(home, run_dir, "spawned node 's1'", "node 'a'", child)
    assert body["error"]["message"].startswith("spawned node 's1'")


def _forge_parent(run_dir: Path, version: str, child: str, parent: str) -> None:
    """Point the child's entry at another ``parent_id``, digest recomputed (a careful forger)."""

    def forged(entry: dict[str, Any]) -> dict[str, Any]:
        entry = {**entry, "parent_id": parent}
        entry["result_digest"] = entry_digest(entry)
        return entry

    if version == "2":
        path = run_dir / CHECKPOINT
        doc = json.loads(path.read_text())
        doc["spawned"] = [forged(e) if e["node_id"] == child else e for e in doc["spawned"]]
        path.write_text(json.dumps(doc))
        return
    journal = run_dir / JOURNAL
    records = [json.loads(line) for line in journal.read_bytes().splitlines()]
    for record in records:
        if record["kind"] == "spawn" and record["entry"]["node_id"] == child:
            record["entry"] = forged(record["entry"])
    journal.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))


@pytest.mark.parametrize("version", ["3", "2"])
def test_a_forged_parent_is_refused_for_what_it_is_not_as_a_missing_entry(
    tmp_path: Path, version: str
) -> None:
    """Killed while s1 (a's spawn, pending) and b run; s1's entry then names b as its parent.

    b's outcome is not recorded, so s1 reads as b's unanchored intent and is dropped; a
    still lists it. Before issue 38 the refusal said the checkpoint had no entry for s1.
    """
    home = tmp_path / "home"
    script = write_script(
        tmp_path / "script.yaml", {"a": SPAWNING_A, "s1": {"delay": 60}, "b": {"delay": 60}}
    )
    proc = start_cli(
        home, "flow", "--plan", _plan(tmp_path / "plan.yaml"), "--model", f"script:{script}",
        "--reactive", "all", "--checkpoint-version", version,
    )  # fmt: skip
    try:
        wait_checkpoint(
            home,
            lambda s: "a" in s["ops"] and any(e.get("spawn_id") == "s1" for e in s["spawned"]),
            what="a completed, s1 pending",
        )
        wait_for(
            lambda: invocation_counts(home)["s1"] == 1 == invocation_counts(home)["b"],
            timeout=10,
            what="s1 and b in flight",
        )
        proc.send_signal(signal.SIGKILL)
        assert finish(proc, timeout=10).returncode == -signal.SIGKILL
    finally:
        stop(proc)
    run_dir = single_run(home)
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    assert "b" not in state["ops"]
    child = _child_node_id(run_dir)
    b_id = next(p["node_id"] for p in state["plan"] if p["agent_id"] == "b")
    _forge_parent(run_dir, version, child, b_id)
    write_script(tmp_path / "script.yaml", {"a": SPAWNING_A})
    body = _refused_naming(home, run_dir, "spawned node 's1'", "entry exists but", b_id, "'b'")
    assert "no entry" not in body["error"]["message"]


def test_intact_witnessed_checkpoint_resumes_and_keeps_witnessing(tmp_path: Path) -> None:
    """The rule refuses only a missing child: with s1 intact (pending at a SIGKILL), the
    resume runs s1 once more, and the resumed run's own entry for a still names it."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"a": SPAWNING_A, "s1": {"delay": 60}})
    proc = start_cli(
        home, "flow", "--plan", _plan(tmp_path / "plan.yaml"), "--model", f"script:{script}",
        "--reactive", "all",
    )  # fmt: skip
    try:
        wait_checkpoint(home, lambda s: {"a", "b"} <= set(s["ops"]), what="a and b completed")
        wait_for(lambda: invocation_counts(home)["s1"] == 1, timeout=10, what="s1 in flight")
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=10)
    finally:
        stop(proc)
    run_dir = single_run(home)
    child = _child_node_id(run_dir)
    write_script(tmp_path / "script.yaml", {"a": SPAWNING_A})
    result = resume(home, run_dir.name, "--json")
    assert result.returncode == 0, result.explain()
    assert node_status(result.json)["s1"] == "completed"
    assert invocation_counts(home) == {"a": 1, "b": 1, "s1": 2}
    resumed = Path(result.json["run_dir"])
    state, _ = load_checkpoint(resumed / CHECKPOINT)
    assert state["ops"]["a"]["spawned_ids"] == [child] == [_child_node_id(resumed)]


# == the settle check covers spawned_ids =========================================================


def _crafted_witness(tmp_path: Path) -> tuple[Crafted, dict[str, Any], dict[str, Any]]:
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}), reactive="all")
    crafted.node("a")
    crafted.node("b", "a")
    emitter = crafted.done("a", "A")
    child = crafted.spawn("s1", parent="a", response="S1")
    emitter["spawned_ids"] = [child["node_id"]]
    emitter["result_digest"] = entry_digest(emitter)
    crafted.done("b", "B")
    return crafted, emitter, child


def test_witnessed_crafted_checkpoint_is_accepted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    crafted, _, _ = _crafted_witness(tmp_path)
    run_dir = crafted.write(home)
    result = resume(home, run_dir.name, "--json")
    assert result.returncode == 0, result.explain()
    assert invocation_counts(home) == {}


@pytest.mark.parametrize("tamper", ["replace", "drop-member", "add-child"])
def test_tampered_spawned_ids_fail_the_settle_check(tmp_path: Path, tamper: str) -> None:
    home = tmp_path / "home"
    crafted, emitter, child = _crafted_witness(tmp_path)
    if tamper == "replace":
        other = crafted.spawn("s2", parent="a", response="S2")
        emitter["spawned_ids"] = [other["node_id"]]
    elif tamper == "drop-member":
        del emitter["spawned_ids"]
    else:
        other = crafted.spawn("s2", parent="a", response="S2")
        emitter["spawned_ids"] = [child["node_id"], other["node_id"]]
    run_dir = crafted.write(home)
    _refused_naming(home, run_dir, "node 'a'", "result_digest")
