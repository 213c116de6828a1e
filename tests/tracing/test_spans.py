"""A run's spans, read back from the SDK's in-memory exporter (issue 45 item 1).

Real runs in this process (``script:`` model, a ``python:`` tool, a real state DB and
checkpoint); the only stand-in is the exporter, the SDK's own in-memory one.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import steerflow
from steerflow.orchestrate import FlowOptions, FlowRun, NodeStarted, prepare_resume
from steerflow.plan import Op, Plan, Role

TIMEOUT_S = 30.0
TOOLS = ["python:tool_fns:lookup"]


@pytest.fixture(autouse=True)
def _tool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("TOOL_RELEASE", str(tmp_path / "release"))
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    monkeypatch.delenv("STEERFLOW_OTEL", raising=False)


def _script(tmp_path: Path, nodes: dict[str, Any]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(nodes), encoding="utf-8")
    return f"script:{path}"


TOOL_NODE = {
    "steps": [
        {"tool_calls": [{"name": "lookup", "args": {"key": "k"}}],
         "usage": {"input_tokens": 10, "output_tokens": 3}},
        {"response": "done", "usage": {"input_tokens": 12, "output_tokens": 4}},
    ]
}  # fmt: skip


def _plan() -> Plan:
    return Plan(
        [
            Op("a", "look it up", tools=TOOLS, assignee="researcher"),
            Op("b", "write it down", depends_on=["a"]),
        ],
        roles={"researcher": Role()},
    )


async def _run(tmp_path: Path, options: FlowOptions) -> steerflow.FlowResult:
    async with asyncio.timeout(TIMEOUT_S):
        return await FlowRun(options, home=tmp_path / "home").run()


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_run_is_a_tree_of_run_node_request_and_tool_spans(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    (tmp_path / "release").touch()
    nodes = {
        "a": TOOL_NODE,
        "b": {"response": "B", "usage": {"input_tokens": 5, "output_tokens": 2}},
    }
    model = _script(tmp_path, nodes)
    options = FlowOptions(plan=_plan(), model=model, allow_python=True, otel=True)
    result = await _run(tmp_path, options)
    assert result.status == "completed"
    named = _by_name(spans.get_finished_spans())
    [root] = [s for s in spans.get_finished_spans() if s.parent is None]
    assert root.name == f"run {result.run_id}"  # a code plan has no name: the run id
    assert {
        k: _attrs(root)[k]
        for k in ("steerflow.run.id", "steerflow.session.id", "steerflow.run.status",
                  "steerflow.run.exit_code", "gen_ai.usage.input_tokens",
                  "gen_ai.usage.output_tokens", "steerflow.run.kind")
    } == {
        "steerflow.run.id": result.run_id, "steerflow.session.id": result.session_id,
        "steerflow.run.status": "completed", "steerflow.run.exit_code": 0,
        "gen_ai.usage.input_tokens": 27, "gen_ai.usage.output_tokens": 9,
        "steerflow.run.kind": "flow",
    }  # fmt: skip
    assert [e.name for e in root.events].count("checkpoint saved") >= 2
    [node_a], [node_b] = named["node a"], named["node b"]
    assert {_parent(node_a), _parent(node_b)} == {root.context.span_id}
    a = _attrs(node_a)
    assert (a["steerflow.node.key"], a["steerflow.node.kind"], a["steerflow.node.assignee"],
            a["steerflow.node.attempt"], a["steerflow.node.status"]) == (
        "a", "planned", "researcher", 1, "completed")  # fmt: skip
    assert len(a["steerflow.node.id"]) == 32  # the executor's node id (uuid hex)
    requests = named[f"chat {model.removeprefix('script:')}"]
    assert len(requests) == 3  # a's two model steps, b's one call
    under_a = sorted((s for s in requests if _parent(s) == node_a.context.span_id),
                     key=lambda s: s.start_time or 0)  # fmt: skip
    assert [(_attrs(s)["gen_ai.usage.input_tokens"], _attrs(s)["gen_ai.usage.output_tokens"])
            for s in under_a] == [(10, 3), (12, 4)]  # fmt: skip
    first = _attrs(under_a[0])
    said = (first["gen_ai.operation.name"], first["gen_ai.provider.name"],
            first["gen_ai.request.model"])  # fmt: skip
    assert said == ("chat", "script", model.removeprefix("script:"))
    [under_b] = [s for s in requests if _parent(s) == node_b.context.span_id]
    assert _attrs(under_b)["gen_ai.usage.input_tokens"] == 5
    [tool] = named["execute_tool lookup"]
    t = _attrs(tool)
    assert _parent(tool) == node_a.context.span_id
    assert (t["gen_ai.tool.name"], t["gen_ai.operation.name"], t["steerflow.tool.outcome"]) == (
        "lookup", "execute_tool", "completed")  # fmt: skip
    assert t["gen_ai.tool.call.id"] and t["steerflow.tool.duration_s"] >= 0
    everything = [k for s in spans.get_finished_spans() for k in _attrs(s)]
    assert not [k for k in everything if k.endswith(("messages", "arguments"))]  # no content


async def test_content_only_when_the_conventions_switch_says_true(
    tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "release").touch()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    model = _script(tmp_path, {"a": TOOL_NODE, "b": {"response": "the reply"}})
    await _run(tmp_path, FlowOptions(plan=_plan(), model=model, allow_python=True, otel=True))
    named = _by_name(spans.get_finished_spans())
    [tool] = named["execute_tool lookup"]
    assert json.loads(_attrs(tool)["gen_ai.tool.call.arguments"]) == {"key": "k"}
    [node_b] = named["node b"]
    [call_b] = [s for s in spans.get_finished_spans() if _parent(s) == node_b.context.span_id]
    sent = json.loads(_attrs(call_b)["gen_ai.input.messages"])
    assert "write it down" in sent[0]["parts"][0]["content"]
    replied = json.loads(_attrs(call_b)["gen_ai.output.messages"])
    assert replied == [{"role": "assistant", "parts": [{"type": "text", "content": "the reply"}]}]


async def test_a_failed_node_and_the_resume_linked_to_its_run(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    model = _script(tmp_path, {"a": {"response": "A"}, "b": {"fail_once": "flaky"}})
    plan = Plan([Op("a", "first"), Op("b", "second", depends_on=["a"])])
    first = await _run(tmp_path, FlowOptions(plan=plan, model=model, otel=True))
    assert first.status == "failed"
    [failed] = _by_name(spans.get_finished_spans())["node b"]
    assert _attrs(failed)["steerflow.node.status"] == "failed"
    assert "flaky" in _attrs(failed)["steerflow.node.error"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    [first_root] = [s for s in spans.get_finished_spans() if s.parent is None]
    assert _attrs(first_root)["steerflow.run.status"] == "failed"
    spans.clear()
    seed = await asyncio.to_thread(
        prepare_resume, tmp_path / "home", str(first.run_id), retry_failed=True
    )
    second = await _run(tmp_path, FlowOptions(resume=seed, otel=True))
    assert second.status == "completed"
    finished = spans.get_finished_spans()
    [root] = [s for s in finished if s.name.startswith("run ")]
    [link] = root.links
    assert (link.context.trace_id, link.context.span_id) == (
        first_root.context.trace_id, first_root.context.span_id)  # fmt: skip
    # no application span around it: the resume continues the first run's trace
    assert root.context.trace_id == first_root.context.trace_id
    assert _attrs(root)["steerflow.run.kind"] == "resume"
    named = _by_name(finished)
    assert _attrs(named["node a"][0])["steerflow.node.status"] == "replayed"
    assert _attrs(named["node b"][0])["steerflow.node.status"] == "completed"


async def test_an_applications_current_span_is_the_runs_parent(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    model = _script(tmp_path, {"a": {"response": "A"}})
    with trace.get_tracer("app").start_as_current_span("app request") as app:
        result = await _run(
            tmp_path, FlowOptions(plan=Plan([Op("a", "x")]), model=model, otel=True)
        )
    assert result.status == "completed"
    [root] = [s for s in spans.get_finished_spans() if s.name.startswith("run ")]
    assert root.parent is not None and root.parent.span_id == app.get_span_context().span_id
    assert root.context.trace_id == app.get_span_context().trace_id


async def test_a_control_is_a_span_event_with_its_sender(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    model = _script(tmp_path, {"a": {"response": "A", "delay": 20}})
    run = FlowRun(FlowOptions(plan=Plan([Op("a", "x")]), model=model, otel=True),
                  home=tmp_path / "home")  # fmt: skip
    stream = run.events()
    async with asyncio.timeout(TIMEOUT_S), asyncio.TaskGroup() as tasks:
        done = tasks.create_task(run.run())
        async for event in stream:
            if isinstance(event, NodeStarted):
                await asyncio.to_thread(
                    steerflow.stop, tmp_path / "home", str(run.run_id), now=True, reason="enough"
                )
    assert done.result().status != "completed"
    [root] = [s for s in spans.get_finished_spans() if s.name.startswith("run ")]
    [stop] = [e for e in root.events if e.name == "control stop"]
    attributes = dict(stop.attributes or {})
    assert attributes["steerflow.control.result"] == "applied"
    assert attributes["steerflow.control.sender"] not in ("", "unknown")
    [node] = [s for s in spans.get_finished_spans() if s.name == "node a"]
    assert _attrs(node)["steerflow.node.status"] in ("withheld", "unfinished")


async def test_an_agent_run_is_a_trace_of_its_turns(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    from steerflow.orchestrate._agent import run_agent
    from steerflow.orchestrate._agent_options import AgentOptions

    model = _script(tmp_path, {"turn-1": {"response": "R", "usage": {"input_tokens": 3}}})
    async with asyncio.timeout(TIMEOUT_S):
        result = await run_agent(
            AgentOptions(task="the task", model=model, otel=True), home=tmp_path / "home"
        )
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    [root] = [s for s in finished if s.parent is None]
    assert root.name == "run the task"
    assert (_attrs(root)["steerflow.run.kind"], _attrs(root)["steerflow.run.id"]) == (
        "agent", result.run_id)  # fmt: skip
    [turn] = [s for s in finished if s.name == "node turn-1"]
    assert _parent(turn) == root.context.span_id
    t = _attrs(turn)
    assert (t["steerflow.node.kind"], t["steerflow.node.status"]) == ("turn", "completed")
    [call] = [s for s in finished if _parent(s) == turn.context.span_id]
    c = _attrs(call)
    said = (c["gen_ai.provider.name"], c["gen_ai.usage.input_tokens"], c["steerflow.call.attempt"])
    assert said == ("script", 3, 1)


async def test_an_agent_tool_turn_has_its_requests_and_tool_calls_under_the_turn(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """``agent --tool``: each request of the turn's loop and each tool call is a span."""
    from steerflow.orchestrate._agent import run_agent
    from steerflow.orchestrate._agent_options import AgentOptions

    model = _script(tmp_path, {"turn-1": TOOL_NODE})
    async with asyncio.timeout(TIMEOUT_S):
        result = await run_agent(
            AgentOptions(task="the task", model=model, tools=TOOLS, otel=True),
            home=tmp_path / "home",
        )
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    [turn] = [s for s in finished if s.name == "node turn-1"]
    under = [s for s in finished if _parent(s) == turn.context.span_id]
    names = sorted(s.name.split(" ")[0] for s in under)
    assert names == ["chat", "chat", "execute_tool"], [s.name for s in under]
    [tool] = [s for s in under if s.name == "execute_tool lookup"]
    t = _attrs(tool)
    assert (t["gen_ai.tool.name"], t["steerflow.tool.outcome"]) == ("lookup", "completed")
    requests = sorted((s for s in under if s.name.startswith("chat")), key=lambda s: s.start_time)
    tokens = [_attrs(s)["gen_ai.usage.input_tokens"] for s in requests]
    assert tokens == [10, 12]
    assert requests[0].end_time <= tool.start_time <= tool.end_time <= requests[1].start_time


