"""The entry validator and the typed state, pinned exactly (issue 20, ``checkpoint/_entries.py``).

Both checkpoint versions read their entries through :func:`check_entry` and
:func:`typed_state`; these tests hold the refusal texts, the ids a refusal names, the
version 2 leniency and every field the typed entries carry.
"""

from __future__ import annotations

from typing import Any

import pytest

from steerflow.checkpoint._entries import (
    EntryError,
    RejectedEntry,
    check_entry,
    entry_ref,
    planned_entry,
    spawned_entry,
    typed_state,
    unguarded_splice,
)

NODE_A, NODE_B = "a" * 32, "b" * 32


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 2,
        "generation": "gen-7",
        "session_id": "s" * 32,
        "prompt": "Review PR 7",
        "plan": [{"agent_id": "research"}],
        "flow_context": {"goal": "ship"},
        "ops": {},
        "spawned": [],
        "config": {"model": "m"},
        "max_spawn": 20,
    }
    doc.update(changes)
    return doc


def _spawn(node_id: str = NODE_A, **changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"node_id": node_id, "status": "completed", "response": "done"}
    entry.update(changes)
    return entry


# -- check_entry and EntryError ---------------------------------------------------------------


def test_entry_error_carries_its_detail_and_no_ref_yet() -> None:
    error = EntryError("response missing")
    assert (str(error), error.detail, error.ref) == ("response missing", "response missing", None)


@pytest.mark.parametrize(
    ("kind", "status", "message"),
    [
        ("op", None, "unsupported status None: not completed or failed"),
        ("op", "running", "unsupported status 'running': not completed or failed"),
        ("op", "pending", "unsupported status 'pending': not completed or failed"),
        ("op", {"x": 1}, "unsupported status (not a status): not completed or failed"),
        ("op", "a b", "unsupported status (not a status): not completed or failed"),
        ("spawn", None, "unsupported status None: not completed or failed, nor pending"),
        ("spawn", 7, "unsupported status (not a status): not completed or failed, nor pending"),
    ],
)
def test_an_unsupported_status_is_shown_only_when_it_is_id_shaped(
    kind: Any, status: object, message: str
) -> None:
    entry: dict[str, Any] = {"agent_id": "x", "node_id": NODE_A, "response": None}
    if status is not None:
        entry["status"] = status
    with pytest.raises(EntryError) as caught:
        check_entry(kind, entry)
    assert caught.value.detail == message


# -- entry_ref ---------------------------------------------------------------------------------


def test_entry_ref_reads_a_non_object_entry_as_empty() -> None:
    assert entry_ref("op", ["agent_id", "x"], "research") == {"kind": "op", "agent_id": "research"}
    assert entry_ref("spawn", ["node_id"]) is None
    assert entry_ref("spawn", "x" * 40) is None


# -- the typed entries -------------------------------------------------------------------------


def test_a_planned_entry_carries_every_field() -> None:
    raw = {
        "agent_id": "draft",
        "status": "failed",
        "response": {"error": "x"},
        "result_digest": "d" * 64,
        "spawned_ids": [NODE_A, NODE_B],
    }
    entry = planned_entry(raw)
    assert (entry.agent_id, entry.status, entry.response) == ("draft", "failed", {"error": "x"})
    assert (entry.result_digest, entry.spawned_ids) == ("d" * 64, (NODE_A, NODE_B))
    assert entry.raw is raw


