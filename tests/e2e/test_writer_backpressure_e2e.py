"""No call starts beyond the writer's bound, with a failing writer (issue 26 item 3).

Real ``steerflow flow`` processes: 16 independent ``script:`` nodes at concurrency 4. The
checkpoint writer fails, by a fault seam (ENOSPC on every journal line and base after the
first) or for real (the home on an 8 MiB tmpfs and 1.5 MB replies: the issue's repro).
Every call the script provider starts is a line in ``<home>/script-invocations.jsonl``;
the checkpoint tells what was acknowledged. At most ``concurrency`` calls may be paid for
and not saved (decision 100): a failed save closes admission before another call starts,
and the resume pays again for at most that many.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import child_env, read_invocations, run_cli, write_yaml
from resume_support import write_script

from steerflow.checkpoint import load_checkpoint

NODES = 16
CONCURRENCY = 4

#: After the initial (empty) journal and base, every journal line and every base a
#: reconciliation would publish fails: the disk is full from the first record on.
DISK_FULL_AFTER_INIT = ",".join(
    [f"enospc:before:journal-write:{n}" for n in range(2, 60)]
    + [f"enospc:before:base-write:{n}" for n in range(2, 60)]
)


def _plan(path: Path) -> Path:
    return write_yaml(
        path,
        {"plan": [{"agent_id": f"n{i:02d}", "instruction": f"task {i}"} for i in range(NODES)]},
    )


def _acknowledged(run_dir: Path) -> set[str]:
    state, _report = load_checkpoint(run_dir)
    return {key for key, entry in state["ops"].items() if entry["status"] == "completed"}


def _flow(home: Path, tmp_path: Path, script: dict[str, object], **env: str) -> dict[str, object]:
    result = run_cli(
        home, "flow", "--plan", _plan(tmp_path / "plan.yaml"),
        "--model", f"script:{write_script(tmp_path / 'script.yaml', script)}",
        "--concurrency", CONCURRENCY, "--json",
        env=child_env(**env), timeout=180,
    )  # fmt: skip
    assert result.returncode == 1, result.explain()
    body = result.json
    assert body["status"] == "failed" and body["checkpoint"]["persisted"] is False, body
    return body


def _bounded(home: Path, body: dict[str, object]) -> set[str]:
    """Every call started is saved, or one of at most CONCURRENCY unsaved ones."""
    invoked = [line["node"] for line in read_invocations(home)]
    saved = _acknowledged(Path(str(body["run_dir"])))
    assert len(invoked) == len(set(invoked))
    assert saved <= set(invoked)
    assert len(invoked) <= len(saved) + CONCURRENCY, (len(invoked), sorted(saved))
    return saved


def test_a_failing_writer_closes_admission_before_another_call_starts(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    body = _flow(home, tmp_path, {"*": {"delay": 0.05}}, STEERFLOW_FAULT=DISK_FULL_AFTER_INIT)
    assert _bounded(home, body) == set()
    assert len(read_invocations(home)) == CONCURRENCY  # the first ones, nothing after

    # The resume pays again only for the calls whose outcome was lost.
    resumed = run_cli(home, "resume", str(body["run_id"]), "--json", timeout=120)
    assert resumed.returncode == 0, resumed.explain()
    assert len(read_invocations(home)) == NODES + CONCURRENCY


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (CI runs as root; without root this fails naming why)."""
    assert os.geteuid() == 0, "mounting a tmpfs needs root (CI runs as root)"
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.strip()}"
    try:
        yield mount
    finally:
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        assert done.returncode == 0, f"cannot unmount {mount}: {done.stderr.strip()}"


def test_a_home_on_a_disk_that_fills_pays_for_at_most_concurrency_lost_calls(
    tmp_path: Path, small_disk: Path
) -> None:
    home = small_disk / "home"
    body = _flow(home, tmp_path, {"*": {"response": "r" * 1_500_000}})
    saved = _bounded(home, body)
    assert 0 < len(saved) < NODES, sorted(saved)  # the disk filled part way through
    assert len(read_invocations(home)) < NODES  # before the fix: all 16 were invoked