async def test_a_retried_call_is_two_requests_under_one_node(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    model = _script(tmp_path, {"a": {"fail_once": "flaky", "response": "A"}})
    plan = Plan([Op("a", "x", retry={"attempts": 1})])
    result = await _run(tmp_path, FlowOptions(plan=plan, model=model, otel=True))
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    [node] = [s for s in finished if s.name == "node a"]
    assert _attrs(node)["steerflow.node.attempt"] == 2
    calls = sorted((s for s in finished if _parent(s) == node.context.span_id),
                   key=lambda s: s.start_time or 0)  # fmt: skip
    said = [
        (_attrs(s)["steerflow.call.attempt"], _attrs(s)["steerflow.call.outcome"]) for s in calls
    ]
    assert said == [(1, "retried"), (2, "completed")]
    assert calls[0].status.status_code == trace.StatusCode.ERROR


async def test_the_planners_request_is_a_span_of_the_run(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    result = await _run(tmp_path, FlowOptions(prompt="plan something", model="echo", otel=True))
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    [root] = [s for s in finished if s.parent is None]
    [planner] = [s for s in finished if _attrs(s).get("steerflow.node.key") == "planner"]
    assert _parent(planner) == root.context.span_id
    p = _attrs(planner)
    said = (p["gen_ai.provider.name"], p["steerflow.call.attempt"], p["steerflow.call.outcome"])
    assert said == ("echo", 1, "completed")
    assert planner.end_time is not None and root.end_time is not None
    assert planner.end_time <= min(
        s.start_time or 0 for s in finished if s.name.startswith("node ")
    )
