"""Process death at every durability seam: a fresh process recovers every acknowledged record.

A child process runs a small version 3 workload (initialization, appends, count and
byte compactions, one oversize record) with ``STEERFLOW_FAULT=exit:<when>:<step>:<n>``,
and reports each acknowledgement on stdout with a raw ``os.write`` only after
``record()`` returned.  The parent (a different process) then loads the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

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
    env = {k: v for k, v in os.environ.items() if k != _faults.ENV_VAR}
    if fault:
        env[_faults.ENV_VAR] = fault
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run), str(version)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    acked = None
    for row in proc.stdout.decode().splitlines():
        if row.startswith("ack "):
            acked = int(row.split()[1])
    return proc.returncode, acked, proc.stderr.decode()[-2000:]


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


def test_death_at_every_seam_loses_no_acknowledged_record(tmp_path: Path) -> None:
    cases: list[str] = []
    for point, count in seam_points():
        for nth in sorted({1, (count + 1) // 2, count}):
            cases.append(f"exit:{point}:{nth}")
    cases.append("short-write:7,exit:after:journal-write-part:3")
    cases.append("short-write:7,exit:after:base-write-part:40")

    def one(index_case: tuple[int, str]) -> str | None:
        index, case = index_case
        run = tmp_path / f"run{index}"
        run.mkdir()
        code, acked, err = run_child(run, case)
        if code not in (137, 0):
            return f"{case}: exit {code}: {err}"
        problem = check_recovered(run, acked)
        return None if problem is None else f"{case}: {problem}"

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failures = [f for f in pool.map(one, enumerate(cases)) if f]
    assert failures == [], "\n".join(failures)
    assert len(cases) > 40


@pytest.mark.parametrize("version", [2, 3])
def test_uninterrupted_child_completes(tmp_path: Path, version: int) -> None:
    code, acked, err = run_child(tmp_path, None, version)
    assert code == 0, err
    assert acked == 8
    assert check_recovered(tmp_path, acked) is None
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert json.dumps(state["flow_context"]) == json.dumps({"log": list(range(9))})
