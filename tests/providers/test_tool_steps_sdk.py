"""``invoke_step`` of ``openai/`` and ``anthropic/`` against loopback servers (issue 39).

The servers are the real HTTP fakes of ``llm_fakes``; the replies are vendor-shaped
bodies with tool calls, and the assertions read the request bodies the server received:
the tool schema, the assistant turn's calls with their ids, the results paired in order.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from llm_fakes import FakeLLMServer, Reply
from step_support import FnTool, run_loop

from steerflow.errors import ProviderError
from steerflow.providers._base import (
    ConversationItem,
    Message,
    ModelTurn,
    ProviderRequest,
    StepRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from steerflow.providers._registry import make_provider
from steerflow.providers.anthropic import AnthropicProvider
from steerflow.providers.openai import OpenAIProvider
from steerflow.tools._toolset import ToolOutput

INSTRUCTION = "Write the patch for issue 42."
SYSTEM = {"role": "system", "content": "You are a careful coder."}
SEARCH = ToolSpec(
    "search",
    "Search the code base",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
ADD = ToolSpec(
    "add",
    "Add two numbers",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)
CALLS = (
    ToolCall("call_Ab9", "search", {"q": "déjà vu"}),
    ToolCall("call_Zz1", "add", {"a": 1, "b": 2}),
)


@pytest.fixture
async def openai_provider(openai_server: FakeLLMServer) -> AsyncIterator[OpenAIProvider]:
    built = make_provider("openai/test-model")
    assert isinstance(built, OpenAIProvider)
    try:
        yield built
    finally:
        await built.aclose()


@pytest.fixture
async def anthropic_provider(
    anthropic_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AnthropicProvider]:
    monkeypatch.setenv("STEERFLOW_ANTHROPIC_MAX_TOKENS", "512")
    built = make_provider("anthropic/test-model")
    assert isinstance(built, AnthropicProvider)
    try:
        yield built
    finally:
        await built.aclose()


def _step(
    node: ProviderRequest, *items: ConversationItem, step: int = 1, tools: tuple[ToolSpec, ...] = ()
) -> StepRequest:
    conversation = (Message("user", node.instruction), *items)
    return StepRequest(node, conversation, tools or (SEARCH, ADD), step)


def _second_step_items() -> tuple[ConversationItem, ...]:
    """The model's parallel calls, their results (the second an error), an operator note."""
    return (
        ModelTurn("Looking.", CALLS),
        ToolResult("call_Ab9", "search", "found in src/a.py"),
        ToolResult("call_Zz1", "add", "boom: overflow", is_error=True),
        Message("user", "operator: prefer small patches"),
    )


# ----------------------------------------------------------------------------- OpenAI


def openai_calls_body(calls: list[tuple[str, str, str]], content: str | None = None) -> Reply:
    """A chat completion asking for ``calls`` (id, name, JSON argument text)."""
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }
    body = {
        "id": "chatcmpl-tools",
        "object": "chat.completion",
        "created": 0,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49, "cost": 0.002},
    }
    return Reply(body=body)


async def test_openai_step_sends_tools_and_reads_parallel_calls(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    args_b = json.dumps({"a": 1, "b": 2})
    openai_server.push(
        openai_calls_body(
            [("call_Ab9", "search", '{"q": "d\\u00e9j\\u00e0 vu"}'), ("call_Zz1", "add", args_b)]
        )
    )
    reply = await openai_provider.invoke_step(_step(make_request()))

    assert reply.text == ""
    assert reply.tool_calls == list(CALLS)  # in order, ids exact, args decoded
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (40, 9)
    assert reply.usage.cost_usd == pytest.approx(0.002)  # the server's cost, as invoke reads it
    [body] = openai_server.bodies()
    assert body["model"] == "test-model"
    assert "stream" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the code base",
                "parameters": SEARCH.parameters,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers",
                "parameters": ADD.parameters,
            },
        },
    ]
    assert body["messages"] == [SYSTEM, {"role": "user", "content": INSTRUCTION}]


async def test_openai_step_sends_calls_and_results_paired_in_order(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(text="Patched src/a.py.", input_tokens=80, output_tokens=5))
    history = (Message("system", "You are a careful coder."), Message("user", "earlier"))
    reply = await openai_provider.invoke_step(
        _step(make_request(history=history), *_second_step_items(), step=2)
    )

    assert (reply.text, reply.tool_calls) == ("Patched src/a.py.", [])
    assert reply.usage is not None and reply.usage.input_tokens == 80
    [body] = openai_server.bodies()
    assert body["messages"] == [
        SYSTEM,
        {"role": "user", "content": "earlier"},
        {"role": "user", "content": INSTRUCTION},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_Ab9",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "déjà vu"}'},
                },
                {
                    "id": "call_Zz1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_Ab9", "content": "found in src/a.py"},
        {"role": "tool", "tool_call_id": "call_Zz1", "content": "boom: overflow"},
        {"role": "user", "content": "operator: prefer small patches"},
    ]


