"""Loops at run time (issue 40 item 4), against the ``script:`` provider.

A draft → critique → revise loop whose rounds get ids ``X.rN``; each round receives the
previous round's replies of the whole body; the loop ends when ``until`` is met, at
``max_rounds`` (a failure only with ``on_max_rounds: fail``), or when a body node fails.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from steerflow import Loop, Op, Plan
from steerflow.checkpoint import load_checkpoint
from steerflow.errors import FlowResumeError, UsageError
from steerflow.executor import EventBus, FlowEvent
from steerflow.orchestrate import FlowOptions, FlowResult, FlowRun, prepare_resume, run_flow
from steerflow.views import node_detail, show_run


def _script(tmp_path: Path, nodes: dict[str, Any]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(nodes), encoding="utf-8")
    return f"script:{path}"


def _refine(until: Any = None, **loop: Any) -> Plan:
    return Plan(
        ops=[
            Op("brief", "State the task."),
            Loop(
                "refine",
                body=[
                    Op("draft", "Write or revise the draft.", depends_on=["brief"]),
                    Op("critique", "Critique the draft.", depends_on=["draft"]),
                ],
                until=until or {"node": "critique", "contains": "LGTM"},
                **loop,
            ),
            Op("publish", "Publish the final draft.", depends_on=["refine"]),
        ]
    )


def _invocations(home: Path) -> list[str]:
    log = home / "script-invocations.jsonl"
    if not log.exists():
        return []
    return [json.loads(line)["node"] for line in log.read_text().splitlines()]


async def _instruction(home: Path, run_id: str, node: str) -> str:
    detail = await asyncio.to_thread(node_detail, home, run_id, node)
    return str(detail.instruction)


async def _run(tmp_path: Path, plan: Plan, nodes: dict[str, Any], **options: Any) -> FlowResult:
    home = tmp_path / "home"
    model = _script(tmp_path, nodes)
    return await run_flow(FlowOptions(plan=plan, model=model, **options), home=home)


ROUNDS = {
    "brief": {"response": "task: a haiku"},
    "draft.r1": {"response": "draft one"},
    "critique.r1": {"response": "too long"},
    "draft.r2": {"response": "draft two"},
    "critique.r2": {"response": "LGTM"},
    "publish": {"response": "published"},
}


async def test_a_loop_ends_when_until_contains_in_round_two(tmp_path: Path) -> None:
    result = await _run(tmp_path, _refine(), ROUNDS)
    assert result.status == "completed", result.to_json()
    home = tmp_path / "home"
    assert _invocations(home) == [
        "brief", "draft.r1", "critique.r1", "draft.r2", "critique.r2", "publish",
    ]  # fmt: skip
    assert result.loops == [
        {
            "id": "refine",
            "rounds": 2,
            "ended": "until_met",
            "nodes": [["draft.r1", "critique.r1"], ["draft.r2", "critique.r2"]],
        }
    ]
    assert result.to_json()["loops"] == result.loops
    # The reviser of round 2 saw round 1's draft and critique, not only the critique.
    prompt = await _instruction(home, str(result.run_id), "draft.r2")
    assert "### draft.r1 (completed)\ndraft one" in prompt
    assert "### critique.r1 (completed)\ntoo long" in prompt
    # After the loop: the last round's replies, not the first's.
    publish = await _instruction(home, str(result.run_id), "publish")
    assert "draft two" in publish and "LGTM" in publish
    assert "draft one" not in publish
    # show lists the round nodes, and its JSON carries the loop.
    view = await asyncio.to_thread(show_run, home, str(result.run_id))
    assert [n.id for n in view.nodes] == [
        "brief", "draft.r1", "critique.r1", "publish", "draft.r2", "critique.r2",
    ]  # fmt: skip
    assert view.to_json()["loops"][0]["ended"] == "until_met"


async def test_the_round_and_decision_are_recorded_in_the_checkpoint(tmp_path: Path) -> None:
    result = await _run(tmp_path, _refine(), ROUNDS)
    state, _ = await asyncio.to_thread(load_checkpoint, Path(str(result.checkpoint["path"])))
    assert state["ops"]["critique.r1"]["loop"] == {"id": "refine", "round": 1, "next": 2}
    spawned = {e["spawn_id"]: e for e in state["spawned"]}
    assert spawned["critique.r2"]["loop"] == {"id": "refine", "round": 2, "ended": "until_met"}
    assert spawned["draft.r2"]["depends_on"] == ["draft.r1", "critique.r1"]
    assert spawned["critique.r2"]["depends_on"] == ["draft.r2", "draft.r1", "critique.r1"]
    plan_loop = state["plan"][1]["loop"]
    assert plan_loop == {
        "id": "refine",
        "until": {"node": "critique", "contains": "LGTM"},
        "max_rounds": 3,
        "on_max_rounds": "stop",
    }


async def test_max_rounds_ends_the_loop_without_failing(tmp_path: Path) -> None:
    nodes = {k: v for k, v in ROUNDS.items() if k != "critique.r2"}
    result = await _run(tmp_path, _refine(max_rounds=2), nodes)
    assert result.status == "completed"
    assert result.loops[0]["ended"] == "max_rounds"
    assert result.loops[0]["rounds"] == 2
    assert _invocations(tmp_path / "home")[-1] == "publish"
    assert "draft.r3" not in _invocations(tmp_path / "home")


async def test_on_max_rounds_fail_fails_the_run(tmp_path: Path) -> None:
    nodes = {k: v for k, v in ROUNDS.items() if k != "critique.r2"}
    result = await _run(tmp_path, _refine(max_rounds=2, on_max_rounds="fail"), nodes)
    assert result.status == "failed"
    assert result.loops[0]["ended"] == "max_rounds"


async def test_a_failed_body_node_ends_the_loop_failed(tmp_path: Path) -> None:
    nodes = {**ROUNDS, "critique.r1": {"fail": "critic crashed"}}
    result = await _run(tmp_path, _refine(), nodes)
    assert result.status == "failed"
    assert result.loops[0] == {
        "id": "refine",
        "rounds": 1,
        "ended": "failed",
        "nodes": [["draft.r1", "critique.r1"]],
    }
    assert "draft.r2" not in _invocations(tmp_path / "home")
    assert "publish" not in _invocations(tmp_path / "home")


async def test_a_python_until_decides_with_the_rounds_replies(tmp_path: Path) -> None:
    result = await _run(
        tmp_path, _refine(until={"python": "python:loop_fns:approved"}), ROUNDS, allow_python=True
    )
    assert result.status == "completed"
    assert result.loops[0]["ended"] == "until_met"
    assert result.loops[0]["rounds"] == 2


async def test_a_python_until_given_as_a_function_is_kept_as_its_spec(tmp_path: Path) -> None:
    import loop_fns

    plan = _refine(until=loop_fns.never, max_rounds=2)
    assert plan.to_data()["plan"][1]["loop"]["until"] == {"python": "python:loop_fns:never"}
    nodes = {k: v for k, v in ROUNDS.items() if k != "critique.r2"}
    result = await _run(tmp_path, plan, nodes, allow_python=True)
    assert result.loops[0]["ended"] == "max_rounds"


async def test_a_python_until_that_raises_ends_the_loop_failed(tmp_path: Path) -> None:
    plan = _refine(until={"python": "python:loop_fns:broken"})
    result = await _run(tmp_path, plan, ROUNDS, allow_python=True)
    assert result.loops[0]["ended"] == "failed"
    assert "publish" not in _invocations(tmp_path / "home")


async def test_a_python_until_needs_consent(tmp_path: Path) -> None:
    plan = _refine(until={"python": "python:loop_fns:approved"})
    with pytest.raises(UsageError, match="--allow-python"):
        await _run(tmp_path, plan, ROUNDS)
    assert not (tmp_path / "home" / "script-invocations.jsonl").exists()


async def test_a_failed_round_retried_by_a_resume_continues_the_loop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    nodes = {**ROUNDS, "critique.r2": {"fail_once": "critic timed out", "response": "LGTM"}}
    first = await _run(tmp_path, _refine(), nodes)
    assert first.status == "failed"
    assert first.loops[0]["ended"] == "failed"
    seed = await asyncio.to_thread(prepare_resume, home, str(first.run_id), retry_failed=True)
    assert seed.loop_records["critique.r2"] == {"id": "refine", "round": 2, "ended": "failed"}
    again = await run_flow(FlowOptions(resume=seed), home=home)
    assert again.status == "completed", again.to_json()
    assert again.loops[0]["ended"] == "until_met"
    assert again.loops[0]["rounds"] == 2
    # Round 1 and round 2's draft were replayed, not invoked again.
    assert _invocations(home) == [
        "brief", "draft.r1", "critique.r1", "draft.r2", "critique.r2", "critique.r2", "publish",
    ]  # fmt: skip


def _pretend_round_one_ended(path: Path) -> None:
    """Edit a v2 checkpoint: round 1 ended the loop (a resume would never run round 2)."""
    data = json.loads(path.read_text())
    data["ops"]["critique.r1"]["loop"] = {"id": "refine", "round": 1, "ended": "until_met"}
    path.write_text(json.dumps(data))


async def test_a_loop_record_changed_after_it_was_recorded_refuses_the_resume(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    nodes = {**ROUNDS, "critique.r2": {"fail": "critic crashed"}}
    first = await _run(tmp_path, _refine(), nodes, checkpoint_version=2)
    await asyncio.to_thread(_pretend_round_one_ended, Path(str(first.checkpoint["path"])))
    with pytest.raises(FlowResumeError, match=r"'critique\.r1'.*result_digest"):
        await asyncio.to_thread(prepare_resume, home, str(first.run_id), retry_failed=True)


async def test_a_stop_between_rounds_leaves_the_next_round_to_the_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bus = EventBus()
    options = FlowOptions(plan=_refine(), model=_script(tmp_path, ROUNDS))
    run = FlowRun(options, home=home, events=bus)

    def stop_after_round_one(event: FlowEvent) -> None:
        # Round 2 is added (and recorded) before round 1's closing outcome is announced.
        if event.type == "node_completed" and event.node_key == "critique.r1":
            run.request_operator_stop(False, "between rounds", "test-stop")

    bus.subscribe(stop_after_round_one)
    first = await run.run()
    assert first.status == "stopped", first.to_json()
    assert first.loops[0]["ended"] == "stopped"
    assert "draft.r2" not in _invocations(home)
    seed = await asyncio.to_thread(prepare_resume, home, str(first.run_id))
    again = await run_flow(FlowOptions(resume=seed), home=home)
    assert again.status == "completed", again.to_json()
    assert again.loops[0] == {
        "id": "refine",
        "rounds": 2,
        "ended": "until_met",
        "nodes": [["draft.r1", "critique.r1"], ["draft.r2", "critique.r2"]],
    }
    assert _invocations(home).count("critique.r1") == 1


async def test_a_python_until_that_cannot_be_imported_is_refused_before_any_call(
    tmp_path: Path,
) -> None:
    plan = _refine(until={"python": "python:loop_fns:no_such_judge"})
    with pytest.raises(UsageError, match="has no function 'no_such_judge'"):
        await _run(tmp_path, plan, ROUNDS, allow_python=True)
    assert _invocations(tmp_path / "home") == []


async def test_body_entries_may_be_listed_before_what_they_depend_on(tmp_path: Path) -> None:
    plan = Plan(
        ops=[
            Loop(
                "refine",
                body=[
                    Op("critique", "Critique the draft.", depends_on=["draft"]),
                    Op("draft", "Write or revise the draft."),
                ],
                until={"node": "critique", "contains": "LGTM"},
            )
        ]
    )
    result = await _run(tmp_path, plan, ROUNDS)
    assert result.status == "completed", result.to_json()
    assert _invocations(tmp_path / "home") == ["draft.r1", "critique.r1", "draft.r2", "critique.r2"]
    assert result.loops[0]["nodes"] == [["critique.r1", "draft.r1"], ["critique.r2", "draft.r2"]]


async def test_a_node_a_round_spawned_stays_with_its_round(tmp_path: Path) -> None:
    # fact-check waits for critique.r1 too: it is still waiting when round 2 is added,
    # and must not be moved onto round 2 as the loop's dependents are.
    check = {"agent_id": "fact-check", "instruction": "Check.", "depends_on": ["critique.r1"]}
    nodes = {
        **ROUNDS,
        "draft.r1": {"response": "draft one", "spawn": [check]},
        "fact-check": {"response": "facts fine"},
    }
    plan = Plan(ops=list(_refine().ops), reactive="all")
    result = await _run(tmp_path, plan, nodes)
    assert result.status == "completed", result.to_json()
    prompt = await _instruction(tmp_path / "home", str(result.run_id), "fact-check")
    assert "### draft.r1 (completed)\ndraft one" in prompt
    assert "### critique.r1 (completed)\ntoo long" in prompt
    assert "LGTM" not in prompt
    assert result.loops[0]["ended"] == "until_met"
