"""The committed golden checkpoint units (``tests/golden/``) load to exactly what they held.

The files were written by ``tests/golden/make_golden.py`` and are read here as they are on
disk, so a change to the loader (or the writer, see the byte test) shows up as a diff
against committed data instead of drifting together with its own fixtures.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from golden import make_golden
from steerflow.checkpoint import (
    PlannedEntry,
    SpawnedEntry,
    entry_digest,
    load_checkpoint,
    load_state,
    result_digest,
)
from steerflow.errors import CheckpointRecoveryError, FlowResumeError
from steerflow.orchestrate._agent_state import read_turns
from steerflow.resume import plan_replay

GOLDEN = Path(make_golden.__file__).resolve().parent
#: The generator's units and those an earlier writer wrote (kept to be read, not rewritten).
ALL_UNITS = {**make_golden.UNITS, **make_golden.FROZEN}
UNITS = sorted(ALL_UNITS)
NODE = make_golden.NODE


def _run_dir(unit: str) -> Path:
    return GOLDEN / unit / "runs" / ALL_UNITS[unit][0]


def _expected(unit: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / unit / "expected.json").read_text("utf-8"))
    return data


@pytest.mark.parametrize("unit", UNITS)
def test_a_golden_unit_loads_to_its_recorded_state_and_report(unit: str) -> None:
    state, report = load_checkpoint(_run_dir(unit))
    expected = _expected(unit)
    assert state == expected["state"]
    assert report == expected["report"]


@pytest.mark.parametrize("unit", UNITS)
def test_a_golden_unit_holds_the_recorded_run(unit: str) -> None:
    """What the scenario recorded, stated by hand rather than taken from the loader."""
    state, report = load_checkpoint(_run_dir(unit))
    assert state["session_id"] == make_golden.SESSION_ID
    assert [item["agent_id"] for item in state["plan"]] == ["research", "draft", "review"]
    assert sorted(state["ops"]) == ["draft", "research"]
    assert state["ops"]["research"]["response"] == make_golden.RESPONSES["research"]
    assert state["ops"]["draft"]["response"] == make_golden.RESPONSES["draft"]
    assert state["ops"]["draft"]["spawned_ids"] == [NODE["fix-1"], NODE["fix-2"]]
    spawned = {e["spawn_id"]: e for e in state["spawned"]}
    assert [e["spawn_id"] for e in state["spawned"]] == ["fix-1", "fix-2"]
    assert spawned["fix-1"]["status"] == "completed"
    assert spawned["fix-1"]["response"] == make_golden.RESPONSES["fix-1"]
    assert spawned["fix-2"]["status"] == "pending" and spawned["fix-2"]["response"] is None
    assert all(e["parent_id"] == NODE["draft"] for e in state["spawned"])
    messages = state["flow_context"]["operator_messages"]
    assert [m["rendered_into_op"] for m in messages] == ["research", None]
    assert state["config"] == make_golden.CONFIG and state["max_spawn"] == 20
    version = ALL_UNITS[unit][1]
    assert report["status"] == "clean" and report["checkpoint_version"] == version
    if unit in ("v3", "v4"):
        assert (report["records_applied"], report["last_seq"]) == (5, 5)
    if unit in ("v3-compacted", "v4-compacted", "v4-compacted-r1"):
        # Compacted: three outcomes live in the base, two in the journal.
        assert (report["records_applied"], report["last_seq"]) == (2, 2)


def test_the_versions_agree_on_the_logical_state() -> None:
    def logical(unit: str) -> dict[str, Any]:
        state, _ = load_checkpoint(_run_dir(unit))
        return {k: v for k, v in state.items() if k not in ("version", "generation")}

    assert logical("v2") == logical("v3") == logical("v3-compacted")
    assert logical("v3") == logical("v4") == logical("v4-compacted")
    assert logical("v4-compacted") == logical("v4-compacted-r1")


def test_the_writer_still_produces_the_golden_bytes(tmp_path: Path) -> None:
    """Rerunning the generator reproduces every committed file byte for byte."""
    make_golden.write_all(tmp_path)
    committed = sorted(p.relative_to(GOLDEN) for p in GOLDEN.rglob("*") if p.is_file())
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = [p for p in committed if p.suffix != ".py" and p.name != "README.md"]
    committed = [p for p in committed if "__pycache__" not in p.parts]
    committed = [p for p in committed if p.parts[0] not in make_golden.FROZEN]
    assert written == committed
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (GOLDEN / rel).read_bytes(), f"{rel} changed"


def test_a_copy_of_a_golden_unit_loads_the_same(tmp_path: Path) -> None:
    """Nothing in a unit depends on where it lies (resume tests load copies)."""
    for unit in UNITS:
        copy = tmp_path / unit
        shutil.copytree(_run_dir(unit), copy)
        assert load_checkpoint(copy) == load_checkpoint(_run_dir(unit))


# -- the typed loader ------------------------------------------------------------------------


@pytest.mark.parametrize("unit", UNITS)
def test_the_typed_loader_reads_the_same_entries(unit: str) -> None:
    state, report = load_state(_run_dir(unit))
    assert (state.as_dict(), report) == load_checkpoint(_run_dir(unit))
    assert state.version == ALL_UNITS[unit][1] and state.rejected == ()
    research, draft = state.ops["research"], state.ops["draft"]
    assert isinstance(draft, PlannedEntry)
    assert (research.status, research.response) == ("completed", make_golden.RESPONSES["research"])
    assert draft.spawned_ids == (NODE["fix-1"], NODE["fix-2"])
    assert research.spawned_ids is None  # the member is absent, not empty
    assert draft.result_digest == entry_digest(dict(draft.raw))
    fix1, fix2 = state.spawned
    assert isinstance(fix2, SpawnedEntry)
    assert (fix1.spawn_id, fix1.status, fix1.parent_id) == ("fix-1", "completed", NODE["draft"])
    assert (fix2.spawn_id, fix2.status, fix2.response) == ("fix-2", "pending", None)
    assert fix2.depends_on == ["draft"] and fix2.operation == "Fix fix-2"
    assert state.max_spawn == 20 and state.config == make_golden.CONFIG


def _damaged_v2(tmp_path: Path) -> Path:
    """The v2 golden unit with a planned and a spawned entry of an unsupported status."""
    run_dir = tmp_path / "run"
    shutil.copytree(_run_dir("v2"), run_dir)
    path = run_dir / "checkpoint.json"
    doc = json.loads(path.read_text("utf-8"))
    doc["ops"]["research"]["status"] = "running"
    doc["spawned"][1]["status"] = "done"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return run_dir


def test_a_strict_read_refuses_a_bad_v2_entry_naming_it(tmp_path: Path) -> None:
    run_dir = _damaged_v2(tmp_path)
    with pytest.raises(CheckpointRecoveryError) as caught:
        load_state(run_dir)
    refusal = caught.value.report["refusal"]
    assert refusal["reason"] == "invalid-entry"
    assert refusal["file"] == "checkpoint.json"
    assert refusal["entry"] == {"kind": "op", "agent_id": "research"}
    assert "'running'" in str(caught.value)


def test_a_lenient_read_sets_bad_v2_entries_aside(tmp_path: Path) -> None:
    run_dir = _damaged_v2(tmp_path)
    state, report = load_state(run_dir, v2_lenient=True)
    assert report["status"] == "clean"
    assert sorted(state.ops) == ["draft"]
    assert [e.spawn_id for e in state.spawned] == ["fix-1"]
    assert [(r.kind, r.ref) for r in state.rejected] == [
        ("op", {"kind": "op", "agent_id": "research"}),
        ("spawn", {"kind": "spawn", "node_id": NODE["fix-2"], "spawn_id": "fix-2"}),
    ]
    # The library contract (CONTRACT §9) still hands back the whole dict, as before.
    doc, _ = load_checkpoint(run_dir)
    assert doc["ops"]["research"]["status"] == "running"


# -- the replay plan (D5) of a golden unit -----------------------------------------------------


@pytest.mark.parametrize("unit", UNITS)
def test_the_replay_plan_of_a_golden_unit(unit: str) -> None:
    state, _ = load_state(_run_dir(unit), v2_lenient=True)
    plan = plan_replay(state, _run_dir(unit))
    assert plan.completed == {
        "research": make_golden.RESPONSES["research"],
        "draft": make_golden.RESPONSES["draft"],
    }
    assert plan.witnesses == {"research": (), "draft": (NODE["fix-1"], NODE["fix-2"])}
    assert [(s.spawn_id, s.status, s.parent_key) for s in plan.spawned] == [
        ("fix-1", "completed", "draft"),
        ("fix-2", "pending", "draft"),
    ]
    assert sorted(plan.branches) == ["draft", "fix-1", "research"]
    assert plan.branches["draft"][0].content == "step draft"
    assert (plan.rerun, plan.degraded, plan.notes) == ((), (), ())


def test_pending_intent_under_an_unrecorded_emitter_is_dropped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(_run_dir("v2"), run_dir)
    path = run_dir / "checkpoint.json"
    doc = json.loads(path.read_text("utf-8"))
    del doc["ops"]["draft"]  # killed between the spawn intent and the emitter's outcome
    doc["spawned"][0].update(status="pending", response=None)
    # sealed as the intent record was (every entry's digest is checked, pending ones too)
    doc["spawned"][0]["result_digest"] = entry_digest(doc["spawned"][0])
    path.write_text(json.dumps(doc), encoding="utf-8")
    state, _ = load_state(run_dir, v2_lenient=True)
    plan = plan_replay(state, run_dir)
    assert plan.spawned == () and list(plan.completed) == ["research"]
    assert [n.split(" dropped")[0] for n in plan.notes] == [
        "spawn intent 'fix-1'",
        "spawn intent 'fix-2'",
    ]


def test_a_lenient_bad_v2_entry_refuses_the_replay_naming_it(tmp_path: Path) -> None:
    run_dir = _damaged_v2(tmp_path)
    state, _ = load_state(run_dir, v2_lenient=True)
    with pytest.raises(FlowResumeError, match=r"node 'research': unsupported status 'running'"):
        plan_replay(state, run_dir)


# -- the agent and escalation units (issue 26) -------------------------------------------------

KIND_UNITS = sorted(make_golden.KIND_UNITS)
AGENT_UNITS = ["agent-v3", "agent-v3-legacy"]
ESCALATION_UNITS = ["escalation-v3", "escalation-v3-legacy"]


def _kind_dir(unit: str) -> Path:
    return GOLDEN / unit / "runs" / make_golden.KIND_UNITS[unit]


@pytest.mark.parametrize("unit", KIND_UNITS)
def test_an_agent_or_escalation_unit_loads_to_its_recorded_state(unit: str) -> None:
    state, report = load_checkpoint(_kind_dir(unit))
    expected = _expected(unit)
    assert (state, report) == (expected["state"], expected["report"])
    assert report["status"] == "clean" and report["checkpoint_version"] == 3


@pytest.mark.parametrize("unit", AGENT_UNITS)
def test_both_agent_forms_read_as_the_same_turns(unit: str) -> None:
    """Today's entries and the older flow-context form describe the same run."""
    state, _ = load_state(_kind_dir(unit))
    turns = read_turns(state)
    assert turns.problems == []
    assert [(t.number, t.instruction, list(t.controls), t.entry.response) for t in turns.turns] == [
        tuple(turn) for turn in make_golden.TURNS
    ]
    in_flight = make_golden.IN_FLIGHT
    assert (turns.next_instruction, list(turns.next_controls)) == (
        in_flight["instruction"],
        in_flight["controls"],
    )
    assert turns.conversation == make_golden.CONVERSATION
    assert turns.model == make_golden.AGENT_CONFIG["model"] and turns.max_turns == 20
    turns.refuse_if_unfaithful("RUN", retry_failed=False)


