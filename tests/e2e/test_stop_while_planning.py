"""A stop that lands while a flow plans (issue 26 item 1; decision 101).

Real processes: the flow runs the CLI through ``ctl_slowplan.py``, whose ``echo``
planner is held until ``HOME/release-plan`` exists and logs each call it gets; the stop
comes from a separate ``ctl`` process, a real signal or ``--timeout``. A graceful stop,
SIGTERM and the deadline let the planner call finish: the plan is saved (a checkpoint
with no outcomes), the run exits 75/143/124, and ``resume`` runs the plan without
planning again. ``ctl stop --now`` and SIGINT cancel the planner: the run says there is
nothing to resume, and ``resume`` refuses (exit 3) saying why.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from ctl_support import (
    SLOW_PLANNER,
    LiveFlow,
    ctl_ok,
    live_flow,
    node_metadata,
    run_cli,
    session_phase,
    wait_for,
    wait_stamped,
)

from steerflow.checkpoint import load_checkpoint

ECHO_NODES = ["scope", "explore-a", "explore-b", "synthesize"]


def _argv(home: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SLOW_PLANNER), "--home", str(home), "flow",
            "Plan a small survey", "--model", "echo", "--json", *extra]  # fmt: skip


def _planner_calls(home: Path) -> int:
    log = home / "planner-calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _planning(flow: LiveFlow) -> None:
    """The flow's planner call has started (and is held)."""
    wait_for(lambda: _planner_calls(flow.home) == 1, what="the planner call", alive=flow.proc)
    assert session_phase(flow.home, flow.session_id) == "planning"


def _statuses(result: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["status"] for n in result["nodes"]}


def _saved_plan_without_outcomes(flow: LiveFlow) -> None:
    result = flow.result()
    assert _statuses(result) == dict.fromkeys(ECHO_NODES, "pending")
    assert result["checkpoint"]["persisted"] is True, result
    state, report = load_checkpoint(Path(result["run_dir"]))
    assert report["status"] == "clean"
    assert [entry["agent_id"] for entry in state["plan"]] == ECHO_NODES
    assert state["ops"] == {} and state["spawned"] == []