async def test_openai_unparseable_arguments_fail_the_step_naming_the_tool(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(openai_calls_body([("call_1", "search", '{"q": "unterminated')]))
    with pytest.raises(ProviderError, match=r"tool call 'search' are not JSON") as caught:
        await openai_provider.invoke_step(_step(make_request()))
    assert not caught.value.retryable
    assert len(openai_server.requests) == 1  # not retried: the same reply would come back

    openai_server.push(openai_calls_body([("call_2", "add", "[1, 2]")]))
    with pytest.raises(ProviderError, match=r"tool call 'add' are not a JSON object"):
        await openai_provider.invoke_step(_step(make_request()))


async def test_openai_step_is_retried_and_a_step_without_tools_sends_none(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(status=429), Reply(text="no tools needed"))
    live: list[str] = []
    node = make_request(live=live.append)
    reply = await openai_provider.invoke_step(
        StepRequest(node, (Message("user", INSTRUCTION),), (), 1)
    )
    assert reply.text == "no tools needed"
    assert live == ["no tools needed"]  # whole, to the live view
    first, second = openai_server.bodies()  # the 429 retried under the provider's policy
    assert first == second
    assert "tools" not in second  # the API refuses an empty tools array


async def test_openai_refusal_without_calls_fails_the_step(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    reply = openai_calls_body([])
    assert isinstance(reply.body, dict)
    reply.body["choices"][0]["message"] = {"role": "assistant", "content": None, "refusal": "no"}
    openai_server.push(reply)
    with pytest.raises(ProviderError, match="the model refused: no"):
        await openai_provider.invoke_step(_step(make_request()))


async def test_openai_loop_runs_tools_then_answers(
    openai_provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    """The real loop over the provider: the second request carries both results in order."""
    openai_server.push(
        openai_calls_body([("call_x", "search", '{"q": "bug"}'), ("call_y", "search", "")]),
        Reply(text="done"),
    )
    search = FnTool("search", lambda args: ToolOutput(f"hits for {args.get('q', '*')}"))
    response, hooks = await run_loop(openai_provider, make_request(), search)

    assert response.text == "done"
    assert search.calls == [{"q": "bug"}, {}]  # "" arguments: a call without any
    assert hooks.steps == [1, 2]
    second = openai_server.bodies()[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert second[2]["content"] is None  # a turn that only called tools: null, as it came
    assert [c["function"]["arguments"] for c in second[2]["tool_calls"]] == ['{"q": "bug"}', "{}"]
    assert [(m["tool_call_id"], m["content"]) for m in second[3:]] == [
        ("call_x", "hits for bug"),
        ("call_y", "hits for *"),
    ]
    assert [r["call_id"] for r in hooks.records if r["type"] == "tool"] == [
        "call_x",
        "call_x",
        "call_y",
        "call_y",
    ]


# -------------------------------------------------------------------------- Anthropic


def anthropic_tool_use_body(blocks: list[dict[str, Any]]) -> Reply:
    body = {
        "id": "msg_tools",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": blocks,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 12, "cache_read_input_tokens": 10},
    }
    return Reply(body=body)


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.call_id, "name": call.name, "input": call.args}


async def test_anthropic_step_sends_tools_and_reads_tool_use(
    anthropic_provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(
        anthropic_tool_use_body(
            [{"type": "text", "text": "Looking."}, _tool_use(CALLS[0]), _tool_use(CALLS[1])]
        )
    )
    reply = await anthropic_provider.invoke_step(_step(make_request()))

    assert reply.text == "Looking."
    assert reply.tool_calls == list(CALLS)
    assert reply.usage is not None
    # the same accounting as invoke: cache reads count as input, and are reported apart
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (40, 12)
    assert reply.usage.cache_read_tokens == 10
    [body] = anthropic_server.bodies()
    assert body["system"] == "You are a careful coder."
    assert body["max_tokens"] == 512
    assert body["tools"] == [
        {
            "name": "search",
            "description": "Search the code base",
            "input_schema": SEARCH.parameters,
        },
        {"name": "add", "description": "Add two numbers", "input_schema": ADD.parameters},
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}
    ]


async def test_anthropic_results_of_one_turn_travel_in_one_user_message(
    anthropic_provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(Reply(text="Patched src/a.py."))
    history = (
        Message("system", "You are a careful coder."),
        Message("assistant", "inherited answer"),  # a branch that starts with the assistant
    )
    reply = await anthropic_provider.invoke_step(
        _step(make_request(history=history), *_second_step_items(), step=2)
    )

    assert (reply.text, reply.tool_calls) == ("Patched src/a.py.", [])
    [body] = anthropic_server.bodies()
    assert body["system"] == "You are a careful coder."
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "(The conversation so far follows.)"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "inherited answer"}]},
        {"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Looking."}, *map(_tool_use, CALLS)],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_Ab9",
                    "content": "found in src/a.py",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_Zz1",
                    "content": "boom: overflow",
                    "is_error": True,
                },
                {"type": "text", "text": "operator: prefer small patches"},
            ],
        },
    ]


async def test_anthropic_tool_use_without_object_input_names_the_tool(
    anthropic_provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(
        anthropic_tool_use_body([{"type": "tool_use", "id": "toolu_1", "name": "add", "input": 3}])
    )
    with pytest.raises(ProviderError, match=r"tool call 'add' are not a JSON object"):
        await anthropic_provider.invoke_step(_step(make_request()))


async def test_anthropic_loop_runs_tools_then_answers(
    anthropic_provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(
        anthropic_tool_use_body(
            [_tool_use(ToolCall("toolu_1", "add", {"a": 2, "b": 3})), _tool_use(CALLS[0])]
        ),
        Reply(text="5, and found it"),
    )
    add = FnTool("add", lambda args: ToolOutput(str(args["a"] + args["b"])))
    search = FnTool("search", lambda args: ToolOutput("no hits", is_error=True))
    response, hooks = await run_loop(anthropic_provider, make_request(), add, search)

    assert response.text == "5, and found it"
    assert response.usage is not None and response.usage.output_tokens == 12 + 7
    assert hooks.steps == [1, 2]
    second = anthropic_server.bodies()[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert [(b["tool_use_id"], b["content"], b["is_error"]) for b in second[2]["content"]] == [
        ("toolu_1", "5", False),
        ("call_Ab9", "no hits", True),
    ]
