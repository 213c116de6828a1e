"""SIGKILL a running flow at random moments, resume it, and compare with an uninterrupted run.

The plan is a diamond followed by a chain (a -> b, c -> d -> e -> f), run by the
``script:`` model with ``"*": {delay: 0.05}`` and concurrency 2.  Each trial starts the
flow in its own home, sleeps a delay drawn (``random.Random(1234)``) from the span of an
uninterrupted run, kills it with SIGKILL, then resumes until the run completes.

Invariants, from ``<home>/script-invocations.jsonl`` and the checkpoint read at kill time:

* a node recorded completed in the checkpoint at the kill is never invoked again;
* every node is invoked at most ``1 + [it was in flight at the kill]`` times, where in
  flight means "logged an invocation, but not recorded completed";
* the final checkpoint's responses equal those of the uninterrupted run (the script
  responses are explicit or echo texts built from dependency results: deterministic).

Trials run with the default version 3 checkpoint, a few with ``--checkpoint-version 2``, and
a few with ``--checkpoint-version 4 --compact-records 1``: every record after the first is
a compaction publishing the journal as a segment (decision 395), and the resume of a
version 4 run writes version 4 (decision 394).
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from flow_support import (
    read_invocations,
    run_cli,
    start_cli,
    stop,
    write_yaml,
)

from steerflow.checkpoint import load_checkpoint
from waiting import wait_until

NODES = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": ["e"]}
SCRIPT = {
    "*": {"delay": 0.05},
    "a": {"response": "alpha"},
    "c": {"response": {"value": "gamma", "n": 3}},
    "e": {"response": "epsilon"},
}
V3_TRIALS = 20
V2_TRIALS = 6
V4_TRIALS = 8

_rng = random.Random(1234)
#: (trial id, checkpoint version, position of the kill within the run's span in [0, 1))
TRIALS = (
    [(f"v3-{i:02d}", "3", _rng.random()) for i in range(V3_TRIALS)]
    + [(f"v2-{i:02d}", "2", _rng.random()) for i in range(V2_TRIALS)]
    + [(f"v4-{i:02d}", "4", _rng.random()) for i in range(V4_TRIALS)]
)


@dataclass(frozen=True)
class Baseline:
    plan: Path
    script: Path
    responses: dict[str, Any]
    first_call_s: float  # from process start to the first invocation
    work_s: float  # from the first invocation to the last node's completion


def _write_inputs(folder: Path) -> tuple[Path, Path]:
    entries = []
    for key, deps in NODES.items():
        entry: dict[str, Any] = {"agent_id": key, "instruction": f"work on {key}"}
        if deps:
            entry["depends_on"] = deps
        entries.append(entry)
    plan = write_yaml(folder / "plan.yaml", {"name": "diamond-chain", "plan": entries})
    script = write_yaml(folder / "script.yaml", SCRIPT)
    return plan, script


def _flow_args(plan: Path, script: Path, version: str) -> list[object]:
    compact = ["--compact-records", "1"] if version == "4" else []
    return [
        "flow", "--plan", plan, "--model", f"script:{script}", "--concurrency", "2",
        "--checkpoint-version", version, *compact,
    ]  # fmt: skip


def _responses(run_dir: Path) -> dict[str, Any]:
    state, _ = load_checkpoint(run_dir / "checkpoint.json")
    assert {k: e["status"] for k, e in state["ops"].items()} == dict.fromkeys(NODES, "completed")
    return {k: e["response"] for k, e in state["ops"].items()}


def _runs(home: Path) -> list[Path]:
    root = home / "runs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """One uninterrupted run: its responses and how long it takes from process start."""
    folder = tmp_path_factory.mktemp("sigkill-inputs")
    plan, script = _write_inputs(folder)
    home = folder / "home"
    started = time.time()
    proc = start_cli(home, *_flow_args(plan, script, "3"))
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    duration = time.time() - started
    assert proc.returncode == 0, err
    [run_dir] = _runs(home)
    calls = read_invocations(home)
    assert Counter(c["node"] for c in calls) == Counter(list(NODES))
    first, last = min(c["ts"] for c in calls), max(c["ts"] for c in calls)
    assert duration > 0
    return Baseline(plan, script, _responses(run_dir), first - started, last - first + 0.1)


STARTUP_SHARE = 0.1  # this share of trials is killed before the first invocation


def _kill_at(home: Path, args: list[object], baseline: Baseline, position: float) -> str:
    """Start the flow and SIGKILL it at ``position``; returns a description of the moment.

    Positions below STARTUP_SHARE fall in start-up (before the first node is invoked,
    while the session, run directory and initial checkpoint are being created); the rest
    are spread over the span in which nodes run, measured from the first invocation
    (waited for with a bound) so interpreter start-up jitter does not blur them.
    """
    log = home / "script-invocations.jsonl"
    proc = start_cli(home, *args)
    try:
        if position < STARTUP_SHARE:
            delay = position / STARTUP_SHARE * baseline.first_call_s
            time.sleep(delay)  # the random moment is the point of this test
            moment = f"start-up +{delay:.3f}s"
        else:
            wait_until(
                lambda: log.exists() or proc.poll() is not None,
                timeout=30,
                what="the flow's first invocation",
                interval=0.002,
            )
            assert log.exists(), "the flow never invoked a node"
            delay = (position - STARTUP_SHARE) / (1 - STARTUP_SHARE) * baseline.work_s
            time.sleep(delay)  # the random moment is the point of this test
            moment = f"first invocation +{delay:.3f}s"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        stop(proc)
    return moment


def _state_at_kill(home: Path) -> tuple[Path | None, set[str]]:
    """The killed run directory (if any) and the nodes its checkpoint records completed."""
    runs = _runs(home)
    assert len(runs) <= 1, runs
    if not runs or not (runs[0] / "checkpoint.json").exists():
        return (runs[0] if runs else None), set()
    state, report = load_checkpoint(runs[0] / "checkpoint.json")  # must never be refused
    assert report["status"] in ("clean", "recovered_prefix"), report
    return runs[0], {k for k, e in state["ops"].items() if e["status"] == "completed"}


@pytest.mark.parametrize(("trial", "version", "position"), TRIALS, ids=[t[0] for t in TRIALS])
def test_sigkill_then_resume_is_faithful(
    tmp_path: Path, baseline: Baseline, trial: str, version: str, position: float
) -> None:
    home = tmp_path / "home"
    delay = _kill_at(home, _flow_args(baseline.plan, baseline.script, version), baseline, position)

    calls_at_kill = Counter(c["node"] for c in read_invocations(home))
    killed_dir, completed_at_kill = _state_at_kill(home)
    in_flight = {k for k in calls_at_kill if k not in completed_at_kill}
    assert completed_at_kill <= set(calls_at_kill), "a node recorded completed was never invoked"

    # Resume until completed (a fresh start when the kill came before any checkpoint).
    target: str | None = None
    if killed_dir is not None and (killed_dir / "checkpoint.json").exists():
        target = killed_dir.name
    final: dict[str, Any] | None = None
    for _ in range(4):
        if target is None:
            assert sum(calls_at_kill.values()) == 0, (
                f"{trial}: nodes were invoked but no checkpoint exists: {calls_at_kill}"
            )
            result = run_cli(home, *_flow_args(baseline.plan, baseline.script, version), "--json")
        else:
            result = run_cli(home, "resume", target, "--json")
        assert result.returncode == 0, f"{trial} (killed at {delay})\n{result.explain()}"
        final = result.json
        if final["status"] == "completed":
            break
        target = final["run_id"]
    assert final is not None and final["status"] == "completed", final
    if version == "4":  # a resume of version 4 stays version 4 (decision 394)
        assert final["checkpoint"]["version"] == 4, final["checkpoint"]

    calls = read_invocations(home)
    killed_run = killed_dir.name if killed_dir else None
    after = Counter(c["node"] for c in calls if c["run_id"] != killed_run)
    total = Counter(c["node"] for c in calls)
    context = (
        f"{trial} killed at {delay} completed_at_kill={sorted(completed_at_kill)} "
        f"calls_at_kill={dict(calls_at_kill)} after={dict(after)}"
    )
    for node in completed_at_kill:
        assert after[node] == 0, f"{node} was completed at the kill and ran again: {context}"
    for node in NODES:
        assert 1 <= total[node] <= 1 + (node in in_flight), f"{node}: {context}"
    assert _responses(Path(final["run_dir"])) == baseline.responses, context
