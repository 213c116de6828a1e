"""Version 3 writer: journal shape, order, compaction, identity and failure handling."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow import _faults
from steerflow.checkpoint import CheckpointWriter, load_checkpoint, result_digest
from steerflow.errors import PersistenceError
from waiting import wait_until_async

MEMBERS = {"version", "generation", "seq", "kind", "entry", "flow_context"}


def journal(run: Path) -> list[dict[str, Any]]:
    data = (run / "checkpoint.json.journal").read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(x) for x in data.splitlines()]


def base(run: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run / "checkpoint.json").read_text())
    return doc


async def test_round_trip_and_exact_record_shape(tmp_path: Path) -> None:
    ctx: dict[str, Any] = {"nested": {"entries": []}, "keep": 1}
    w = make_writer(tmp_path, version=3, flow_context=ctx)
    await w.flush()
    first = base(tmp_path)
    assert first["version"] == 3 and first["journal_seq"] == 0 and len(first["generation"]) == 32
    assert journal(tmp_path) == []
    ctx["nested"]["entries"].append("x")
    await w.record("research", status="completed", response="ok", flow_context=ctx)
    await w.record("draft", status="failed", response="err")  # no context update
    await w.record_spawned("n1", status="completed", response=[1], spawn_id="f", extra_field=True)
    await w.record("research", status="completed", response="again", flow_context={})
    lines = journal(tmp_path)
    assert [r["seq"] for r in lines] == [1, 2, 3, 4]
    assert {r["generation"] for r in lines} == {first["generation"]}
    assert lines[0] == {
        "version": 3,
        "generation": first["generation"],
        "seq": 1,
        "kind": "op",
        "entry": {
            "agent_id": "research",
            "status": "completed",
            "response": "ok",
            "result_digest": result_digest("ok"),
        },
        "flow_context": {"patch": [{"op": "add", "path": "/nested/entries/-", "value": "x"}]},
    }
    assert set(lines[1]) == MEMBERS - {"flow_context"}
    assert lines[2]["kind"] == "spawn" and lines[2]["entry"]["extra_field"] is True
    raw = (tmp_path / "checkpoint.json.journal").read_bytes().splitlines()[0]
    assert raw == json.dumps(lines[0], separators=(",", ":")).encode()
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and report["last_seq"] == 4
    assert state["flow_context"] == {}
    assert (
        state["ops"]["research"]["response"] == "again"
        and state["ops"]["draft"]["status"] == "failed"
    )
    assert state["spawned"][0]["spawn_id"] == "f"
    assert w.records_acknowledged == 4 and w.persisted
    await w.close()
    # The staging directory is removed at a clean close (issue 26): only the pair is left.
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "checkpoint.json.journal"]
    for name in ("checkpoint.json", "checkpoint.json.journal"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600


async def test_same_state_as_v2(tmp_path: Path) -> None:
    async def drive(w: CheckpointWriter) -> None:
        ctx: dict[str, Any] = {"a": {"b": [1, 2]}, "t": 1}
        for i in range(12):
            ctx["a"]["b"].append(i)
            ctx["t"] = [1, 1.0, True, None][i % 4]
            if i % 5 == 0:
                ctx.pop("gone", None)
            else:
                ctx["gone"] = {"k/~": i}
            await w.record(f"op-{i % 7}", status="completed", response={"i": i}, flow_context=ctx)
            await w.record_spawned(f"n-{i % 3}", status="completed", response=i, parent_id="x")
        await w.close()

    (tmp_path / "v2").mkdir()
    (tmp_path / "v3").mkdir()
    await drive(make_writer(tmp_path / "v2"))
    await drive(make_writer(tmp_path / "v3", version=3, max_records=5))
    s2, _ = load_checkpoint(tmp_path / "v2")
    s3, _ = load_checkpoint(tmp_path / "v3")
    assert s3.pop("version") == 3 and s3.pop("generation")
    assert s2.pop("version") == 2
    assert json.dumps(s2) == json.dumps(s3)  # same members, same order, same types


async def test_compaction_by_records(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=3)
    generations = set()
    for i in range(10):
        await w.record(f"op-{i}", status="completed", response=i, flow_context={"n": i})
        generations.add(base(tmp_path)["generation"])
        assert len(journal(tmp_path)) <= 3
    await w.close()
    assert len(generations) == 4  # initial + compactions before records 4, 7, 10
    assert [r["seq"] for r in journal(tmp_path)] == [1]
    state, report = load_checkpoint(tmp_path)
    assert len(state["ops"]) == 10 and state["flow_context"] == {"n": 9}
    assert report["status"] == "clean"
    assert ".checkpoint.json.staging" not in os.listdir(tmp_path)


async def test_compaction_by_bytes_never_exceeds_limit(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_bytes=2_000)
    for i in range(20):
        await w.record(f"op-{i}", status="completed", response="y" * 300)
        assert (tmp_path / "checkpoint.json.journal").stat().st_size <= 2_000
    await w.close()
    assert len(load_checkpoint(tmp_path)[0]["ops"]) == 20


async def test_oversize_transition_goes_into_base(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_bytes=1_000)
    await w.record("small", status="completed", response="s")
    gen = base(tmp_path)["generation"]
    await w.record("big", status="completed", response="z" * 5_000)
    assert base(tmp_path)["generation"] != gen
    assert base(tmp_path)["ops"]["big"]["response"] == "z" * 5_000
    assert journal(tmp_path) == []
    await w.record("after", status="completed", response="a")
    assert [r["seq"] for r in journal(tmp_path)] == [1]
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"small", "big", "after"}


async def test_admission_order_is_persistence_order(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=7)
    ctx: dict[str, Any] = {"log": []}
    calls = []
    for i in range(30):
        ctx["log"].append(i)
        if i % 2:
            calls.append(w.record(f"op-{i}", status="completed", response=i, flow_context=ctx))
        else:
            calls.append(
                w.record_spawned(f"n-{i}", status="completed", response=i, flow_context=ctx)
            )
    await asyncio.gather(*calls)
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert state["flow_context"] == {"log": list(range(30))}
    assert [e["node_id"] for e in state["spawned"]] == [f"n-{i}" for i in range(0, 30, 2)]
    assert w.records_acknowledged == 30


async def test_cancelled_caller_still_persisted_in_order(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.flush()
    admitted = w.records_admitted + 5
    tasks = [
        asyncio.ensure_future(w.record(f"op-{i}", status="completed", response=i)) for i in range(5)
    ]
    await wait_until_async(lambda: w.records_admitted == admitted, timeout=5, what="admission")
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await w.close()
    assert isinstance(results[1], asyncio.CancelledError) or results[1] is None
    state, _ = load_checkpoint(tmp_path)
    assert list(state["ops"]) == [f"op-{i}" for i in range(5)]


async def test_second_writer_is_refused(tmp_path: Path) -> None:
    w1 = make_writer(tmp_path, version=3)
    await w1.flush()
    w2 = make_writer(tmp_path, version=3)
    with pytest.raises(PersistenceError, match="another writer"):
        await w2.flush()
    await w1.record("a", status="completed", response=1)
    await w1.close()
    await w2.close()


async def test_foreign_occupant_is_quarantined_not_destroyed(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text("sentinel")
    w = make_writer(tmp_path, version=3)
    await w.flush()
    await w.close()
    staging = tmp_path / ".checkpoint.json.staging"
    kept = [p for p in staging.iterdir() if p.name.startswith("quarantine.checkpoint.json.")]
    assert len(kept) == 1 and kept[0].read_text() == "sentinel"


async def test_a_writer_whose_staging_was_removed_under_it_makes_a_new_one(
    tmp_path: Path,
) -> None:
    """The staging directory goes at a clean close (issue 26). A writer that opened it just
    before must not lock the removed directory and call itself the only writer: it makes
    a new one, so a third writer is still refused."""
    first = make_writer(tmp_path, version=3)
    await first.flush()
    second = make_writer(tmp_path, version=3)
    opened = []

    def close_first_meanwhile(step: str, when: str) -> None:
        # On the second writer's thread, after it opened the staging directory and
        # before it locks it: the first writer closes and removes that directory.
        if (step, when) == ("staging-create", "after") and not opened:
            opened.append(True)
            first._backend.close()  # type: ignore[attr-defined]

    previous = _faults.set_fault_hook(close_first_meanwhile)
    try:
        await second.record("a", status="completed", response=1)
    finally:
        _faults.set_fault_hook(previous)
    assert opened and (tmp_path / ".checkpoint.json.staging").is_dir()
    third = make_writer(tmp_path, version=3)
    with pytest.raises(PersistenceError, match="another writer"):
        await third.flush()
    await second.close()
    # The first writer's pair, displaced by the second's, is quarantined there (never
    # destroyed), so this staging directory is not empty and stays.
    kept = os.listdir(tmp_path / ".checkpoint.json.staging")
    assert len(kept) == 2 and all(name.startswith("quarantine.") for name in kept), kept
    state, _ = load_checkpoint(tmp_path)
    assert state["ops"]["a"]["response"] == 1


async def test_a_staging_directory_that_is_not_empty_is_kept(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.flush()
    left = tmp_path / ".checkpoint.json.staging" / "someone-elses-file"
    left.write_text("kept")
    await w.close()
    assert left.read_text() == "kept"


@pytest.mark.parametrize("fault", ["eio:before:journal-write", "eio:after:journal-fsync"])
async def test_uncertain_append_stops_the_writer(tmp_path: Path, fault: str) -> None:
    w = make_writer(tmp_path, version=3)
    await w.record("a", status="completed", response=1)
    _faults.arm(fault)
    with pytest.raises(PersistenceError, match="injected"):
        await w.record("b", status="completed", response=2)
    _faults.disarm()
    with pytest.raises(PersistenceError, match="stopped"):
        await w.record("c", status="completed", response=3)
    assert not w.persisted and w.error is not None and w.records_acknowledged == 1
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert "a" in state["ops"] and "c" not in state["ops"]


async def test_substituted_journal_gets_no_bytes(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.record("a", status="completed", response=1)
    jpath = tmp_path / "checkpoint.json.journal"
    os.rename(jpath, tmp_path / "moved-away")
    jpath.write_text("")  # a different regular file now holds the name
    with pytest.raises(PersistenceError, match="no longer names the journal"):
        await w.record("b", status="completed", response="SECRET")
    assert jpath.read_text() == ""
    assert b"SECRET" not in (tmp_path / "moved-away").read_bytes()
    await w.close()


async def test_substitution_right_after_creation_is_detected(tmp_path: Path) -> None:
    """Swap the published journal name between publication and the first append."""

    def hook(step: str, when: str) -> None:
        if (step, when) == ("journal-exchange", "after"):
            os.rename(tmp_path / "checkpoint.json.journal", tmp_path / "ours")
            os.symlink(tmp_path / "victim", tmp_path / "checkpoint.json.journal")

    (tmp_path / "victim").write_text("victim")
    _faults.set_fault_hook(hook)
    w = make_writer(tmp_path, version=3)
    with pytest.raises(PersistenceError):
        await w.record("a", status="completed", response="SECRET")
    _faults.disarm()
    assert (tmp_path / "victim").read_text() == "victim"
    await w.close()


def loaded_since(seen: list[int], errors: list[BaseException], mark: int) -> Callable[[], bool]:
    """A probe: the reader failed, or finished a load it started after ``len(seen)`` was
    ``mark`` (the load then in progress finishes as ``mark + 1``)."""
    return lambda: bool(errors) or len(seen) >= mark + 2


@pytest.mark.parametrize("version", [3, 4])
def test_reader_sees_coherent_state_during_compactions(
    tmp_path: Path, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 4 (decision 340) with a segment fanout of 2: merges unlink segments an
    older manifest named while the reader may be reading it; it must read again."""
    from steerflow.checkpoint import _v4

    monkeypatch.setattr(_v4, "SEGMENT_FANOUT", 2)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                state, report = load_checkpoint(tmp_path)
            except Exception as exc:
                if "missing-checkpoint" not in str(exc):
                    errors.append(exc)
                continue
            count = len(state["ops"])
            expected = {"n": count - 1} if count else {}
            # Between a compaction's base publication and its journal reset the old
            # journal's records are stale: counted, never applied.
            if state["flow_context"] != expected or report["discarded_tail_bytes"]:
                errors.append(AssertionError((count, state["flow_context"], report)))
            seen.append(count)

    async def writer() -> None:
        w = make_writer(tmp_path, version=version, max_records=4)
        mark = 0
        for i in range(150):
            await w.record(f"op-{i}", status="completed", response=i, flow_context={"n": i})
            if i % 5 == 4:
                # A load started since the previous stop: loads two stops apart differ,
                # however the scheduler treats the reader (usually no wait at all).
                await wait_until_async(loaded_since(seen, errors, mark), timeout=60, what="a load")
                mark = len(seen)
        await w.close()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        asyncio.run(writer())
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert seen == sorted(seen) and len(set(seen)) > 10