def test_turn_entries_are_digested_over_what_the_turn_is_and_legacy_ones_over_the_response() -> (
    None
):
    new, _ = load_state(_kind_dir("agent-v3"))
    old, _ = load_state(_kind_dir("agent-v3-legacy"))
    turn2 = new.ops["turn-2"]
    assert turn2.raw["turn"] == 2 and turn2.raw["controls"] == ["c2" * 16]
    assert turn2.raw["next"] == make_golden.IN_FLIGHT
    # Pinned by hand: the digest today's writer gave the last record of turn 2 ...
    pinned = "blake2b:977cf1c17cd298113aeddb6ea27ea1f790beaa7cdd3ff36d155d41c2c23cff4c"
    assert turn2.result_digest == entry_digest(dict(turn2.raw)) == pinned
    # ... and the one an entry of the older form keeps: over the response alone.
    legacy = old.ops["turn-2"]
    assert "turn" not in legacy.raw
    assert legacy.result_digest == result_digest("recorded: turn 2")
    assert legacy.result_digest == (
        "blake2b:cdf687be842c225b104147d6b714102b864749d204e5c6ee17daaf00cd8e67eb"
    )


@pytest.mark.parametrize("unit", ESCALATION_UNITS)
def test_the_replay_plan_of_an_escalation_unit(unit: str) -> None:
    state, _ = load_state(_kind_dir(unit))
    plan = plan_replay(state, _kind_dir(unit))
    assert plan.completed == {} and plan.rerun == ()
    assert plan.superseded == {"a": make_golden.ESC_RESPONSES["a"]}
    (retry,) = plan.spawned
    assert (retry.spawn_id, retry.status, retry.response) == (
        "a.esc1",
        "completed",
        make_golden.ESC_RESPONSES["a.esc1"],
    )
    assert (retry.escalated_from_key, retry.escalation, retry.parent_key) == ("a", 1, "a")
    assert retry.model == f"script:{make_golden.SCRIPT}" and not retry.superseded