def test_a_spawned_entry_carries_every_field() -> None:
    raw = _spawn(
        NODE_B,
        response={"text": "ok"},
        operation="Fix it",
        assignee="fixer",
        instruction="Fix the bug",
        parent_id=NODE_A,
        spawn_id="fix-1",
        depends_on=["draft"],
        result_digest="e" * 64,
        spawned_ids=[NODE_A],
        escalated_from=NODE_A,
        model="script:big",
    )
    entry = spawned_entry(raw)
    assert (entry.node_id, entry.status, entry.response) == (NODE_B, "completed", {"text": "ok"})
    assert (entry.operation, entry.assignee, entry.instruction) == (
        "Fix it",
        "fixer",
        "Fix the bug",
    )
    assert (entry.parent_id, entry.spawn_id, entry.depends_on) == (NODE_A, "fix-1", ["draft"])
    assert (entry.result_digest, entry.spawned_ids) == ("e" * 64, (NODE_A,))
    assert (entry.escalated_from, entry.model) == (NODE_A, "script:big")
    assert entry.raw is raw and entry.name == "spawned node 'fix-1'"
    bare = spawned_entry(_spawn(NODE_B))
    assert (bare.spawned_ids, bare.result_digest, bare.operation) == (None, None, None)
    assert (bare.escalated_from, bare.model) == (None, None)


@pytest.mark.parametrize(
    "name",
    ["operation", "assignee", "instruction", "parent_id", "spawn_id", "escalated_from", "model"],
)
def test_a_spawned_entry_refuses_optional_text_of_another_type(name: str) -> None:
    with pytest.raises(EntryError, match=rf"^{name} is not a string or null$"):
        spawned_entry(_spawn(NODE_A, **{name: 5}))


def test_a_spawned_entry_may_be_pending_a_planned_one_may_not() -> None:
    assert spawned_entry(_spawn(status="pending", response=None)).status == "pending"
    with pytest.raises(EntryError, match=r"^unsupported status 'pending'"):
        planned_entry({"agent_id": "x", "status": "pending", "response": None})


# -- unguarded_splice ---------------------------------------------------------------------------

WITNESS = _spawn(NODE_B, spawn_id="draft.esc1", escalated_from=NODE_A, parent_id=NODE_A)
GUARDED_PLAN = [{"agent_id": "draft", "node_id": NODE_A}, {"agent_id": "ship", "node_id": "c" * 32}]


def test_a_splice_witness_is_unguarded_without_planned_node_ids() -> None:
    second = _spawn("c" * 32, spawn_id="draft.esc2", escalated_from=NODE_A, parent_id=NODE_B)
    spawned = [_spawn(NODE_A), 5, WITNESS, second]
    for plan in ([], [{"agent_id": "draft"}], [*GUARDED_PLAN, {"agent_id": "x"}], None, 7, "p"):
        assert unguarded_splice(plan, spawned) is WITNESS, plan  # the first witness, by identity
    # a plan entry that is not an object guards nothing (and is not read as one)
    assert unguarded_splice([*GUARDED_PLAN, "node_id"], [WITNESS]) is WITNESS
    assert unguarded_splice([{"node_id": 5}], [WITNESS]) is WITNESS


def test_a_splice_witness_next_to_every_planned_node_id_is_guarded() -> None:
    assert unguarded_splice(GUARDED_PLAN, [_spawn(NODE_A), WITNESS]) is None


def test_only_an_escalated_from_that_is_set_is_a_splice_witness() -> None:
    ordinary = [_spawn(NODE_A), _spawn(NODE_B, escalated_from=None), ["escalated_from"], 5]
    for plan in ([], [{"agent_id": "draft"}], None):
        assert unguarded_splice(plan, ordinary) is None
    for spawned in (None, {"x": WITNESS}, (WITNESS,), "escalated_from"):
        assert unguarded_splice([], spawned) is None  # not a list: the load refuses it elsewhere


# -- typed_state: strict ------------------------------------------------------------------------


def test_typed_state_keeps_the_document_fields() -> None:
    doc = _doc(ops={"research": {"agent_id": "research", "status": "completed", "response": 1}})
    state = typed_state(doc, lenient=False)
    assert (state.version, state.generation, state.session_id) == (2, "gen-7", "s" * 32)
    assert (state.prompt, state.plan) == ("Review PR 7", [{"agent_id": "research"}])
    assert (state.flow_context, state.config) == ({"goal": "ship"}, {"model": "m"})
    assert (state.max_spawn, state.rejected) == (20, ())
    assert state.as_dict() is doc
    assert typed_state(_doc(generation=None), lenient=False).generation is None


