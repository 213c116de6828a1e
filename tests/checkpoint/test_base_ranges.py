"""Kept encodings live in the published base, not in memory (issue 17, decision 65).

Once a version 3 base is published, every entry it holds is kept as its byte range in
that base (read back through a descriptor of the writer's own object) instead of as
bytes; the next base copies those ranges, so it is still exactly the full encoding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import load_checkpoint
from steerflow.checkpoint._state import Item, State, dumps_compact


def _kept(state: State) -> list[object]:
    return [*state._ops_enc.values(), *state._spawned_enc]


def _ranges(state: State) -> list[tuple[int, int]]:
    """``(offset, length)`` in the base of every entry kept as a range."""
    ops = zip(state._ops_at, state._ops_enc.values(), strict=False)
    spawned = zip(state._spawned_at, state._spawned_enc, strict=False)
    return [(at, n) for at, n in [*ops, *spawned] if isinstance(n, int)]


async def test_published_entries_are_kept_as_ranges_of_the_base(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=4)
    await w.flush()
    state: State = w._backend.state  # type: ignore[attr-defined]
    for i in range(18):
        await w.record(f"op-{i}", status="completed", response=f"r{i}" * 40, flow_context={})
        await w.record_spawned(f"s{i % 5}", status="pending", response=None)
    base = tmp_path / "checkpoint.json"
    assert state.base_fd is not None
    # the descriptor is the published base itself, opened read-only
    assert os.fstat(state.base_fd).st_ino == base.stat().st_ino
    ranges = _ranges(state)
    data = base.read_bytes()
    document = json.loads(data)
    assert len(ranges) > 10
    # each range is exactly one entry's encoding in that base
    members = {dumps_compact(k) + b":" + dumps_compact(e) for k, e in document["ops"].items()}
    members |= {dumps_compact(e) for e in document["spawned"]}
    assert all(data[o : o + n] in members for o, n in ranges)
    # entries folded after that base are bytes until the next base holds them
    later = [enc for enc in _kept(state) if isinstance(enc, bytes)]
    assert len(ranges) + len(later) == len(state.ops) + len(state.spawned)
    assert len(later) < 8  # at most what the current journal holds
    await w.close()
    assert state.base_fd is None
    final, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert sorted(final["ops"]) == sorted(f"op-{i}" for i in range(18))
    assert [e["node_id"] for e in final["spawned"]] == [f"s{i}" for i in range(5)]


def test_a_base_assembled_from_ranges_is_the_full_encoding(tmp_path: Path) -> None:
    state = State(
        meta={"session_id": "0" * 32, "prompt": "p", "plan": [], "config": {}},
        context={},
        to_json=lambda c: c,
    )
    for i in range(6):
        state.apply(Item("op", f"k{i}", {"agent_id": f"k{i}", "response": "x" * i}, None, {}))
    state.apply(Item("spawn", "s", {"node_id": "s", "response": None}, None, {}))
    head = {"version": 3, "generation": "g1", "journal_seq": 0}
    path = tmp_path / "base"
    path.write_bytes(b"".join(state.chunks(head)))
    state.published(os.open(path, os.O_RDONLY))
    assert all(isinstance(enc, int) for enc in _kept(state))
    # one changed, one new entry: the rest is copied from the base, commas and all
    state.apply(Item("op", "k2", {"agent_id": "k2", "response": "changed"}, None, {}))
    state.apply(Item("op", "k9", {"agent_id": "k9", "response": "new"}, None, {}))
    head2 = {"version": 3, "generation": "g2", "journal_seq": 0}
    assert b"".join(state.chunks(head2)) == dumps_compact(state.document(head2))


def test_a_base_assembled_before_a_change_is_not_adopted(tmp_path: Path) -> None:
    state = State(
        meta={"session_id": "0" * 32, "prompt": "p", "plan": [], "config": {}},
        context={},
        to_json=lambda c: c,
    )
    state.apply(Item("op", "k", {"agent_id": "k"}, None, {}))
    path = tmp_path / "base"
    path.write_bytes(b"".join(state.chunks({"version": 3})))
    state.apply(Item("op", "k2", {"agent_id": "k2"}, None, {}))
    fd = os.open(path, os.O_RDONLY)
    state.published(fd)  # the state moved on: its bytes stay, the descriptor is closed
    assert state.base_fd is None
    assert all(isinstance(enc, bytes) for enc in _kept(state))
    try:
        os.fstat(fd)
        raise AssertionError("the descriptor was left open")
    except OSError:
        pass