def test_the_retry_s_digest_covers_its_witness_and_attempt() -> None:
    new, _ = load_state(_kind_dir("escalation-v3"))
    old, _ = load_state(_kind_dir("escalation-v3-legacy"))
    (retry,), (legacy,) = new.spawned, old.spawned
    assert retry.raw["escalation"] == 1 and "escalation" not in legacy.raw
    assert (
        retry.result_digest == entry_digest(dict(retry.raw)) != result_digest("recorded: rescued")
    )
    assert legacy.result_digest == result_digest("recorded: rescued")
    for member in ("escalated_from", "escalation", "parent_id", "model"):
        changed = {k: v for k, v in retry.raw.items() if k not in (member, "result_digest")}
        assert entry_digest(changed) != retry.result_digest, member


def test_a_golden_retry_that_lost_its_witness_is_refused_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(_kind_dir("escalation-v3"), run_dir)
    journal = run_dir / "checkpoint.json.journal"
    records = [json.loads(line) for line in journal.read_text("utf-8").splitlines()]
    for record in records:
        record["entry"].pop("escalated_from", None)
    journal.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    state, _ = load_state(run_dir)
    for retry_failed in (False, True):
        with pytest.raises(FlowResumeError, match=r"^spawned node 'a\.esc1': .*result_digest"):
            plan_replay(state, run_dir, retry_failed=retry_failed)
