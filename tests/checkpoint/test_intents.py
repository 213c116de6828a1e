"""Write-ahead call intents in the version 3 journal (issue 38 item 1, decision 217).

An intent is acknowledged before its call leaves; the outcome of its node closes it;
one left open is listed by the loader as ``in_flight`` (and typed as
``CheckpointState.in_flight``). It is covered by its own digest, never counted against
``max_records``, and carried by every base published while it is open.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
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


async def _call(w: CheckpointWriter, node: str, record: str = "op", key: str | None = None,
                cost: float | None = 0.002) -> str:  # fmt: skip
    call_id = uuid.uuid4().hex
    await w.record_call(call_id, node=node, record=record, key=key or node, attempt=1,
                        model="openai/m", started_at=1700000000.5, reserved_cost_usd=cost,
                        reserved_tokens=150)  # fmt: skip
    return call_id


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_an_outcome_closes_its_nodes_intents_and_the_rest_stay_in_flight(tmp_path: Path) -> None:
    async def go() -> dict[str, str]:
        w = _writer(tmp_path)
        await w.flush()
        ids = {n: await _call(w, n) for n in ("a", "b", "c")}
        ids["s"] = await _call(w, "s1", record="spawn", key="node-s")
        await w.record("a", status="completed", response="A")
        await w.record("b", status="failed", response={"error": "x"})
        await w.record_spawned("node-s", status="pending", response=None)  # intent, not outcome
        await w.close()
        return ids

    ids = _run(go())
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and report["records_applied"] == 7
    flying = state["in_flight"]
    assert [f["call_id"] for f in flying] == [ids["c"], ids["s"]]
    assert flying[0] == {
        "call_id": ids["c"], "type": "call", "node": "c", "record": "op", "key": "c",
        "attempt": 1, "model": "openai/m", "started_at": 1700000000.5,
        "reserved_cost_usd": 0.002, "reserved_tokens": 150,
        "result_digest": flying[0]["result_digest"],
    }  # fmt: skip
    typed, _ = load_state(tmp_path)
    assert [c.node for c in typed.in_flight] == ["c", "s1"]
    assert typed.in_flight[0].to_json()["reserved_cost_usd"] == 0.002


def test_intents_are_not_counted_by_max_records_and_bases_carry_the_open_ones(
    tmp_path: Path,
) -> None:
    async def go() -> CheckpointWriter:
        w = _writer(tmp_path, max_records=2)
        await w.flush()
        for n in ("a", "b", "c", "d", "e"):
            await _call(w, n)
        await w.record("a", status="completed", response="A")
        await w.record("b", status="completed", response="B")  # 2 outcomes, 7 lines
        await w.record("c", status="completed", response="C")  # compacts first
        await w.close()
        return w

    _run(go())
    base = json.loads((tmp_path / "checkpoint.json").read_text())
    assert [i["node"] for i in base["in_flight"]] == ["c", "d", "e"]  # c's outcome is after
    journal = (tmp_path / "checkpoint.json.journal").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in journal] == ["op"]
    state, _ = load_checkpoint(tmp_path)
    assert [i["node"] for i in state["in_flight"]] == ["d", "e"]


def test_version_2_records_no_intent(tmp_path: Path) -> None:
    async def go() -> bool:
        w = _writer(tmp_path, version=2)
        await w.flush()
        done = await _call_v2(w)
        await w.close()
        return done

    assert _run(go()) is False
    state, _ = load_checkpoint(tmp_path)
    assert "in_flight" not in state


async def _call_v2(w: CheckpointWriter) -> bool:
    return await w.record_call(uuid.uuid4().hex, node="a", record="op", key="a", attempt=1,
                               model=None, started_at=1.0)  # fmt: skip


def test_a_malformed_intent_is_refused_when_recorded(tmp_path: Path) -> None:
    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        with pytest.raises(ValueError, match="call_id"):
            await w.record_call("nothex", node="a", record="op", key="a", attempt=1,
                                model=None, started_at=1.0)  # fmt: skip
        with pytest.raises(ValueError, match="attempt"):
            await w.record_call(uuid.uuid4().hex, node="a", record="op", key="a", attempt=0,
                                model=None, started_at=1.0)  # fmt: skip
        await w.close()

    _run(go())


# -- the mutation families: every one refused, naming the call, the checkpoint untouched --


def _journal_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (path / "checkpoint.json.journal").read_text().splitlines()]


def _write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    (path / "checkpoint.json.journal").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    )


def _alter(field: str, value: object) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(records: list[dict[str, Any]]) -> None:
        records[0]["entry"][field] = value

    return mutate


def _add_context(records: list[dict[str, Any]]) -> None:
    records[0]["flow_context"] = {"patch": []}


def _repeat(records: list[dict[str, Any]]) -> None:
    """The same call id again with another reservation (its digest made to match)."""
    from steerflow.checkpoint._intents import intent_digest

    again = {**records[0]["entry"], "reserved_cost_usd": 0.0}
    again["result_digest"] = intent_digest(again)
    records.insert(1, {**records[0], "seq": 2, "entry": again})
    for n, r in enumerate(records, 1):
        r["seq"] = n


def _drop_digest(records: list[dict[str, Any]]) -> None:
    del records[0]["entry"]["result_digest"]


def _unknown_member(records: list[dict[str, Any]]) -> None:
    records[0]["entry"]["paid"] = True


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (_alter("reserved_cost_usd", 0.0), "result_digest does not match"),
        (_alter("node", "b"), "result_digest does not match"),
        (_alter("model", "openai/cheap"), "result_digest does not match"),
        (_alter("reserved_tokens", -1), "reserved_tokens"),
        (_alter("type", "tool"), "type"),
        (_add_context, "carries flow_context"),
        (_repeat, "recorded twice, differently"),
        (_drop_digest, "lacks"),
        (_unknown_member, "unknown members"),
    ],
    ids=["cost", "node", "model", "tokens", "type", "context", "repeat", "digest", "member"],
)
def test_an_altered_intent_is_refused_naming_it(
    tmp_path: Path, mutate: Callable[[list[dict[str, Any]]], None], reason: str
) -> None:
    async def go() -> str:
        w = _writer(tmp_path)
        await w.flush()
        call_id = await _call(w, "a")
        await _call(w, "b")
        await w.close()
        return call_id

    call_id = _run(go())
    records = _journal_lines(tmp_path)
    mutate(records)
    _write_lines(tmp_path, records)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(CheckpointRecoveryError) as caught:
        load_checkpoint(tmp_path)
    message = str(caught.value)
    assert reason in message, message
    refusal = caught.value.report["refusal"]
    assert refusal["file"] == "checkpoint.json.journal"
    if reason != "recorded twice, differently":
        assert refusal["reason"] == "invalid-intent" and refusal["seq"] == 1
        assert f"(call_id {call_id!r})" in message or "node" in message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    ("value", "detail"),
    [([], "non-empty list"), ({"a": 1}, "non-empty list"), ([{"call_id": "x"}], "unknown")],
    ids=["empty", "object", "malformed"],
)
def test_a_base_with_a_bad_in_flight_member_is_refused(
    tmp_path: Path, value: object, detail: str
) -> None:
    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        await w.close()

    _run(go())
    base_path = tmp_path / "checkpoint.json"
    base = json.loads(base_path.read_text())
    base["in_flight"] = value
    base_path.write_text(json.dumps(base))
    with pytest.raises(CheckpointRecoveryError) as caught:
        load_checkpoint(tmp_path)
    assert caught.value.report["refusal"]["file"] == "checkpoint.json"
    assert caught.value.report["refusal"]["reason"] in ("invalid-base", "invalid-intent")


def test_a_deleted_outcome_leaves_its_intent_open_or_is_refused(tmp_path: Path) -> None:
    """Deleting a record is a sequence gap (refused); deleting the tail (a torn append)
    leaves the call in flight, which counts it as spent: never silently free."""

    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        await _call(w, "a")
        await w.record("a", status="completed", response="A")
        await _call(w, "b")
        await w.record("b", status="completed", response="B")
        await w.close()

    _run(go())
    records = _journal_lines(tmp_path)
    _write_lines(tmp_path, records[:1] + records[2:])
    with pytest.raises(CheckpointRecoveryError, match="sequence-gap"):
        load_checkpoint(tmp_path)
    _write_lines(tmp_path, records[:3])
    state, _ = load_checkpoint(tmp_path)
    assert [i["node"] for i in state["in_flight"]] == ["b"] and "b" not in state["ops"]


def test_an_intent_written_again_after_a_reconciliation_is_one_call_and_a_closed_one_is_refused(
    tmp_path: Path,
) -> None:
    """A retry after an uncertain write records the same intent twice: one call. The same
    intent after its node's outcome would reopen a call that ended: refused."""

    async def go() -> None:
        w = _writer(tmp_path)
        await w.flush()
        await _call(w, "a")
        await w.record("a", status="completed", response="A")
        await w.close()

    _run(go())
    intent, outcome = _journal_lines(tmp_path)
    _write_lines(tmp_path, [intent, {**intent, "seq": 2}])
    state, _ = load_checkpoint(tmp_path)
    assert [i["node"] for i in state["in_flight"]] == ["a"]
    _write_lines(tmp_path, [intent, {**outcome, "seq": 2}, {**intent, "seq": 3}])
    with pytest.raises(CheckpointRecoveryError, match="closed is recorded again"):
        load_checkpoint(tmp_path)
