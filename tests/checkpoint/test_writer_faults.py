"""Injected I/O errors at every seam: no false acknowledgement, refusal, then reconcile."""

from __future__ import annotations

import asyncio
import copy
import re
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

import steerflow.checkpoint as checkpoint
from steerflow import _faults
from steerflow.checkpoint import load_checkpoint
from steerflow.errors import PersistenceError

RECORDS = 9


async def workload(run: Path, version: int = 3) -> tuple[list[str], dict[str, Any], int]:
    """Record RECORDS outcomes; on failure check refusal, reconcile, continue.

    Returns the acknowledged names, the context at the last acknowledgement, and how
    many failures were seen.
    """
    w = make_writer(run, version=version, flow_context={"log": []}, max_records=3, max_bytes=900)
    ctx: dict[str, Any] = {"log": []}
    acked: list[str] = []
    last_ctx: dict[str, Any] = {"log": []}
    failures = 0
    for i in range(RECORDS):
        ctx["log"].append(i)
        name = f"op{i}"
        response = "x" * 1200 if i == 5 else f"r{i}"
        try:
            await w.record(name, status="completed", response=response, flow_context=ctx)
        except PersistenceError:
            failures += 1
            _faults.disarm()
            with pytest.raises(PersistenceError, match="stopped"):
                await w.record("refused", status="completed", response=0)
            await w.reconcile()
            continue
        acked.append(name)
        last_ctx = copy.deepcopy(ctx)
    try:
        await w.close()
    except PersistenceError:
        failures += 1  # a close failure is surfaced, never swallowed
    if not w.persisted and not failures:
        failures = 1  # failed after its batch was acknowledged: recorded, nobody lost
    return acked, last_ctx, failures


def seam_points(version: int = 3) -> list[tuple[str, int]]:
    hits: dict[str, int] = {}

    def hook(step: str, when: str) -> None:
        if step != "ack":
            hits[f"{when}:{step}"] = hits.get(f"{when}:{step}", 0) + 1

    import tempfile

    _faults.set_fault_hook(hook)
    try:
        with tempfile.TemporaryDirectory() as run:
            asyncio.run(workload(Path(run), version))
    finally:
        _faults.set_fault_hook(None)
    return sorted(hits.items())


def _inject(tmp_path: Path, cases: list[str], version: int) -> tuple[list[str], int]:
    """Run the workload once per case; (problems, cases that did fail)."""
    problems = []
    injected = 0
    for index, case in enumerate(cases):
        run = tmp_path / f"run{index}"
        run.mkdir()
        _faults.arm(case)
        acked, last_ctx, failures = asyncio.run(workload(run, version))
        _faults.disarm()
        injected += failures > 0
        state, report = load_checkpoint(run)
        names = set(state["ops"])
        if not set(acked) <= names:
            problems.append(f"{case}: lost {sorted(set(acked) - names)}")
        elif acked and acked[-1] == f"op{RECORDS - 1}" and state["flow_context"] != last_ctx:
            problems.append(f"{case}: context {state['flow_context']} != {last_ctx}")
        elif report["status"] == "refused":
            problems.append(f"{case}: {report}")
    return problems, injected