@pytest.mark.parametrize("value", ["20", 2.5, None])
def test_a_max_spawn_that_is_not_an_integer_is_read_as_none(value: object) -> None:
    assert typed_state(_doc(max_spawn=value), lenient=False).max_spawn is None


def test_a_strict_read_refuses_a_planned_entry_without_its_own_ids() -> None:
    doc = _doc(ops={"research": {"status": "completed"}})
    with pytest.raises(EntryError, match=r"^agent_id missing or not a string$") as caught:
        typed_state(doc, lenient=False)
    assert caught.value.ref == {"kind": "op", "agent_id": "research"}


def test_a_strict_read_refuses_a_repeated_spawned_node_naming_it() -> None:
    doc = _doc(spawned=[_spawn(NODE_A, spawn_id="one"), _spawn(NODE_A, spawn_id="two")])
    with pytest.raises(EntryError, match=r"^a spawned node_id repeats$") as caught:
        typed_state(doc, lenient=False)
    assert caught.value.ref == {"kind": "spawn", "node_id": NODE_A, "spawn_id": "two"}
    distinct = typed_state(_doc(spawned=[_spawn(NODE_A), _spawn(NODE_B)]), lenient=False)
    assert [e.node_id for e in distinct.spawned] == [NODE_A, NODE_B]
    assert list(distinct.spawned_by_node()) == [NODE_A, NODE_B]


def test_a_strict_read_names_an_unreadable_spawned_entry_by_its_index() -> None:
    doc = _doc(spawned=[_spawn(NODE_A), ["not", "an", "object"]])
    with pytest.raises(EntryError, match=r"^entry is not an object$") as caught:
        typed_state(doc, lenient=False)
    assert caught.value.ref == {"kind": "spawn", "index": 1}


# -- typed_state: the version 2 leniency --------------------------------------------------------


def test_a_lenient_read_lets_a_planned_entry_omit_its_id_and_response() -> None:
    doc = _doc(ops={"research": {"status": "completed"}, "draft": {"agent_id": "own", **_ok()}})
    state = typed_state(doc, lenient=True)
    research = state.ops["research"]
    assert (research.agent_id, research.response, research.status) == (
        "research",
        None,
        "completed",
    )
    assert state.ops["draft"].agent_id == "own"  # a stored id wins over the key
    assert state.ops["draft"].response == "r"
    assert state.rejected == ()


def _ok() -> dict[str, Any]:
    return {"status": "completed", "response": "r"}


def test_a_lenient_read_sets_bad_entries_aside_with_the_reason() -> None:
    doc = _doc(
        ops={"research": ["not", "an", "object"], "draft": {"status": "running"}},
        spawned=[_spawn(NODE_A), 5, _spawn(NODE_B, spawn_id="fix-2", status="done")],
    )
    state = typed_state(doc, lenient=True)
    assert state.ops == {}
    assert [e.node_id for e in state.spawned] == [NODE_A]
    assert state.rejected == (
        RejectedEntry("op", {"kind": "op", "agent_id": "research"}, "entry is not an object"),
        RejectedEntry(
            "op",
            {"kind": "op", "agent_id": "draft"},
            "unsupported status 'running': not completed or failed",
        ),
        RejectedEntry("spawn", {"kind": "spawn", "index": 1}, "entry is not an object"),
        RejectedEntry(
            "spawn",
            {"kind": "spawn", "node_id": NODE_B, "spawn_id": "fix-2"},
            "unsupported status 'done': not completed or failed, nor pending",
        ),
    )


def test_a_lenient_read_keeps_a_repeated_spawned_node() -> None:
    doc = _doc(spawned=[_spawn(NODE_A, spawn_id="one"), _spawn(NODE_A, spawn_id="two")])
    state = typed_state(doc, lenient=True)
    assert [e.spawn_id for e in state.spawned] == ["one", "two"] and state.rejected == ()
