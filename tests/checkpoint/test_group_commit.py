"""Group commit in the version 3 writer: one drain, and compactions that absorb a batch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow import _faults
from steerflow.checkpoint import load_checkpoint


async def test_a_batch_reaching_the_count_limit_goes_into_the_new_base(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=3)
    await w.flush()
    first_base = (tmp_path / "checkpoint.json").stat().st_size
    # Admitted together, persisted as one batch: three fit the journal, the fourth
    # reaches the limit with six more behind it, so all ten go into one new base and
    # the lines of the first three are never written to the old journal.
    await asyncio.gather(
        *(
            w.record(f"op-{i}", status="completed", response=i, flow_context={"n": i})
            for i in range(10)
        )
    )
    assert w._backend.compactions == 1  # type: ignore[attr-defined]
    assert (tmp_path / "checkpoint.json.journal").read_bytes() == b""
    base = json.loads((tmp_path / "checkpoint.json").read_bytes())
    assert list(base["ops"]) == [f"op-{i}" for i in range(10)] and base["flow_context"] == {"n": 9}
    assert w.bytes_written == first_base + (tmp_path / "checkpoint.json").stat().st_size
    # The next record starts the new generation's journal at sequence 1.
    await w.record("after", status="completed", response="a")
    lines = (tmp_path / "checkpoint.json.journal").read_bytes().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [1]
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and len(state["ops"]) == 11
    assert w.records_acknowledged == 11


async def test_records_admitted_together_share_one_append(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.flush()
    syncs: list[str] = []
    _faults.set_fault_hook(lambda step, when: syncs.append(step) if when == "after" else None)
    try:
        await asyncio.gather(
            *(w.record(f"op-{i}", status="completed", response=i) for i in range(40))
        )
    finally:
        _faults.set_fault_hook(None)
    # The drain starts after the forty admissions and takes them all: one write and one
    # fsync acknowledge every record (no first batch of one for the first caller).
    assert syncs.count("journal-write") == 1 and syncs.count("journal-fsync") == 1
    await w.close()
    lines = (tmp_path / "checkpoint.json.journal").read_bytes().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == list(range(1, 41))
    state, _ = load_checkpoint(tmp_path)
    assert list(state["ops"]) == [f"op-{i}" for i in range(40)]
