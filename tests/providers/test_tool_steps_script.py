"""The ``script:`` model's ``steps`` (CONTRACT §12): one scripted model request per step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from step_support import FnTool, run_loop

from steerflow.errors import ProviderError, UsageError
from steerflow.providers import INVOCATION_LOG, ScriptProvider
from steerflow.providers._base import (
    Message,
    ModelTurn,
    ProviderRequest,
    StepRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from steerflow.tools._toolset import ToolOutput

pytestmark = pytest.mark.timeout(60)

STEPS: dict[str, Any] = {
    "*": {"usage": {"input_tokens": 1, "output_tokens": 1}},
    "research": {
        "steps": [
            {
                "tool_calls": [
                    {"name": "search", "args": {"q": "steerflow"}},
                    {"name": "fetch", "args": {"url": "https://example.test/"}},
                ],
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
            {"tool_calls": [{"name": "search"}]},
            {"response": "notes: found it", "usage": {"input_tokens": 300, "output_tokens": 50}},
        ]
    },
    "open": {"steps": [{"tool_calls": [{"name": "search", "args": {}}]}]},
    "plain": {"response": "just text", "usage": {"input_tokens": 5, "output_tokens": 2}},
}
TOOLS = (ToolSpec("search", "search", {"type": "object"}),)


def provider(tmp_path: Path, data: object = STEPS) -> ScriptProvider:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(data))
    return ScriptProvider(f"script:{path}")


def node(home: Path, key: str, run_id: str = "run-1") -> ProviderRequest:
    return ProviderRequest(
        run_id=run_id,
        node_key=key,
        node_id="0" * 32,
        kind="planned",
        assignee=None,
        instruction="dig",
        history=(),
        artifact_dir=home / "artifacts" / key,
        home=home,
    )


def step(request: ProviderRequest, number: int) -> StepRequest:
    return StepRequest(request, (Message("user", request.instruction),), TOOLS, number)


def invocations(home: Path) -> list[dict[str, Any]]:
    log = home / INVOCATION_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_steps_play_in_order_with_stable_call_ids_and_usage(tmp_path: Path) -> None:
    script = provider(tmp_path)
    assert script.supports_tools
    request = node(tmp_path, "research")

    first = await script.invoke_step(step(request, 1))
    assert first.text == ""
    assert first.tool_calls == [
        ToolCall("call_1_1", "search", {"q": "steerflow"}),
        ToolCall("call_1_2", "fetch", {"url": "https://example.test/"}),
    ]
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (100, 20)

    second = await script.invoke_step(step(request, 2))
    assert second.tool_calls == [ToolCall("call_2_1", "search", {})]
    assert second.usage is not None and second.usage.input_tokens == 1  # the node's usage

    third = await script.invoke_step(step(request, 3))
    assert (third.text, third.tool_calls) == ("notes: found it", [])
    assert third.usage is not None and third.usage.output_tokens == 50

    # the same step asked again (a resume re-asking an unrecorded request): the same ids
    again = await script.invoke_step(step(request, 1))
    assert [c.call_id for c in again.tool_calls] == ["call_1_1", "call_1_2"]


async def test_each_step_is_logged_with_its_number(tmp_path: Path) -> None:
    script = provider(tmp_path)
    request = node(tmp_path, "research")
    for number in (1, 2, 3):
        await script.invoke_step(step(request, number))
    await script.invoke(node(tmp_path, "plain"))

    log = invocations(tmp_path)
    assert [(line["node"], line.get("step")) for line in log] == [
        ("research", 1),
        ("research", 2),
        ("research", 3),
        ("plain", None),
    ]
    assert list(log[-1]) == ["node", "run_id", "ts"]  # CONTRACT §4's line, unchanged
    assert all(line["run_id"] == "run-1" for line in log)


async def test_running_past_the_last_step_names_node_and_count(tmp_path: Path) -> None:
    script = provider(tmp_path)
    request = node(tmp_path, "open")
    await script.invoke_step(step(request, 1))
    with pytest.raises(ProviderError, match=r"script node 'open' has 1 step\(s\); model request 2"):
        await script.invoke_step(step(request, 2))
    assert [line.get("step") for line in invocations(tmp_path)] == [1, 2]  # both asked


async def test_invoke_without_tools_answers_the_final_response_step(tmp_path: Path) -> None:
    script = provider(tmp_path)
    response = await script.invoke(node(tmp_path, "research"))
    assert response.text == "notes: found it"
    assert response.usage is not None and response.usage.input_tokens == 300

    with pytest.raises(ProviderError, match=r"'open': its steps end in tool calls"):
        await script.invoke(node(tmp_path, "open"))


async def test_a_node_without_steps_answers_its_response_at_step_one(tmp_path: Path) -> None:
    script = provider(tmp_path)
    reply = await script.invoke_step(step(node(tmp_path, "plain"), 1))
    assert (reply.text, reply.tool_calls) == ("just text", [])
    assert reply.usage is not None and reply.usage.input_tokens == 5
    # ... and the plain invoke is as it was
    response = await script.invoke(node(tmp_path, "plain"))
    assert (response.text, response.usage) == (reply.text, reply.usage)


async def test_a_scripted_failure_fails_every_step(tmp_path: Path) -> None:
    data = {"bad": {"fail": "model down", "steps": [{"response": "never"}]}}
    script = provider(tmp_path, data)
    with pytest.raises(ProviderError, match="model down"):
        await script.invoke_step(step(node(tmp_path, "bad"), 1))


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([{"response": "a"}, {"tool_calls": [{"name": "t"}]}], "step 1 is a response"),
        ([{"tool_calls": [{"name": "t"}], "response": "a"}], "either tool_calls or a response"),
        ([{}], "either tool_calls or a response"),
        ([{"tool_calls": []}], "at least 1 item"),
        ([{"tool_calls": [{"name": "t", "argz": {}}]}], "unknown key"),
        ([{"tool_calls": [{"args": {}}]}], "name: Field required"),
        ([], "at least 1 item"),
    ],
)
def test_bad_steps_are_a_usage_error_naming_the_entry(
    tmp_path: Path, steps: list[Any], problem: str
) -> None:
    with pytest.raises(UsageError, match=r"entry 'n'") as caught:
        provider(tmp_path, {"n": {"steps": steps}})
    assert problem in str(caught.value)


async def test_the_loop_over_script_steps(tmp_path: Path) -> None:
    """The real loop: tools run for each scripted call, results paired, the final reply."""
    seen: list[StepRequest] = []
    script = provider(tmp_path)
    play = script.invoke_step

    async def spy(request: StepRequest) -> Any:
        seen.append(request)
        return await play(request)

    script.invoke_step = spy  # type: ignore[method-assign]
    search = FnTool("search", lambda args: ToolOutput(f"hits for {args.get('q')}"))
    fetch = FnTool("fetch", lambda args: ToolOutput("page"))
    response, hooks = await run_loop(script, node(tmp_path, "research"), search, fetch)

    assert response.text == "notes: found it"
    assert response.usage is not None and response.usage.input_tokens == 100 + 1 + 300
    assert [line["step"] for line in invocations(tmp_path)] == [1, 2, 3]
    assert seen[2].conversation[1:] == (
        ModelTurn("", (ToolCall("call_1_1", "search", {"q": "steerflow"}),
                       ToolCall("call_1_2", "fetch", {"url": "https://example.test/"}))),
        ToolResult("call_1_1", "search", "hits for steerflow"),
        ToolResult("call_1_2", "fetch", "page"),
        ModelTurn("", (ToolCall("call_2_1", "search", {}),)),
        ToolResult("call_2_1", "search", "hits for None"),
    )  # fmt: skip
    assert [r["call_id"] for r in hooks.records if r["status"] != "in_flight"] == [
        "intent-1",
        "call_1_1",
        "call_1_2",
        "intent-2",
        "call_2_1",
        "intent-3",
    ]
