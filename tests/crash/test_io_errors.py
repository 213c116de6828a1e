"""Recoverable I/O errors at every seam: refused until reconciled, never a false ack.

Extends ``tests/checkpoint/test_writer_faults.py`` (EIO at a few hit numbers, checked
at the end) with: the seam list discovered per phase (initialization, append,
compaction, close), ENOSPC beside EIO, short writes that leave a torn record (7-byte
writes failing between parts, and a record complete except its LF), and checks made
*at each acknowledgement* and *at each refusal*:

* after every successful ``record`` the checkpoint on disk already holds exactly the
  state of that prefix (an acknowledged record is never missing from disk);
* after a failure, a further ``record`` is refused with ``PersistenceError`` and changes
  no byte of any checkpoint file (refused until reconciliation);
* ``reconcile()`` then adopts the durable prefix, the failed transition is recorded
  again, and the run ends in exactly the expected state with a clean report.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_support import (
    apply,
    expected_states,
    load_here,
    phase_of,
    project,
    snapshot_tree,
    transitions,
    writer_for,
)

from steerflow import _faults
from steerflow.checkpoint import load_checkpoint
from steerflow.errors import PersistenceError

COUNT = 14
LIMITS = {"max_records": 3, "max_bytes": 1_400}
BIG = 1_600


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    _faults.disarm()
    yield
    _faults.disarm()


@dataclass
class Outcome:
    """What one faulted run observed."""

    failures: int = 0
    problems: list[str] | None = None


async def drive(run: Path, fault: str | None) -> Outcome:
    """Run the script with ``fault`` armed; reconcile and retry after each failure."""
    out = Outcome(problems=[])
    problems = out.problems
    assert problems is not None
    expected = expected_states(COUNT, BIG)
    _faults.arm(fault)
    w = writer_for(run, **LIMITS)

    async def refused_then_reconciled(what: str) -> None:
        out.failures += 1
        before = snapshot_tree(run)
        with pytest.raises(PersistenceError, match="stopped"):
            await w.record("probe", status="completed", response="PROBE")
        if snapshot_tree(run) != before:
            problems.append(f"{what}: a refused write changed the checkpoint files")
        await w.reconcile()

    while True:
        try:
            await w.flush()
            break
        except PersistenceError:
            await refused_then_reconciled("flush")
    for n, t in enumerate(transitions(COUNT, big=BIG), start=1):
        for _attempt in range(3):
            try:
                await apply(w, t)
            except PersistenceError:
                await refused_then_reconciled(f"transition {n}")
                continue
            state, report = load_here(run)
            if state is None or project(state) != expected[n]:
                problems.append(f"ack {n} is not on disk: {report}")
            break
        else:
            problems.append(f"transition {n} never succeeded")
    try:
        await w.close()
    except PersistenceError:
        out.failures += 1  # surfaced, never swallowed; the acknowledged state stands
    if not out.failures and not w.persisted:
        out.failures = 1  # failed after every caller was acknowledged: recorded, not lost
    state, report = load_here(run)
    if state is None or project(state) != expected[COUNT]:
        problems.append(f"final state differs from the replay of {COUNT}: {report}")
    elif report["status"] != "clean":
        problems.append(f"final report not clean: {report}")
    return out


def dry_run(short: bool) -> list[tuple[str, str, str]]:
    hits: list[tuple[str, str, str]] = []
    phase = ["append"]

    def hook(step: str, when: str) -> None:
        hits.append((phase_of(phase[0]), when, step))

    async def main(run: Path) -> None:
        w = writer_for(run, **LIMITS)
        phase[0] = "initialization"
        await w.flush()
        phase[0] = "append"
        for t in transitions(COUNT, big=BIG):
            await apply(w, t)
        phase[0] = "close"
        await w.close()

    _faults.arm("short-write:7" if short else None)
    _faults.set_fault_hook(hook)
    try:
        with tempfile.TemporaryDirectory() as run:
            asyncio.run(main(Path(run)))
    finally:
        _faults.disarm()
    return hits


def discover() -> list[str]:
    """Fault specifications: every (phase, seam), EIO and ENOSPC, plus torn writes."""
    cases: list[str] = []
    for short in (False, True):
        counts: dict[str, int] = {}
        spans: dict[tuple[str, str], list[int]] = {}
        for phase, when, step in dry_run(short):
            point = f"{when}:{step}"
            counts[point] = counts.get(point, 0) + 1
            spans.setdefault((phase, point), []).append(counts[point])
        for (_phase, point), nths in spans.items():
            step = point.split(":", 1)[1]
            if step == "ack":
                continue  # not an I/O step: nothing there can fail with EIO or ENOSPC
            if short:
                if step.endswith(("-write-part", "-lf")):
                    for nth in sorted({nths[0], nths[len(nths) // 2], nths[-1]}):
                        cases.append(f"short-write:7,eio:{point}:{nth}")
                    cases.append(f"short-write:7,enospc:{point}:{nths[0]}")
                continue
            for nth in sorted({nths[0], nths[-1]}):
                cases.append(f"eio:{point}:{nth}")
            if step.endswith(("-write", "-fsync", "-create", "-link", "-exchange")):
                cases.append(f"enospc:{point}:{nths[0]}")
    return sorted(set(cases))


CASES = discover()


@pytest.mark.parametrize("fault", CASES)
async def test_error_is_refused_until_reconciled_and_loses_nothing(
    tmp_path: Path, fault: str
) -> None:
    outcome = await drive(tmp_path, fault)
    assert outcome.problems == []
    assert outcome.failures >= 1, "the injected error was never observed"


def test_campaign_size() -> None:
    assert len(CASES) >= 120
    kinds = {c.split(":")[0] if not c.startswith("short") else "torn" for c in CASES}
    assert kinds == {"eio", "enospc", "torn"}


async def test_torn_record_is_dropped_and_never_appended_behind(tmp_path: Path) -> None:
    """EIO after all but the LF reached the file: the fragment is reported, then bypassed."""
    w = writer_for(tmp_path, max_records=100)
    await w.record("a", status="completed", response="first")
    _faults.arm("short-write:1,eio:before:journal-lf:1")
    with pytest.raises(PersistenceError):
        await w.record("b", status="completed", response="TORN", flow_context={"x": 1})
    _faults.disarm()
    data = (tmp_path / "checkpoint.json.journal").read_bytes()
    assert not data.endswith(b"\n") and b"TORN" in data  # complete but for its LF
    state, report = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"a"} and report["status"] == "recovered_prefix"
    assert report["discarded_tail_bytes"] == len(data.split(b"\n")[-1])
    await w.reconcile()
    await w.record("c", status="completed", response="third")
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert set(state["ops"]) == {"a", "c"} and report["status"] == "clean"
    assert state["flow_context"] == {"x": 1}  # the admitted context is restated by "c"
