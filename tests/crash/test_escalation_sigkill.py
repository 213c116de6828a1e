"""SIGKILL an escalation chain mid-retry, and its resume mid-dependent; resume each (issue 26).

A real ``steerflow flow`` (its ``script:`` calls held open by ``tests/e2e/agent_gate_cli.py``)
runs ``a`` (fails at its base model) then its retry ``a.esc1`` at the ladder's model; it is
killed while ``a.esc1`` runs. ``steerflow resume`` (a new process) must run ``a.esc1`` again
(its intent was recorded, with its attempt number, before the failed attempt's outcome) and
never ``a``; that resume is killed while ``b`` runs, and a second resume replays the whole
chain and runs ``b`` only. Every checkpoint along the way records the retry with its
``escalated_from``, ``parent_id`` and ``escalation`` under a digest that verifies.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from agent_support import WAIT_S, Gate, start_gated_agent
from flow_support import finish, read_invocations, run_cli, stop, write_yaml
from resume_support import new_runs, run_dirs

from steerflow.checkpoint import entry_digest, load_checkpoint

pytestmark = pytest.mark.timeout(300)


def _plan(tmp_path: Path) -> tuple[Path, Path]:
    base = write_yaml(tmp_path / "m0.yaml", {"a": {"fail": "base model failed"}})
    ladder = write_yaml(tmp_path / "m1.yaml", {"*": {"response": "answer from m1"}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "roles": {"worker": {"model": f"script:{base}", "escalation": [f"script:{ladder}"]}},
            "plan": [
                {"agent_id": "a", "assignee": "worker", "instruction": "do a"},
                {"agent_id": "b", "instruction": "use a", "depends_on": ["a"]},
            ],
        },
    )
    return plan, ladder


def _kill_when_started(proc: Any, gate: Gate, key: str) -> None:
    try:
        gate.wait_started(key, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL


def _retry(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    state, report = load_checkpoint(run_dir)
    assert report["status"] == "clean"
    (retry,) = state["spawned"]
    assert retry["spawn_id"] == "a.esc1" and retry["escalation"] == 1
    node_a = next(p["node_id"] for p in state["plan"] if p["agent_id"] == "a")
    assert retry["escalated_from"] == retry["parent_id"] == node_a
    assert retry["result_digest"] == entry_digest(retry)
    assert state["ops"]["a"]["status"] == "failed"
    return state, retry


def test_a_chain_killed_mid_retry_and_mid_dependent_resumes_faithfully(tmp_path: Path) -> None:
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    plan, ladder = _plan(tmp_path)
    _kill_when_started(
        start_gated_agent(
            home, gate, "flow", "--plan", plan, "--model", f"script:{ladder}", "--json"
        ),
        gate,
        "a.esc1",
    )
    (source,) = run_dirs(home)
    _, intent = _retry(source)
    assert intent["status"] == "pending" and intent["model"] == f"script:{ladder}"

    gate.release("a.esc1")
    first = start_gated_agent(home, gate, "resume", source.name, "--json")
    _kill_when_started(first, gate, "b")
    (resumed,) = new_runs(home, [source])
    _, done = _retry(resumed)
    assert done["status"] == "completed" and done["response"] == "answer from m1"
    assert done["node_id"] == intent["node_id"]  # a rebuilt spawn keeps its node id

    gate.release("b")
    second = start_gated_agent(home, gate, "resume", resumed.name, "--json")
    try:
        result = finish(second, timeout=WAIT_S)
    finally:
        stop(second)
    assert result.returncode == 0, result.explain()
    assert {n["id"]: n["status"] for n in result.json["nodes"]} == {
        "a": "failed",
        "b": "completed",
        "a.esc1": "completed",
    }
    (last,) = new_runs(home, [source, resumed])
    state, replayed = _retry(last)
    assert replayed["response"] == "answer from m1"
    assert state["ops"]["b"]["status"] == "completed"
    shown = run_cli(home, "show", result.json["run_id"], "b", "--json").json
    assert "### a.esc1 (completed)\nanswer from m1" in shown["instruction"]  # the chain's end
    # a ran once, its retry was killed once and ran once more, b was killed once.
    assert Counter(line["node"] for line in read_invocations(home)) == {
        "a": 1,
        "a.esc1": 2,
        "b": 2,
    }
