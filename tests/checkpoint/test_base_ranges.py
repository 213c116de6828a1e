"""Kept encodings live in the published base, not in memory (issue 17, decision 65).

Once a version 3 base is published, every entry it holds is kept as its byte range in
that base (read back through a descriptor of the writer's own object) instead of as
bytes; the next base copies those ranges, so it is still exactly the full encoding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import load_checkpoint
from steerflow.checkpoint._io import Span
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


async def test_compaction_copies_unchanged_entries_in_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept entries go from the previous base to the new one with copy_file_range: no
    # byte of them is read into the process (no transient buffers for malloc to keep).
    read, copied = [0], [0]
    real_pread, real_copy = os.pread, os.copy_file_range

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read[0] += len(data)
        return data

    def copy(src: int, dst: int, count: int, *args: Any) -> int:
        done = real_copy(src, dst, count, *args)
        copied[0] += done
        return done

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "copy_file_range", copy)
    w = make_writer(tmp_path, version=3, max_records=4)
    await w.flush()
    for i in range(30):
        await w.record(f"op-{i % 12}", status="completed", response=f"r{i}" * 200)
    await w.close()
    assert read[0] == 0
    assert copied[0] > 12 * 400  # every compaction after the first copies kept entries
    final, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert {k: e["response"] for k, e in final["ops"].items()} == {
        f"op-{i % 12}": f"r{i}" * 200 for i in range(30)
    }


def test_changed_entries_anywhere_are_patched_into_the_copied_runs(tmp_path: Path) -> None:
    state = State(
        meta={"session_id": "0" * 32, "prompt": "p", "plan": [], "config": {}},
        context={},
        to_json=lambda c: c,
    )
    for i in range(8):
        state.apply(Item("op", f"k{i}", {"agent_id": f"k{i}", "response": "x" * i}, None, {}))
        state.apply(Item("spawn", f"s{i}", {"node_id": f"s{i}", "response": i}, None, {}))
    for generation in range(3):
        head = {"version": 3, "generation": f"g{generation}", "journal_seq": 0}
        path = tmp_path / f"base{generation}"
        path.write_bytes(b"".join(state.chunks(head)))
        assert path.read_bytes() == dumps_compact(state.document(head))
        state.published(os.open(path, os.O_RDONLY))
        assert all(isinstance(enc, int) for enc in _kept(state))
        # first, last, adjacent and new entries change, in an order unlike the document's
        for key in ("k7", "k0", f"k{9 + generation}", "k3", "k4"):
            entry = {"agent_id": key, "response": f"{key}@{generation}"}
            state.apply(Item("op", key, entry, None, {}))
        for node in ("s7", "s0", f"s{9 + generation}", "s4", "s3"):
            entry = {"node_id": node, "response": f"{node}@{generation}"}
            state.apply(Item("spawn", node, entry, None, {}))
        pieces = list(state.pieces(head))
        # unchanged runs are single spans: k1-k2 and k5-k6 (and later the new keys' runs)
        assert sum(isinstance(p, Span) for p in pieces) <= 6
    final = {"version": 3, "generation": "last", "journal_seq": 0}
    assert b"".join(state.chunks(final)) == dumps_compact(state.document(final))
