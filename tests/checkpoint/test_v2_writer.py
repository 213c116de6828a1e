"""Version 2 writer: D4 wire shape, atomic replacement, failure reporting."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from ckpt_support import CONFIG, PLAN, _disarm_faults, make_writer  # noqa: F401

from steerflow import _faults
from steerflow.checkpoint import load_checkpoint, result_digest
from steerflow.errors import PersistenceError
from waiting import wait_until_async


async def test_round_trip_field_by_field(tmp_path: Path) -> None:
    saved: list[tuple[str, str]] = []
    w = make_writer(tmp_path, flow_context={"seed": 1}, on_saved=lambda k, n: saved.append((k, n)))
    await w.flush()
    await w.record("research", status="completed", response="notes", flow_context={"a": [1]})
    await w.record("draft", status="failed", response={"error": "boom"})
    await w.record_spawned(
        "uuid-1",
        status="completed",
        response="fixed",
        operation="op",
        assignee="coder",
        instruction="fix it",
        parent_id="draft",
        spawn_id="fix-1",
        context={"k": "v"},
        emitter_workload="light",
    )
    await w.record_spawned("uuid-1", status="failed", response="again", spawn_id="fix-1")
    await w.record_spawned("uuid-2", status="pending", response=None, spawn_id="later")
    await w.close()

    raw = json.loads((tmp_path / "checkpoint.json").read_text())
    assert list(raw) == [
        "version", "session_id", "prompt", "plan", "flow_context", "ops", "spawned", "config",
        "max_spawn",
    ]  # fmt: skip
    state, report = load_checkpoint(tmp_path / "checkpoint.json")
    assert state == raw
    assert state["version"] == 2
    assert state["session_id"] == "0" * 32
    assert state["prompt"] == "do the thing"
    assert state["plan"] == PLAN
    assert state["config"] == CONFIG
    assert state["max_spawn"] == 20
    assert state["flow_context"] == {"a": [1]}  # None in the second record kept it
    assert state["ops"] == {
        "research": {
            "agent_id": "research",
            "status": "completed",
            "response": "notes",
            "result_digest": result_digest("notes"),
        },
        "draft": {
            "agent_id": "draft",
            "status": "failed",
            "response": {"error": "boom"},
            "result_digest": result_digest({"error": "boom"}),
        },
    }
    first, second = state["spawned"]
    assert first == {
        "node_id": "uuid-1",
        "status": "failed",
        "response": "again",
        "operation": None,
        "assignee": None,
        "instruction": None,
        "parent_id": None,
        "spawn_id": "fix-1",
        "context": None,
        "result_digest": result_digest("again"),
    }
    assert second["status"] == "pending" and second["response"] is None
    assert report["status"] == "clean" and report["checkpoint_version"] == 2
    assert report["generation"] is None and report["refusal"] is None
    assert w.persisted and w.error is None and w.records_acknowledged == 5
    assert saved[0] == ("flush", "") and saved[-1] == ("spawn", "uuid-2")
    assert os.listdir(tmp_path) == ["checkpoint.json"]
    assert (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600


async def test_extra_fields_and_empty_context_and_no_max_spawn(tmp_path: Path) -> None:
    w = make_writer(tmp_path, max_spawn=None, flow_context={"x": 1, "y": 2})
    await w.record_spawned("n", status="completed", response=1, emitter_workload={"w": 1})
    assert load_checkpoint(tmp_path)[0]["flow_context"] == {"x": 1, "y": 2}
    await w.record("research", status="completed", response="r", flow_context={})
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert "max_spawn" not in state
    assert state["flow_context"] == {}
    assert state["spawned"][0]["emitter_workload"] == {"w": 1}


async def test_normalizes_non_json_and_refuses_non_finite(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    await w.record("research", status="completed", response=("a", Path("/x")), flow_context={1: 2})  # type: ignore[dict-item]
    assert load_checkpoint(tmp_path)[0]["ops"]["research"]["response"] == ["a", "/x"]
    assert load_checkpoint(tmp_path)[0]["flow_context"] == {"1": 2}
    with pytest.raises(PersistenceError, match="non-finite"):
        await w.record("draft", status="completed", response=float("nan"))
    assert not w.persisted and w.error is not None
    with pytest.raises(ValueError, match="status"):
        await w.record("draft", status="done", response="x")
    await w.close()


async def test_live_context_mutation_after_record_is_not_persisted(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    ctx: dict[str, object] = {"items": [1]}
    pending = asyncio.ensure_future(
        w.record("research", status="completed", response="r", flow_context=ctx)
    )
    # The call has started: it was admitted synchronously at its first step.
    await wait_until_async(lambda: w.records_admitted >= 1, timeout=5, what="admission")
    ctx["items"].append(2)  # type: ignore[attr-defined]
    await pending
    await w.close()
    assert load_checkpoint(tmp_path)[0]["flow_context"] == {"items": [1]}


async def test_concurrent_records_all_land(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    await asyncio.gather(
        *(w.record(f"op-{i}", status="completed", response=i) for i in range(40)),
        *(w.record_spawned(f"n-{i}", status="completed", response=i) for i in range(10)),
    )
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert len(state["ops"]) == 40 and len(state["spawned"]) == 10
    assert w.records_acknowledged == 50


def loaded_since(seen: list[int], errors: list[BaseException], mark: int) -> Callable[[], bool]:
    """A probe: the reader failed, or finished a load it started after ``len(seen)`` was
    ``mark`` (the load then in progress finishes as ``mark + 1``)."""
    return lambda: bool(errors) or len(seen) >= mark + 2


def test_reader_never_sees_a_torn_file(tmp_path: Path) -> None:
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                state, _ = load_checkpoint(tmp_path)
                seen.append(len(state["ops"]))
            except Exception as exc:
                if "missing-checkpoint" not in str(exc):
                    errors.append(exc)

    async def writer() -> None:
        w = make_writer(tmp_path)
        mark = 0
        for i in range(200):
            await w.record(f"op-{i}", status="completed", response="x" * (i * 50))
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
    assert len(load_checkpoint(tmp_path)[0]["ops"]) == 200


@pytest.mark.parametrize(
    "point",
    ["eio:before:snapshot-write", "eio:after:snapshot-fsync", "enospc:before:snapshot-replace"],
)
async def test_failed_write_is_reported_and_previous_file_intact(
    tmp_path: Path, point: str
) -> None:
    w = make_writer(tmp_path)
    await w.record("research", status="completed", response="first")
    before = (tmp_path / "checkpoint.json").read_bytes()
    _faults.arm(point)
    with pytest.raises(PersistenceError, match="injected fault"):
        await w.record("draft", status="completed", response="second")
    _faults.disarm()
    assert not w.persisted and w.error is not None and "injected fault" in w.error
    assert (tmp_path / "checkpoint.json").read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.json"]  # the temporary was removed
    # v2 keeps going: the next snapshot carries everything admitted so far.
    await w.record_spawned("n", status="completed", response="third")
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"research", "draft"} and not w.persisted


def _read_only(path: Path, on: bool) -> None:
    """Make ``path`` refuse new entries, for root too (root ignores permission bits).

    As root the directory is made immutable (``chattr +i``, which binds root as well);
    on a file system without that flag the test cannot make the fault and says so.
    """
    if os.geteuid() != 0:
        os.chmod(path, 0o500 if on else 0o700)
        return
    done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    if done.returncode != 0 and on:
        pytest.skip(f"root, and chattr +i is refused here: {done.stderr.decode().strip()}")


async def test_read_only_directory(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    await w.flush()
    _read_only(tmp_path, True)
    try:
        with pytest.raises(PersistenceError):
            await w.record("research", status="completed", response="x")
    finally:
        _read_only(tmp_path, False)
    await w.close()
    assert not w.persisted


async def test_closed_writer_refuses(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    await w.close()
    with pytest.raises(PersistenceError, match="closed"):
        await w.record("research", status="completed", response="x")
