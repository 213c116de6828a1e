"""``benchmarks/executor_scale.py``'s ``steerflow+v4`` row: checkpoint bytes linear (issue 43).

The benchmark prints figures and asserts nothing; this pins its byte goal, a byte COUNT
(never a time): a version 4 run of the benchmark's DAG writes at most 3x its responses'
bytes (the writer's own counter, every checkpoint write included) and loads clean with
every node completed. The 100,000-node runs are ``slow`` (they also pin peak RSS, a size,
at the issue's 1 GiB); the default run keeps 1,000 nodes, where a version 3 run of the
same DAG already writes 3.96x, and a 200-node public-path run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "executor_scale.py"
if str(ROOT) not in sys.path:  # ``benchmarks`` is a directory of scripts, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.executor_scale import dag, prepare_steerflow, response_bytes  # noqa: E402


def _v4_bytes(nodes: int, tmp_path: Path) -> tuple[int, int, int]:
    """(nodes completed, checkpoint bytes the writer counted, response bytes)."""
    run = prepare_steerflow(dag(nodes), tmp_path, checkpoint=4)
    out = asyncio.run(run())
    return out["completed"], out["writer_bytes"], response_bytes(dag(nodes))


def _child(row: str, nodes: int, *, timeout: float) -> dict[str, Any]:
    """One row run by the benchmark's own child process; its JSON line."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", row, str(nodes)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_a_1000_node_v4_run_writes_at_most_3x_its_responses(tmp_path: Path) -> None:
    completed, written, responses = _v4_bytes(1000, tmp_path)
    assert completed == 1000
    assert written <= 3 * responses, (written, responses)
    # and the unit it wrote loads clean, as version 4, with every node
    from steerflow.checkpoint import load_checkpoint

    (unit,) = (tmp_path / "home" / "runs").iterdir()
    state, report = load_checkpoint(unit)
    assert report["checkpoint_version"] == 4 and report["status"] == "clean"
    assert len(state["ops"]) == 1000


#: Checkpoint bytes / response bytes at 100,000 nodes, per row: the issue's goal is 3x.
#: Since a compaction publishes its journal as a segment (decision 395) each entry is
#: written twice (its journal line, its level-1 merge), ~1.1x each with its record's
#: members, plus a write-ahead intent line per call on the public path (~0.1x): measured
#: 2.37x there, so both rows are pinned at 2.5x, below the goal, against a regression.
#: ``resume+v4``: the resumed run writes every replayed entry once, in its first segment.
RATIO_100K = {"steerflow+v4": 2.5, "run_flow+v4": 2.5, "resume+v4": 1.3}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("row", sorted(RATIO_100K))
def test_a_100000_node_v4_run_finishes_within_its_bytes_and_1_gib(row: str) -> None:
    """The benchmark's own child (a fresh process, as it measures): the executor with its
    writer, and the public path (``run_flow``); bytes and peak RSS (a size, not a time)."""
    out = _child(row, 100_000, timeout=3500)
    assert out["completed"] == out["nodes"] == 100_000
    assert out["writer_bytes"] <= RATIO_100K[row] * response_bytes(dag(100_000))
    assert out["hwm_mib"] <= 1024, out


def test_the_resume_row_replays_a_batch_another_process_ran() -> None:
    """``resume+v4``: the batch run first by its own process, then resumed in the child."""
    out = _child("resume+v4", 200, timeout=180)
    assert out["completed"] == out["nodes"] == 200
    # The resumed run's checkpoint holds every replayed entry once (its first segment).
    assert response_bytes(dag(200)) < out["writer_bytes"] <= 1.3 * response_bytes(dag(200))
    assert isinstance(out["hwm_mib"], float) and out["hwm_mib"] > 0


def test_the_public_path_row_runs_the_users_batch_and_reports_its_own_peak() -> None:
    """``run_flow+v4``: a user's ``run_flow`` batch, in a child reporting its own VmHWM."""
    out = _child("run_flow+v4", 200, timeout=120)
    assert out["completed"] == out["nodes"] == 200
    # its checkpoint bytes, as FlowResult.checkpoint counts them, within the goal too
    assert 0 < out["writer_bytes"] <= 3 * response_bytes(dag(200))
    # the child's own high-water mark (not ru_maxrss, which counts the parent's pages)
    assert isinstance(out["hwm_mib"], float) and out["hwm_mib"] > 0
