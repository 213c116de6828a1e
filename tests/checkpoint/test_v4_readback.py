"""A version 4 writer reads any entry it recorded back (issue 43 item 2, decision 393).

Real writers on real files: while it records (from its encodings since the last manifest
or through a pinned segment, across compactions and merges, from another thread while it
compacts), and once closed (through a fresh descriptor, refusing a segment that is gone,
replaced or altered). A version 3 writer offers no read-back.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint._load_v4 import SEGMENT_PREFIX
from steerflow.checkpoint._v4 import SEGMENT_FANOUT
from steerflow.errors import PersistenceError


def _text(i: int) -> str:
    return f"reply {i} " + "é" * (i % 7) + "x" * 300


def _segments(run: Path) -> list[Path]:
    return sorted(p for p in run.iterdir() if p.name.startswith(SEGMENT_PREFIX))


def test_every_entry_reads_back_across_compactions_merges_and_close(tmp_path: Path) -> None:
    count = 2 * SEGMENT_FANOUT + 10  # compacting every 2 records: at least one merge

    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=2)
        assert w.reads_back
        for i in range(count):
            await w.record(f"op{i}", status="completed", response=_text(i))
            if i % 9 == 0:
                await w.record_spawned(
                    f"n{i}",
                    status="completed",
                    response=[i, "s"],
                    parent_id=None,
                    spawn_id=f"sp{i}",
                )
            # Every entry so far, wherever it lies now (encoding, fresh or merged segment).
            assert [w.read_response("op", f"op{j}") for j in range(i + 1)] == [
                _text(j) for j in range(i + 1)
            ]
        await w.record("op3", status="failed", response={"error": "later"})
        assert w.read_response("op", "op3") == {"error": "later"}  # the last record wins
        for i in range(count, count + 2):  # ...also once it lies in a segment
            await w.record(f"op{i}", status="completed", response=_text(i))
        assert w.read_response("op", "op3") == {"error": "later"}
        assert w.read_response("spawn", "n9") == [9, "s"]
        await w.close()
        # Closed: its pins are gone; the same answers from the files.
        assert w.reads_back
        assert [w.read_response("op", f"op{j}") for j in range(count + 2) if j != 3] == [
            _text(j) for j in range(count + 2) if j != 3
        ]
        assert w.read_response("op", "op3") == {"error": "later"}
        assert w.read_response("spawn", "n18") == [18, "s"]
        with pytest.raises(PersistenceError, match="'nope' has no entry"):
            w.read_response("op", "nope")

    asyncio.run(write())
    assert len(_segments(tmp_path)) < count // 2  # merged: not one segment per compaction


def test_a_reader_thread_reads_while_the_writer_compacts_and_merges(tmp_path: Path) -> None:
    """Reads from another thread never meet a closed pin nor a half-swapped state."""
    recorded: list[int] = []
    stop = threading.Event()
    reads, wrong = [0], []

    def reader(w: object) -> None:
        while not stop.is_set() or reads[0] == 0:
            for i in list(recorded):
                got = w.read_response("op", f"op{i}")  # type: ignore[attr-defined]
                reads[0] += 1
                if got != _text(i):
                    wrong.append((i, got))

    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=1)
        thread = threading.Thread(target=reader, args=(w,))
        thread.start()
        try:
            for i in range(3 * SEGMENT_FANOUT):
                await w.record(f"op{i}", status="completed", response=_text(i))
                recorded.append(i)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 60)
            await w.close()

    asyncio.run(write())
    assert reads[0] > 0 and wrong == []


@pytest.fixture
def closed(tmp_path: Path) -> tuple[object, Path]:
    """A closed writer whose entries lie in segments (none in its last encodings)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)

    async def write() -> object:
        w = make_writer(run, version=4, max_records=1)
        for i in range(4):
            await w.record(f"op{i}", status="completed", response=_text(i))
        await w.record("op0", status="completed", response="again")  # op0: in two segments
        await w.close()
        return w

    return asyncio.run(write()), run


def _holder(w: object, run: Path, key: str) -> Path:
    """The segment holding ``key``'s last entry (found through its name, as the reader)."""
    where = w._backend._closed.locations["op", key]  # type: ignore[attr-defined]
    return run / where[0]


def test_a_closed_writer_refuses_a_removed_segment_naming_it(closed: tuple[object, Path]) -> None:
    w, run = closed
    seg = _holder(w, run, "op2")
    seg.unlink()
    said = re.escape(f"cannot read node 'op2' back from {seg}")
    with pytest.raises(PersistenceError, match=said):
        w.read_response("op", "op2")  # type: ignore[attr-defined]


def test_a_closed_writer_refuses_a_replaced_segment(closed: tuple[object, Path]) -> None:
    w, run = closed
    seg = _holder(w, run, "op1")
    copy = seg.with_name("copy")
    shutil.copyfile(seg, copy)
    os.replace(copy, seg)  # the same bytes, another file
    with pytest.raises(PersistenceError, match="no longer the segment this run wrote"):
        w.read_response("op", "op1")  # type: ignore[attr-defined]


def test_a_closed_writer_refuses_an_altered_segment(closed: tuple[object, Path]) -> None:
    w, run = closed
    seg = _holder(w, run, "op1")
    data = seg.read_bytes()
    at = data.index(b"reply 1 ") + len(b"reply ")
    with open(seg, "r+b") as handle:  # in place: same file, one byte changed
        handle.seek(at)
        handle.write(b"7")
    with pytest.raises(PersistenceError, match=r"'op1' in .* does not match its digest"):
        w.read_response("op", "op1")  # type: ignore[attr-defined]
    assert w.read_response("op", "op0") == "again"  # type: ignore[attr-defined]


def test_a_version_3_writer_reads_nothing_back(tmp_path: Path) -> None:
    async def write() -> None:
        w = make_writer(tmp_path, version=3)
        await w.record("op0", status="completed", response="r")
        assert not w.reads_back
        with pytest.raises(PersistenceError, match="version 3 checkpoint keeps no read-back"):
            w.read_response("op", "op0")
        await w.close()

    asyncio.run(write())
