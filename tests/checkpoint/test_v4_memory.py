"""What a version 4 reader and a resumed writer hold at once (issue 43 item 2).

A resume of a 100,000-node batch held every segment's bytes beside the folded state while
loading, and then every replayed entry encoded a second time before its first segment was
written (1,405 MiB peak in ``executor_scale.py --rows resume+v4``). Both are sizes, so they
are measured here as sizes: allocations traced by ``tracemalloc`` and encodings counted by
the writer, never a time.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import load_checkpoint
from steerflow.checkpoint._load_v4 import SEGMENT_PREFIX

RESPONSE = 20_000  # characters a response: the unit is ~5 MB, its other members small
COUNT = 256


def _unit(run: Path) -> int:
    """A version 4 unit of COUNT large responses over many segments; their bytes."""

    async def write() -> None:
        w = make_writer(run, version=4, max_records=8)
        for i in range(COUNT):
            await w.record(f"op{i}", status="completed", response=f"{i:05d}" + "r" * RESPONSE)
        await w.close()

    run.mkdir(mode=0o700)
    asyncio.run(write())
    return sum(p.stat().st_size for p in run.iterdir() if p.name.startswith(SEGMENT_PREFIX))


def test_loading_holds_one_segment_at_a_time_beside_the_state(tmp_path: Path) -> None:
    on_disk = _unit(tmp_path / "run")
    responses = COUNT * (RESPONSE + 5)
    assert on_disk > 0.9 * responses  # most entries are in segments, not the journal
    tracemalloc.start()
    try:
        state, report = load_checkpoint(tmp_path / "run")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report["status"] == "clean" and len(state["ops"]) == COUNT
    # The state holds the responses once; every segment's bytes at once beside it (the
    # reader before) would add ~on_disk: one segment at a time adds a fraction of it.
    assert peak < responses + on_disk // 2, (peak, responses, on_disk)


def test_a_resumed_writer_encodes_each_seeded_entry_once_as_it_writes_it(
    tmp_path: Path,
) -> None:
    seeded = {
        f"op{i}": {"status": "completed", "response": f"{i:05d}" + "r" * 1000} for i in range(50)
    }

    async def resume() -> None:
        w = make_writer(tmp_path, version=4, ops=seeded)
        state = w._backend.state  # type: ignore[attr-defined]
        # Nothing encoded up front: the entries wait, as they are, for their segment.
        assert state.entry_encodes == 0 and not state.dirty
        assert w.read_response("op", "op7") == seeded["op7"]["response"]
        await w.flush()  # the first publication: one segment holding all of them
        assert state.entry_encodes == 50 and not state.seeded
        assert w.read_response("op", "op7") == seeded["op7"]["response"]
        await w.record("op7", status="completed", response="again")
        await w.close()

    asyncio.run(resume())
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and list(state["ops"]) == list(seeded)
    assert state["ops"]["op7"]["response"] == "again"
    assert state["ops"]["op8"]["response"] == seeded["op8"]["response"]
