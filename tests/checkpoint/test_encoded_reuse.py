"""Encoded-entry reuse: a base is assembled from bytes kept since each entry was encoded.

Issue 17, item 2: a compaction must not re-encode the unchanged entries (nor the plan)
of the whole state.  These tests pin the bytes (a base built from kept encodings is
exactly the full encoding of the document) and the work (how many entries and bytes
went through the JSON encoder across several compactions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckpt_support import PLAN, _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import _capture, load_checkpoint
from steerflow.checkpoint._digest import normalize
from steerflow.checkpoint._state import Item, State, dumps_compact


def _item(kind: str, key: str, response: object, context: Any) -> Item:
    field = "agent_id" if kind == "op" else "node_id"
    entry = normalize({field: key, "status": "completed", "response": response})
    return Item(kind, key, entry, None, context)  # type: ignore[arg-type]


def _state(max_spawn: int | None, seeded: bool) -> State:
    ops = {"seed": normalize({"agent_id": "seed", "status": "failed", "response": {"e": 1}})}
    spawned = [normalize({"node_id": "s0", "status": "pending", "response": None})]
    return State(
        meta={
            "session_id": "a" * 32,
            "prompt": "p \u00e9\n",
            "plan": normalize(PLAN),
            "config": {"max_ops": 0},
            "max_spawn": max_spawn,
        },
        context=_capture.freeze({"k": [1, 2.5, None]}),
        to_json=_capture.to_jsonable,
        ops=ops if seeded else {},
        spawned=spawned if seeded else [],
        spawn_index={"s0": 0} if seeded else {},
    )


def test_base_pieces_are_exactly_the_full_encoding() -> None:
    for max_spawn in (None, 7):
        for seeded in (False, True):
            st = _state(max_spawn, seeded)
            head: dict[str, Any] = {"version": 3, "generation": "f" * 32, "journal_seq": 0}

            def check(st: State = st, head: dict[str, Any] = head) -> None:
                assert b"".join(st.chunks(head)) == dumps_compact(st.document(head))

            check()
            ctx = st.context
            st.apply(_item("op", "a", "one", ctx))
            st.apply(_item("spawn", "s1", [1, {"x": "\u2603"}], ctx))
            check()
            ctx = _capture.capture(ctx, {"k": [1], "new": True})[0]
            st.apply(_item("op", "seed", "replaced in place", ctx))  # upsert keeps position
            st.apply(_item("spawn", "s0", "done", ctx))
            st.apply(_item("op", "b", None, ctx))
            check()
            assert list(json.loads(b"".join(st.chunks(head)))["ops"]) == list(st.ops)
            st.reset({}, [normalize({"node_id": "z", "status": "failed", "response": 0})], ctx)
            check()
            st.apply(_item("op", "after", 1, ctx))
            check()


async def test_compactions_encode_each_entry_once(tmp_path: Path) -> None:
    context = {"fixed": ["x"] * 50}
    w = make_writer(tmp_path, version=3, max_records=4, flow_context=context)
    await w.flush()
    state: State = w._backend.state  # type: ignore[attr-defined]
    before_entries, before_bytes = state.entry_encodes, state.encoded_bytes
    base_bytes = 0
    generations = set()
    for i in range(20):
        await w.record(f"op-{i}", status="completed", response=f"r{i}" * 40, flow_context=context)
        generation = json.loads((tmp_path / "checkpoint.json").read_bytes())["generation"]
        if generation not in generations:
            generations.add(generation)
            base_bytes += (tmp_path / "checkpoint.json").stat().st_size
    await w.close()
    assert w._backend.compactions == 4  # type: ignore[attr-defined]
    final, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and len(final["ops"]) == 20
    entries = sum(len(dumps_compact(final["ops"][f"op-{i}"])) for i in range(20))
    # Every recorded entry went through the encoder exactly once, for its journal line;
    # the four compactions (bases of up to 17 entries, the plan and the unchanged
    # context) encoded nothing more.
    assert state.entry_encodes - before_entries == 20
    assert state.encoded_bytes - before_bytes == entries
    assert base_bytes > 2 * entries  # what the compactions wrote without encoding it
