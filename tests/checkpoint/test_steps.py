"""Steps of a tool node's loop in the version 3 journal (issue 39 item 3, decision 254).

Each step is one journal record covered by its own digest: a model reply (closing the
write-ahead intent of its request), a tool call before it starts (``in_flight``) and the
same index again when it ended. Steps survive compaction in the base's ``steps``; a
deleted, reordered, repeated or altered step is refused, never folded.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from steerflow.checkpoint import (
    CheckpointRecoveryError,
    CheckpointWriter,
    load_checkpoint,
    load_state,
)


def _writer(path: Path, version: int = 3, **kw: Any) -> CheckpointWriter:
    return CheckpointWriter(path / "checkpoint.json", session_id="0" * 32, prompt="p", plan=[],
                            config={}, version=version, **kw)  # fmt: skip


def _step(index: int, type_: str, call_id: str, status: str = "completed", **data: Any) -> dict:
    return {"node": "a", "record": "op", "key": "a", "index": index, "type": type_,
            "call_id": call_id, "status": status, "data": data}  # fmt: skip


async def _loop(w: CheckpointWriter, *, finish: bool) -> str:
    """Model asks for a tool, the tool runs; optionally the tool's end and a final reply."""
    intent = uuid.uuid4().hex
    await w.record_call(intent, node="a", record="op", key="a", attempt=1, model="script:x",
                        started_at=1.0, reserved_cost_usd=0.01, reserved_tokens=10)  # fmt: skip
    calls = [{"call_id": "call_1_1", "name": "add", "args": {"x": 1}}]
    await w.record_step(_step(1, "model", intent, text="", tool_calls=calls))
    await w.record_step(_step(2, "tool", "call_1_1", "in_flight", tool="add", args={"x": 1}))
    if finish:
        await w.record_step(_step(2, "tool", "call_1_1", tool="add", args={"x": 1}, result="2"))
    return intent


def test_steps_are_folded_in_order_and_a_model_step_closes_its_intent(tmp_path: Path) -> None:
    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        await _loop(w, finish=True)
        await w.close()

    asyncio.run(go())
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert "in_flight" not in state  # the reply closed its request's intent
    assert [(s["index"], s["type"], s["status"]) for s in state["steps"]] == [
        (1, "model", "completed"),
        (2, "tool", "completed"),
    ]
    typed, _ = load_state(tmp_path)
    assert typed.steps[1]["data"]["result"] == "2"


def test_a_tool_call_left_in_flight_stays_in_flight_across_compaction(tmp_path: Path) -> None:
    async def go() -> None:
        w = _writer(tmp_path, max_records=1)
        await w.flush()
        await _loop(w, finish=False)
        await w.record("b", status="completed", response="B")  # compacts: the base holds steps
        await w.record("c", status="completed", response="C")
        await w.close()

    asyncio.run(go())
    base = json.loads((tmp_path / "checkpoint.json").read_bytes())
    assert [s["status"] for s in base["steps"]] == ["completed", "in_flight"]
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert state["steps"][-1]["status"] == "in_flight"


def _journal_lines(tmp_path: Path) -> list[dict[str, Any]]:
    journal = next(p for p in tmp_path.iterdir() if p.name.endswith(".journal"))
    return [json.loads(line) for line in journal.read_bytes().splitlines()]


def _rewrite(tmp_path: Path, records: list[dict[str, Any]]) -> None:
    journal = next(p for p in tmp_path.iterdir() if p.name.endswith(".journal"))
    data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
    journal.write_bytes(data)


def _written(tmp_path: Path) -> list[dict[str, Any]]:
    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        await _loop(w, finish=True)
        await w.record("z", status="completed", response="Z")
        await w.close()

    asyncio.run(go())
    return _journal_lines(tmp_path)


def _steps_at(records: list[dict[str, Any]]) -> list[int]:
    return [i for i, r in enumerate(records) if r["kind"] == "step"]


