"""Results in hand and typed outputs from Python (issue 40 items 2 and 3).

Real flows (state DB, v3 checkpoint) answered by ``script:`` and ``python:`` models:
``FlowResult.outcomes``/``response``/``output`` give each node's response, output and
usage without another read; ``output`` parses into a pydantic model, a dataclass or a
TypedDict; ``NodeCompleted`` carries the same three; a function node's return value is
its output and a dependent function sees it as data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from typing_extensions import TypedDict

import fn_nodes
from steerflow.checkpoint import load_checkpoint
from steerflow.errors import PlanValidationError, UnknownIdError, UsageError
from steerflow.orchestrate import FlowOptions, FlowResult, FlowRun, NodeCompleted, RunEvent
from steerflow.plan import Op, Plan, Role
from waiting import wait_until_async

HOLD_S = 30.0


class Score(BaseModel):
    title: str
    score: int


@dataclasses.dataclass
class ScoreDC:
    title: str
    score: int


class ScoreTD(TypedDict):
    title: str
    score: int


REPLY = {"title": "déjà vu", "score": 7}


def _script(tmp_path: Path, nodes: dict[str, Any]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(nodes, allow_unicode=True), encoding="utf-8")
    return f"script:{path}"


async def _run(tmp_path: Path, plan: Plan, model: str, **options: Any) -> FlowResult:
    run = FlowRun(FlowOptions(plan=plan, model=model, **options), home=tmp_path / "home")
    async with asyncio.timeout(HOLD_S):
        return await run.run()


async def test_output_parses_into_a_model_a_dataclass_and_a_typeddict(tmp_path: Path) -> None:
    usage = {"input_tokens": 12, "output_tokens": 4}
    script = {key: {"response": REPLY, "usage": usage} for key in ("m", "d", "t", "j")}
    script["plain"] = {"response": "just text"}
    plan = Plan(
        [
            Op("m", "rate", output_schema=Score),
            Op("d", "rate", output_schema=ScoreDC),
            Op("t", "rate", output_schema=ScoreTD),
            Op("j", "rate", output_schema=Score.model_json_schema()),
            Op("plain", "say something"),
        ]
    )
    result = await _run(tmp_path, plan, _script(tmp_path, script))
    assert result.status == "completed"
    # each Op's class is the default; another class can be asked for
    assert result.output("m") == Score(title="déjà vu", score=7)
    assert result.output("d") == ScoreDC("déjà vu", 7)
    assert result.output("t") == REPLY and isinstance(result.output("t"), dict)
    assert result.output("j") == REPLY  # a plain schema: the JSON value
    assert result.output("j", Score) == Score(title="déjà vu", score=7)
    assert result.output("m", ScoreDC) == ScoreDC("déjà vu", 7)
    assert result.output("plain") is None and result.response("plain") == "just text"
    assert json.loads(str(result.response("m"))) == REPLY
    outcome = result.outcomes["m"]
    assert (outcome.status, outcome.output, outcome.error) == ("completed", REPLY, None)
    assert outcome.usage is not None and outcome.usage["input_tokens"] == 12
    assert "outcomes" not in result.to_json()  # --json prints none of it (decision 287)
    assert all(set(n) <= {"id", "kind", "status", "assignee"} for n in result.to_json()["nodes"])


async def test_unknown_node_and_a_class_that_does_not_fit_are_clear_errors(
    tmp_path: Path,
) -> None:
    plan = Plan([Op("first", "rate", output_schema=Score), Op("second", "x")])
    script = {"first": {"response": REPLY}}
    result = await _run(tmp_path, plan, _script(tmp_path, script))
    with pytest.raises(UnknownIdError, match=r"has no node 'frist' \(nodes: first, second\)"):
        result.output("frist")
    with pytest.raises(UnknownIdError, match="'nope'"):
        result.response("nope")

    class Other(BaseModel):
        missing: int

    with pytest.raises(UsageError, match="the output of node 'first' does not parse as Other"):
        result.output("first", Other)


async def test_node_completed_carries_response_output_and_usage(tmp_path: Path) -> None:
    usage = {"input_tokens": 3, "output_tokens": 2}
    script = {"a": {"response": REPLY, "usage": usage}, "b": {"response": "B", "usage": usage}}
    plan = Plan([Op("a", "rate", output_schema=Score), Op("b", "next", depends_on=["a"])])
    run = FlowRun(FlowOptions(plan=plan, model=_script(tmp_path, script)), home=tmp_path / "h")
    stream = run.events()
    seen: list[RunEvent] = []
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        task = tasks.create_task(run.run())
        async for event in stream:
            seen.append(event)
    assert task.result().status == "completed"
    done = {e.key: e for e in seen if isinstance(e, NodeCompleted)}
    assert json.loads(str(done["a"].response)) == REPLY and done["a"].output == REPLY
    assert done["b"].response == "B" and done["b"].output is None
    for event in done.values():
        assert event.usage is not None
        assert (event.usage["input_tokens"], event.usage["output_tokens"]) == (3, 2)
    # once run() has begun, a new stream is refused, saying to open it first
    with pytest.raises(UsageError, match="open the stream first"):
        run.events()


async def test_events_opened_while_the_run_is_under_way_are_refused(tmp_path: Path) -> None:
    script = {"a": {"response": "A", "delay": 0.2}}
    run = FlowRun(FlowOptions(plan=Plan([Op("a", "x")]), model=_script(tmp_path, script)),
                  home=tmp_path / "h")  # fmt: skip
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        task = tasks.create_task(run.run())
        await wait_until_async(lambda: run._begun, timeout=5, what="run() to begin")
        with pytest.raises(UsageError, match=r"called after run\(\) began"):
            run.events()
    assert task.result().status == "completed"


async def test_a_function_node_returns_its_output_and_its_dependent_sees_it(
    tmp_path: Path,
) -> None:
    fn_nodes.reset()
    plan = Plan(
        [
            Op("rate", "rate", output_schema=Score),
            Op(
                "judge",
                "judge it",
                assignee="fn",
                depends_on=["rate"],
                output_schema=fn_nodes.Verdict,
            ),
        ],
        roles={"fn": Role(model="python:fn_nodes:judge")},
    )
    result = await _run(
        tmp_path, plan, _script(tmp_path, {"rate": {"response": REPLY}}), allow_python=True
    )
    assert result.status == "completed", result.outcomes
    (call,) = fn_nodes.SEEN
    assert call.outputs == {"rate": REPLY}
    assert call.dependencies[0].output == REPLY
    assert result.output("judge") == fn_nodes.Verdict(ok=True, seen={"rate": REPLY})


async def test_a_script_reply_that_never_fits_is_asked_again_then_fails(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = Plan([Op("a", "rate", output_schema=Score, retry={"attempts": 3})])
    model = _script(tmp_path, {"a": {"response": "not json at all"}})
    run = FlowRun(FlowOptions(plan=plan, model=model), home=home)
    async with asyncio.timeout(HOLD_S):
        result = await run.run()
    assert result.status == "failed"
    error = result.outcomes["a"].error
    assert error is not None and "after 4 calls" in error and "not JSON" in error
    log = (home / "script-invocations.jsonl").read_text().splitlines()
    assert [json.loads(line)["node"] for line in log] == ["a"] * 4


def test_a_typed_node_with_tools_is_refused_in_code_and_in_a_file(tmp_path: Path) -> None:
    message = r"plan\[0\] \('a'\)\.output_schema: a node with tools cannot have an output_schema"
    with pytest.raises(PlanValidationError, match=message):
        Plan([Op("a", "x", tools=["python:fn_nodes:record"], output_schema=Score)])
    path = tmp_path / "p.yaml"
    entry = {"agent_id": "a", "instruction": "x", "output_schema": {"type": "object"}}
    path.write_text(yaml.safe_dump({"tools": ["python:fn_nodes:record"], "plan": [entry]}))
    with pytest.raises(PlanValidationError, match=message):
        Plan.from_file(path)


async def test_a_reask_the_budget_has_no_room_for_is_not_sent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    usage = {"input_tokens": 6, "output_tokens": 4}
    model = _script(tmp_path, {"a": {"response": {"title": 1}, "usage": usage}})
    plan = Plan([Op("a", "rate", output_schema=Score, retry={"attempts": 3})])
    run = FlowRun(FlowOptions(plan=plan, model=model, max_tokens=15), home=home)
    async with asyncio.timeout(HOLD_S):
        result = await run.run()
    # the first reply (10 tokens) leaves no room for another of its size under 15
    assert result.status == "budget_exhausted"
    assert result.outcomes["a"].status == "pending"  # asked again by a resume
    log = (home / "script-invocations.jsonl").read_text().splitlines()
    assert len(log) == 1
    assert result.usage["input_tokens"] == 6 and result.usage["output_tokens"] == 4


async def test_an_escalation_retry_of_a_typed_node_is_typed_and_records_its_output(
    tmp_path: Path,
) -> None:
    weak = tmp_path / "weak.yaml"
    weak.write_text(yaml.safe_dump({"rate": {"response": "no JSON here"}}), encoding="utf-8")
    strong = tmp_path / "strong.yaml"
    strong.write_text(yaml.safe_dump({"rate.esc1": {"response": REPLY}}), encoding="utf-8")
    plan = Plan(
        [Op("rate", "rate", assignee="r", output_schema=Score, retry={"attempts": 0})],
        roles={"r": Role(model=f"script:{weak}", escalation=[f"script:{strong}"])},
    )
    result = await _run(tmp_path, plan, "echo")
    assert result.status == "completed", result.outcomes
    assert result.outcomes["rate"].status == "failed"
    assert result.output("rate.esc1", Score) == Score(title="déjà vu", score=7)
    assert result.run_dir is not None
    state, _ = load_checkpoint(Path(result.run_dir) / "checkpoint.json")
    (retry,) = state["spawned"]
    assert retry["spawn_id"] == "rate.esc1" and retry["output"] == REPLY


async def test_a_results_repr_leaves_its_responses_out(tmp_path: Path) -> None:
    # asyncio.run formats its main task's repr at the end; a batch's responses must not
    # be copied into one more string there (decision 388).
    reply = "r" * 5000 + "-marker"
    plan = Plan([Op("a", "say"), Op("b", "say", depends_on=["a"])])
    result = await _run(
        tmp_path, plan, _script(tmp_path, {"a": {"response": reply}, "b": {"response": "x"}})
    )
    assert result.status == "completed"
    assert result.response("a") == reply
    assert "-marker" not in repr(result)
    assert "outcomes" not in repr(result)