def _resumes_without_planning(home: Path, run_id: str) -> None:
    resumed = run_cli(home, "resume", run_id, "--json", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    body = json.loads(resumed.stdout)
    assert _statuses(body) == dict.fromkeys(ECHO_NODES, "completed")
    assert _planner_calls(home) == 1, "the resume asked the planner again"


def test_graceful_stop_while_planning_keeps_the_plan_and_resume_runs_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with live_flow(home, [], argv=_argv(home)) as flow:
        _planning(flow)
        stop = ctl_ok(home, "stop", flow.session_id, "--reason", "not today")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        (home / "release-plan").touch()  # the planner answers after the stop
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert result["status"] == "stopped" and result["exit_code"] == 75
    assert result["stopped_by"] == {"control_id": stop, "reason": "not today", "now": False}
    _saved_plan_without_outcomes(flow)
    assert "nothing to resume" not in flow.stderr()
    _resumes_without_planning(home, flow.run_id)


@pytest.mark.parametrize(
    ("how", "exit_code", "status"),
    [("SIGTERM", 143, "interrupted"), ("deadline", 124, "timed_out")],
)
def test_sigterm_or_deadline_while_planning_keeps_the_plan(
    tmp_path: Path, how: str, exit_code: int, status: str
) -> None:
    home = tmp_path / "home"
    extra = ["--timeout", "1"] if how == "deadline" else []
    with live_flow(home, [], argv=_argv(home, *extra)) as flow:
        _planning(flow)
        if how == "SIGTERM":
            flow.proc.send_signal(signal.SIGTERM)
        seen = home / ("stop-seen" if how == "SIGTERM" else "deadline-seen")
        wait_for(seen.exists, what=f"the run to take note of the {how}", alive=flow.proc)
        (home / "release-plan").touch()
        assert flow.finish(timeout=60) == exit_code, flow.stderr()
    assert flow.result()["status"] == status
    _saved_plan_without_outcomes(flow)
    _resumes_without_planning(home, flow.run_id)


@pytest.mark.parametrize("how", ["ctl stop --now", "SIGINT"])
def test_stop_now_or_sigint_cancels_the_planner_and_says_there_is_nothing_to_resume(
    tmp_path: Path, how: str
) -> None:
    home = tmp_path / "home"
    with live_flow(home, [], argv=_argv(home)) as flow:
        _planning(flow)
        if how == "SIGINT":
            flow.proc.send_signal(signal.SIGINT)
        else:
            stop = ctl_ok(home, "stop", flow.session_id, "--now")
            assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        # Never released: only the cancellation can end the held planner call.
        assert flow.finish(timeout=60) == (130 if how == "SIGINT" else 75), flow.stderr()
    result = flow.result()
    assert result["status"] == ("interrupted" if how == "SIGINT" else "stopped")
    assert result["nodes"] == [] and result["checkpoint"]["persisted"] is False
    why = f"the planner call was cancelled ({how}) before it returned a plan"
    assert f"nothing to resume: {why}; no plan was saved" in result["warnings"]
    assert f"nothing to resume: {why}" in flow.stderr()
    assert not (Path(result["run_dir"]) / "checkpoint.json").exists()
    assert node_metadata(home, flow.session_id)["nothing_to_resume"] == why

    refused = run_cli(home, "resume", flow.run_id)
    assert refused.returncode == 3, refused.stderr
    assert f"run {flow.run_id} has nothing to resume: {why}" in refused.stderr
    assert "has no checkpoint.json" not in refused.stderr
    assert _planner_calls(home) == 1


def test_text_output_of_a_run_stopped_now_while_planning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv = [a for a in _argv(home) if a != "--json"]
    with live_flow(home, [], argv=argv) as flow:
        _planning(flow)
        stop = ctl_ok(home, "stop", flow.session_id, "--now")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 75, flow.stderr()
    out = flow.stdout_path.read_text()
    assert "status: stopped" in out
    assert (
        "nothing to resume: the planner call was cancelled (ctl stop --now) before it "
        "returned a plan; no plan was saved"
    ) in out
    assert "resume with:" not in out


def _claude_reply(text: str, *, input_tokens: int, output_tokens: int, cost: float) -> str:
    """What ``claude -p --output-format json`` prints."""
    return json.dumps(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": text,
            "total_cost_usd": cost,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    )


def test_a_claude_code_planner_stopped_while_planning_counts_in_the_runs_usage(
    tmp_path: Path,
) -> None:
    """The issue's repro: ``flow PROMPT --model claude-code/...``, ``ctl stop`` while the
    (fake) agent plans. The planner call is paid work: its plan is kept, its usage is the
    run's, and the resume runs the plan without a second planning call."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
    from llm_fakes import write_fake_agent

    home = tmp_path / "home"
    claude = write_fake_agent(tmp_path / "bin", "claude")
    plan = {"plan": [
        {"agent_id": "a", "assignee": "w", "instruction": "WORKER step a"},
        {"agent_id": "b", "assignee": "w", "instruction": "WORKER step b", "depends_on": ["a"]},
    ]}  # fmt: skip
    release = tmp_path / "release-plan"
    claude.configure(
        wait_for=str(release),
        stdout=_claude_reply(json.dumps(plan), input_tokens=300, output_tokens=40, cost=0.25),
        when=[["WORKER", {"wait_for": None, "stdout": _claude_reply(
            "done", input_tokens=10, output_tokens=2, cost=0.01)}]],
    )  # fmt: skip
    env = {"STEERFLOW_CLAUDE_BIN": str(claude.path)}
    with live_flow(home, ["Ship the release", "--model", "claude-code/sonnet"], env=env) as flow:
        wait_for(lambda: len(claude.runs()) == 1, what="the planner call", alive=flow.proc)
        stop = ctl_ok(home, "stop", flow.session_id)
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        release.touch()
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert result["status"] == "stopped"
    assert _statuses(result) == {"a": "pending", "b": "pending"}
    planner_usage = {
        "input_tokens": 300,
        "output_tokens": 40,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": 0.25,
    }
    assert result["usage"] == planner_usage
    assert node_metadata(home, flow.session_id)["usage"] == planner_usage
    state, _ = load_checkpoint(Path(result["run_dir"]))
    assert [e["agent_id"] for e in state["plan"]] == ["a", "b"] and state["ops"] == {}

    resumed = run_cli(home, "resume", flow.run_id, "--json", env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert _statuses(json.loads(resumed.stdout)) == {"a": "completed", "b": "completed"}
    prompts = [run["stdin"] for run in claude.runs()]
    assert len(prompts) == 3 and prompts[0] == "Ship the release", prompts
    assert all("WORKER" in p for p in prompts[1:])  # no second planning call