def test_error_at_every_seam_is_refused_then_reconciled(tmp_path: Path) -> None:
    cases = [
        f"eio:{point}:{nth}"
        for point, count in seam_points()
        for nth in sorted({1, (count + 1) // 2, count})
    ]
    problems, injected = _inject(tmp_path, cases, 3)
    assert problems == [], "\n".join(problems)
    assert len(cases) > 40 and injected == len(cases)


def _v4_cases(new_files_only: bool) -> list[str]:
    points = seam_points(4)
    if new_files_only:  # the default run: each new file's step once, at its last hit
        return [
            f"eio:{point}:{count}"
            for point, count in points
            if point.startswith("after:")
            and point.split(":")[1].startswith(("segment-", "manifest-"))
        ]
    return [f"eio:{p}:{nth}" for p, count in points for nth in sorted({1, (count + 1) // 2, count})]


def test_v4_error_at_each_new_file_seam_is_refused_then_reconciled(tmp_path: Path) -> None:
    """Version 4 (decision 340): an I/O error at a segment or manifest step stops the
    writer; reconciliation folds the durable prefix through its pins and goes on."""
    cases = _v4_cases(True)
    problems, injected = _inject(tmp_path, cases, 4)
    assert problems == [], "\n".join(problems)
    assert len(cases) >= 10 and injected == len(cases)


@pytest.mark.slow
def test_v4_error_at_every_seam_is_refused_then_reconciled(tmp_path: Path) -> None:
    cases = _v4_cases(False)
    problems, injected = _inject(tmp_path, cases, 4)
    assert problems == [], "\n".join(problems)
    assert len(cases) > 40 and injected == len(cases)


async def test_reconcile_keeps_complete_unacknowledged_line(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3)
    await w.record("a", status="completed", response=1, flow_context={"k": 1})
    _faults.arm("eio:after:journal-write")  # the line is complete on disk, never acked
    with pytest.raises(PersistenceError):
        await w.record("b", status="completed", response=2, flow_context={"k": 2})
    _faults.disarm()
    await w.reconcile()
    await w.record("c", status="completed", response=3, flow_context={"k": 3, "z": [1]})
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"a", "b", "c"}
    assert state["flow_context"] == {"k": 3, "z": [1]} and report["status"] == "clean"
    assert not w.persisted  # history of the failure is kept


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


async def test_v2_reconcile_is_a_no_op(tmp_path: Path) -> None:
    w = make_writer(tmp_path)
    await w.record("a", status="completed", response=1, flow_context={"k": 1})
    before = _files(tmp_path)
    assert "checkpoint.json" in before
    await w.reconcile()
    assert _files(tmp_path) == before
    assert w.persisted and w.error is None
    await w.close()
    state, _ = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"a"} and state["flow_context"] == {"k": 1}


def test_fault_spec_parsing() -> None:
    specs, cap = _faults.parse("exit:after:journal-fsync, eio:before:base-exchange:2,short-write:7")
    assert [(s.action, s.point, s.nth) for s in specs] == [
        ("exit", "after:journal-fsync", None),
        ("eio", "before:base-exchange", 2),
    ]
    assert cap == 7
    for bad in ("boom:after:x", "exit:during:x", "exit:after", "short-write:0"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            _faults.parse(bad)


def test_nth_hit_only() -> None:
    _faults.arm("eio:before:probe:2")
    _faults.seam("probe", "before")
    with pytest.raises(OSError, match="injected fault at before:probe"):
        _faults.seam("probe", "before")
    _faults.seam("probe", "before")


def test_public_exports_are_pinned() -> None:
    def isort_key(name: str) -> tuple[bool, bool, str]:  # constants, classes, functions
        return (not name.isupper(), not name[0].isupper(), name)

    assert checkpoint.__all__ == sorted(checkpoint.__all__, key=isort_key)
    assert set(checkpoint.__all__) == {
        "BRANCHES_DIR",
        "CHECKPOINT_FILENAME",
        "JOURNAL_FILENAME",
        "CheckpointRecoveryError",
        "CheckpointState",
        "CheckpointWriter",
        "InFlightCall",
        "LoadedCheckpoint",
        "PlannedEntry",
        "SavedHook",
        "SpawnedEntry",
        "context_problem",
        "entry_digest",
        "load_branch",
        "load_checkpoint",
        "load_state",
        "result_digest",
        "save_branch",
    }
    assert checkpoint.CHECKPOINT_FILENAME == "checkpoint.json"
    assert checkpoint.JOURNAL_FILENAME == "checkpoint.json.journal"


async def test_v4_two_failures_never_retire_a_named_segment(tmp_path: Path) -> None:
    """An initialization that failed after writing its meta segment, then a failed
    compaction: the reconciliation retires only segments no manifest names (the meta
    segment the retried initialization published is kept), and the unit loads whole."""
    _faults.arm("eio:before:manifest-write:1,eio:before:manifest-write:3")
    w = make_writer(tmp_path, version=4, max_records=1)
    acked: list[str] = []
    for i in range(6):
        try:
            await w.record(f"op{i}", status="completed", response=f"r{i}")
            acked.append(f"op{i}")
        except PersistenceError:
            await w.reconcile()
    _faults.disarm()
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and report["checkpoint_version"] == 4
    assert set(acked) <= set(state["ops"]) and len(acked) >= 4


async def test_v4_a_failed_reconciliation_can_be_retried(tmp_path: Path) -> None:
    """A full disk: a record fails, its reconciliation fails too (its new segment cannot
    be written), then space returns and a second reconciliation folds the same durable
    prefix. The first one must not have forgotten the segments the manifest still names
    (found by hand: a 3 MiB tmpfs, every later reconciliation refused ``missing-segment``)."""
    w = make_writer(tmp_path, version=4, max_records=2)
    for i in range(7):  # compactions: the manifest names journal segments
        await w.record(f"op{i}", status="completed", response=f"r{i}")
    _faults.arm("eio:before:journal-write:1,eio:before:segment-write:1")
    with pytest.raises(PersistenceError):
        await w.record("lost", status="completed", response="x")
    with pytest.raises(PersistenceError):
        await w.reconcile()  # its segment write fails
    _faults.disarm()
    await w.reconcile()
    await w.record("after", status="completed", response="y")
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert [k for k in state["ops"] if k != "lost"] == [f"op{i}" for i in range(7)] + ["after"]