async def test_single_add_line_bound(tmp_path: Path) -> None:
    big = {"nested": {"entries": [f"v{i}" for i in range(10_000)]}}
    w = make_writer(tmp_path, version=3, flow_context=big)
    await w.flush()
    big["nested"]["entries"].append("new-item")
    await w.record("a", status="completed", response="r", flow_context=big)
    await w.close()
    line_bytes = (tmp_path / "checkpoint.json.journal").read_bytes()
    entry = journal(tmp_path)[0]["entry"]
    e = len(json.dumps(entry, separators=(",", ":")))
    u, p = len(json.dumps("new-item")), len(json.dumps("/nested/entries/-"))
    assert len(line_bytes) <= e + u + p + 256


async def test_substituted_temporary_source_is_detected(tmp_path: Path) -> None:
    """Replace our named temporary in staging just before the exchange publishes it."""
    staging = tmp_path / ".checkpoint.json.staging"
    swapped: list[str] = []

    def hook(step: str, when: str) -> None:
        if (step, when) == ("base-exchange", "before") and not swapped:
            (temp,) = [p for p in staging.iterdir() if p.name.endswith(".tmp")]
            os.rename(temp, tmp_path / "ours-moved")
            temp.write_text("impostor")
            swapped.append(temp.name)

    w = make_writer(tmp_path, version=3, max_records=3)
    await w.flush()
    _faults.set_fault_hook(hook)
    for i in range(3):
        await w.record(f"op-{i}", status="completed", response="r")
    with pytest.raises(PersistenceError, match="does not hold the file"):
        await w.record("op-3", status="completed", response="SECRET")  # 4th: compaction
    _faults.disarm()
    assert swapped
    assert "impostor" in (tmp_path / "checkpoint.json").read_text()  # published, but detected
    assert b"SECRET" not in (tmp_path / "checkpoint.json.journal").read_bytes()
    with pytest.raises(PersistenceError, match="stopped"):
        await w.record("op-4", status="completed", response="r")
    await w.close()