@pytest.mark.parametrize("mutation", ["alter-result", "alter-args", "delete", "reorder"])
def test_a_mutated_step_is_refused_and_the_files_are_left_as_they_were(
    tmp_path: Path, mutation: str
) -> None:
    records = _written(tmp_path)
    at = _steps_at(records)
    if mutation == "alter-result":
        records[at[-1]]["entry"]["data"]["result"] = "3"
    elif mutation == "alter-args":
        records[at[1]]["entry"]["data"]["args"] = {"x": 2}
    elif mutation == "delete":  # the model step goes; seqs stay contiguous
        records.pop(at[0])
        for seq, record in enumerate(records, start=1):
            record["seq"] = seq
    else:  # the tool's in-flight record before the reply that asked for it
        records[at[0]]["entry"], records[at[1]]["entry"] = (
            records[at[1]]["entry"],
            records[at[0]]["entry"],
        )
    _rewrite(tmp_path, records)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CheckpointRecoveryError, match="step"):
        load_checkpoint(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_step_is_checked_before_it_is_written_and_version_2_records_none(
    tmp_path: Path,
) -> None:
    async def go() -> bool:
        w = _writer(tmp_path, version=2)
        await w.flush()
        with pytest.raises(ValueError, match="only once it completed"):
            await w.record_step(_step(1, "model", "x" * 32, status="in_flight"))
        wrote = await w.record_step(_step(1, "model", "x" * 32))
        await w.close()
        return wrote

    assert asyncio.run(go()) is False
    assert "steps" not in load_checkpoint(tmp_path)[0]


def _approved(tmp_path: Path) -> list[dict[str, Any]]:
    """A model reply, the approval request and its decision (issue 41), then the call."""

    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        intent = uuid.uuid4().hex
        await w.record_call(intent, node="a", record="op", key="a", attempt=1, model="script:x",
                            started_at=1.0, reserved_cost_usd=0.01, reserved_tokens=10)  # fmt: skip
        calls = [{"call_id": "call_1_1", "name": "post", "args": {"m": "hi"}}]
        await w.record_step(_step(1, "model", intent, text="", tool_calls=calls))
        request = {"request_id": "apr_1", "tool": "post", "args": {"m": "hi"}}
        await w.record_step(_step(2, "approval", "call_1_1", "awaiting", **request))
        decision = {"verdict": "approved", "sender": "cli:op@h:1", "control_id": "c1"}
        await w.record_step(_step(2, "approval", "call_1_1", "approved", **request, **decision))
        await w.record_step(
            _step(3, "tool", "call_1_1", "in_flight", tool="post", args={"m": "hi"})
        )
        await w.record("z", status="completed", response="Z")
        await w.close()

    asyncio.run(go())
    return _journal_lines(tmp_path)


def test_an_approval_and_its_decision_are_steps_covered_by_the_digest(tmp_path: Path) -> None:
    _approved(tmp_path)
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert [(s["index"], s["type"], s["status"]) for s in state["steps"]] == [
        (1, "model", "completed"), (2, "approval", "approved"), (3, "tool", "in_flight"),
    ]  # fmt: skip


@pytest.mark.parametrize("mutation", ["alter-sender", "approve-a-denial", "second-decision"])
def test_a_tampered_approval_is_refused(tmp_path: Path, mutation: str) -> None:
    records = _approved(tmp_path)
    at = _steps_at(records)
    decided = records[at[2]]["entry"]
    if mutation == "alter-sender":
        decided["data"]["sender"] = "cli:someone-else@h:1"
    elif mutation == "approve-a-denial":
        decided["status"] = "denied"
    else:  # a decision recorded again, differently, after the call began
        again = json.loads(json.dumps(records[at[2]]))
        again["entry"]["status"] = "denied"
        records.insert(at[3] + 1, again)
        for seq, record in enumerate(records, start=1):
            record["seq"] = seq
    _rewrite(tmp_path, records)
    with pytest.raises(CheckpointRecoveryError, match="step"):
        load_checkpoint(tmp_path)
