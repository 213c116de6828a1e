"""Process death at every durability seam: a fresh process recovers every acknowledged record.

A child process runs a small version 3 workload (initialization, appends, count and
byte compactions, one oversize record) armed with ``exit:<when>:<step>:<n>`` (the
``STEERFLOW_FAULT`` grammar), and reports each acknowledgement on stdout with a raw
``os.write`` only after ``record()`` returned.  The parent (a different process) then
loads the checkpoint.  Children are forked from a server that imported
``steerflow.checkpoint`` once (``tests/forked.py``); each case is its own test.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

from forked import run_forked
from steerflow import _faults
from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from steerflow.checkpoint import CheckpointWriter

    async def main(run, version):
        w = CheckpointWriter(os.path.join(run, "checkpoint.json"), session_id="s", prompt="p",
                             plan=[], config={}, flow_context={"log": []}, version=version,
                             max_records=3, max_bytes=900)
        ctx = {"log": []}
        await w.flush()
        os.write(1, b"flush\\n")
        for i in range(9):
            ctx["log"].append(i)
            response = "x" * 1200 if i == 5 else f"r{i}"
            if i % 3 == 2:
                await w.record_spawned(f"n{i}", status="completed", response=response,
                                       flow_context=ctx, spawn_id=f"s{i}")
            else:
                await w.record(f"op{i}", status="completed", response=response, flow_context=ctx)
            os.write(1, b"ack %d\\n" % i)
        await w.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def run_child(run: Path, fault: str | None, version: int = 3) -> tuple[int, int | None, str]:
    """CHILD in a process forked from the preloaded server (``tests/forked.py``)."""
    child = run_forked(CHILD, [str(run), str(version)], fault=fault, timeout=60, scratch=run.parent)
    acked = None
    for row in child.stdout.decode().splitlines():
        if row.startswith("ack "):
            acked = int(row.split()[1])
    return child.returncode, acked, child.stderr.decode()[-2000:]


def check_recovered(run: Path, acked: int | None) -> str | None:
    """None if the loaded state is a replay of n records, acked+1 <= n <= acked+2."""
    try:
        state, report = load_checkpoint(run)
    except CheckpointRecoveryError as exc:
        if acked is None and exc.report["refusal"]["reason"] == "missing-checkpoint":
            return None  # died before the first base existed and nothing was acknowledged
        return f"refused: {exc.report}"
    log = state["flow_context"]["log"]
    n = len(log)
    low = 0 if acked is None else acked + 1
    if not low <= n <= low + 1 or log != list(range(n)):
        return f"context {log} does not match acked={acked}"
    names = set(state["ops"]) | {e["node_id"] for e in state["spawned"]}
    expected = {f"n{i}" if i % 3 == 2 else f"op{i}" for i in range(n)}
    if names != expected:
        return f"entries {sorted(names)} != {sorted(expected)} ({report})"
    return None


def seam_points() -> list[tuple[str, int]]:
    """Run the workload in-process once and list every (point, hit count) it reaches."""
    import asyncio
    import tempfile

    hits: dict[str, int] = {}

    def hook(step: str, when: str) -> None:
        point = f"{when}:{step}"
        hits[point] = hits.get(point, 0) + 1

    namespace: dict[str, object] = {"__name__": "child"}
    code = CHILD.replace("asyncio.run(main(sys.argv[1], int(sys.argv[2])))", "")
    exec(compile(code, "child", "exec"), namespace)
    _faults.set_fault_hook(hook)
    saved = os.dup(1)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        with tempfile.TemporaryDirectory() as run:
            asyncio.run(namespace["main"](run, 3))  # type: ignore[operator]
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        _faults.set_fault_hook(None)
    return sorted(hits.items())


def test_seam_inventory_covers_the_protocol() -> None:
    points = dict(seam_points())
    for step in (
        "journal-create", "journal-write", "journal-flush", "journal-fsync", "journal-link",
        "journal-exchange", "base-create", "base-write", "base-fsync", "base-link",
        "base-exchange", "dir-fsync", "cleanup-unlink", "advance", "pin-close",
    ):  # fmt: skip
        assert f"before:{step}" in points and f"after:{step}" in points, step


def kill_cases() -> list[str]:
    """Death at the first, middle and last hit of every seam, and inside two short writes."""
    cases: list[str] = []
    for point, count in seam_points():
        for nth in sorted({1, (count + 1) // 2, count}):
            cases.append(f"exit:{point}:{nth}")
    cases.append("short-write:7,exit:after:journal-write-part:3")
    cases.append("short-write:7,exit:after:base-write-part:40")
    return cases


# In-process and quick: each case is its own test, so pytest-xdist spreads the campaign.
KILL_CASES = kill_cases()


def test_the_kill_campaign_reaches_every_seam_several_times() -> None:
    assert len(KILL_CASES) > 40


@pytest.mark.parametrize("case", KILL_CASES)
def test_death_at_every_seam_loses_no_acknowledged_record(tmp_path: Path, case: str) -> None:
    code, acked, err = run_child(tmp_path, case)
    assert code in (137, 0), f"{case}: exit {code}: {err}"
    problem = check_recovered(tmp_path, acked)
    assert problem is None, f"{case}: {problem}"


@pytest.mark.parametrize("version", [2, 3])
def test_uninterrupted_child_completes(tmp_path: Path, version: int) -> None:
    code, acked, err = run_child(tmp_path, None, version)
    assert code == 0, err
    assert acked == 8
    assert check_recovered(tmp_path, acked) is None
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert json.dumps(state["flow_context"]) == json.dumps({"log": list(range(9))})