async def test_substituted_base_blocks_acknowledgement(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.record("a", status="completed", response=1)
    (tmp_path / "sentinel").write_text("keep me")
    os.replace(tmp_path / "sentinel", tmp_path / "checkpoint.json")
    with pytest.raises(PersistenceError, match="no longer names the base"):
        await w.record("b", status="completed", response="SECRET")
    assert b"SECRET" not in (tmp_path / "checkpoint.json.journal").read_bytes()
    assert (tmp_path / "checkpoint.json").read_text() == "keep me"
    await w.close()


async def test_nested_mutation_during_persistence(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=2)
    ctx: dict[str, Any] = {"a": {"b": [1]}}
    first = asyncio.ensure_future(w.record("x", status="completed", response=1, flow_context=ctx))
    admitted = w.records_admitted + 1
    await wait_until_async(lambda: w.records_admitted == admitted, timeout=5, what="admission")
    ctx["a"]["b"].append(2)  # after admission: belongs to the next record only
    ctx["a"]["c"] = {"d": None}
    await first
    assert load_checkpoint(tmp_path)[0]["flow_context"] == {"a": {"b": [1]}}
    await w.record("y", status="completed", response=2, flow_context=ctx)
    del ctx["a"]["c"]
    ctx["a"]["b"][0] = 1.0  # a scalar type change is a change
    await w.record("z", status="completed", response=3, flow_context=ctx)
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert json.dumps(state["flow_context"]) == json.dumps({"a": {"b": [1.0, 2]}})


@pytest.mark.parametrize("missing", ["o_tmpfile", "renameat2", "both"])
async def test_platform_fallbacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    from steerflow.checkpoint import _io

    if missing in ("o_tmpfile", "both"):
        monkeypatch.setattr(_io, "create_tmpfile", lambda *a, **k: None)
    if missing in ("renameat2", "both"):
        monkeypatch.setattr(_io, "_renameat2_func", lambda: None)
    w = make_writer(tmp_path, version=3, max_records=2)
    for i in range(5):
        await w.record(f"op-{i}", status="completed", response=i, flow_context={"i": i})
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert len(state["ops"]) == 5 and state["flow_context"] == {"i": 4}
    assert report["status"] == "clean"
    assert ".checkpoint.json.staging" not in os.listdir(tmp_path)
