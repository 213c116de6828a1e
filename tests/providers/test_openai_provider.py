"""``openai/MODEL`` against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest
from llm_fakes import FakeLLMServer, Reply

from steerflow.errors import ProviderError, UsageError
from steerflow.plan._model import PlanFile
from steerflow.providers._base import Message, PlanRequest, ProviderRequest
from steerflow.providers._registry import make_provider
from steerflow.providers._remote import SPAWN_GUIDANCE
from steerflow.providers.openai import OpenAIProvider

SPAWN_REPLY = (
    "Patch written.\n\n```json\n"
    + json.dumps({"spawn": [{"agent_id": "fix-1", "assignee": "coder", "instruction": "fix"}]})
    + "\n```\n"
)


@pytest.fixture
async def provider(openai_server: FakeLLMServer) -> AsyncIterator[OpenAIProvider]:
    built = make_provider("openai/test-model")
    assert isinstance(built, OpenAIProvider)
    try:
        yield built
    finally:
        await built.aclose()


def _plan_request(feedback: str | None = None) -> PlanRequest:
    return PlanRequest(
        prompt="Review PR 7",
        schema=PlanFile.model_json_schema(),
        max_entries=20,
        feedback=feedback,
    )


async def test_invoke_sends_history_and_instruction(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(text="the patch"))
    history = (
        Message(role="system", content="You are a careful coder."),
        Message(role="user", content="earlier question"),
        Message(role="assistant", content="earlier answer"),
    )
    response = await provider.invoke(make_request(history=history))

    assert response.text == "the patch"
    assert response.spawns == []
    [body] = openai_server.bodies()
    assert body["model"] == "test-model"
    assert body["messages"] == [
        {"role": "system", "content": "You are a careful coder."},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "Write the patch for issue 42."},
    ]
    assert "response_format" not in body
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_usage_is_recorded_without_inventing_cost(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(input_tokens=123, output_tokens=45))
    response = await provider.invoke(make_request())
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (123, 45)
    assert response.usage.cost_usd is None


async def test_cost_is_taken_when_the_server_reports_it(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(usage_extra={"cost": 0.0125}))
    response = await provider.invoke(make_request())
    assert response.usage is not None
    assert response.usage.cost_usd == pytest.approx(0.0125)


async def test_429_then_200_is_retried(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(status=429), Reply(text="second time lucky"))
    response = await provider.invoke(make_request())
    assert response.text == "second time lucky"
    assert len(openai_server.requests) == 2


async def test_500_forever_gives_up_after_max_attempts(
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "3")
    openai_server.forever(Reply(status=500))
    provider = OpenAIProvider("test-model")
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.invoke(make_request())
    finally:
        await provider.aclose()
    assert caught.value.retryable is True
    assert "3 attempt" in str(caught.value)
    assert "HTTP 500" in str(caught.value)
    assert len(openai_server.requests) == 3


async def test_default_attempt_count_is_four(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.forever(Reply(status=503))
    with pytest.raises(ProviderError):
        await provider.invoke(make_request())
    assert len(openai_server.requests) == 4


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_fail_at_once(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    status: int,
) -> None:
    openai_server.forever(Reply(status=status))
    with pytest.raises(ProviderError) as caught:
        await provider.invoke(make_request())
    assert caught.value.retryable is False
    assert f"HTTP {status}" in str(caught.value)
    assert len(openai_server.requests) == 1


async def test_slow_reply_times_out_and_is_retried(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(delay=30), Reply(text="quick"))
    started = time.monotonic()
    response = await provider.invoke(make_request(timeout_s=0.3))
    assert response.text == "quick"
    assert len(openai_server.requests) == 2
    assert time.monotonic() - started < 10


async def test_reply_without_choices_is_a_provider_error(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(body={"id": "x", "object": "chat.completion"}))
    with pytest.raises(ProviderError, match="no choices"):
        await provider.invoke(make_request())


async def test_reply_that_is_not_json_is_a_provider_error(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.forever(Reply(body="<html>proxy error</html>"))
    with pytest.raises(ProviderError, match="not JSON") as caught:
        await provider.invoke(make_request())
    assert caught.value.retryable is False
    assert len(openai_server.requests) == 1


async def test_connection_refused_is_transient(
    make_request: Callable[..., ProviderRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "2")
    provider = OpenAIProvider("test-model")
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.invoke(make_request())
    finally:
        await provider.aclose()
    assert caught.value.retryable is True
    assert "connection error" in str(caught.value)


async def test_plan_returns_parsed_json_and_asks_for_json_mode(
    provider: OpenAIProvider, openai_server: FakeLLMServer
) -> None:
    plan = {"plan": [{"agent_id": "a", "assignee": "r", "instruction": "do a"}]}
    openai_server.push(Reply(text=json.dumps(plan)))
    assert await provider.plan(_plan_request()) == plan
    [body] = openai_server.bodies()
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]["content"]
    assert '"agent_id"' in system and "at most 20 entries" in system
    assert body["messages"][1] == {"role": "user", "content": "Review PR 7"}


async def test_plan_includes_feedback(
    provider: OpenAIProvider, openai_server: FakeLLMServer
) -> None:
    openai_server.push(Reply(text='{"plan": []}'))
    await provider.plan(_plan_request(feedback="plan[0].agent_id: bad id"))
    user = openai_server.bodies()[0]["messages"][1]["content"]
    assert user.startswith("Review PR 7")
    assert "plan[0].agent_id: bad id" in user


async def test_plan_malformed_json_is_a_provider_error(
    provider: OpenAIProvider, openai_server: FakeLLMServer
) -> None:
    openai_server.push(Reply(text="Sure! Here is a plan: step one, step two."))
    with pytest.raises(ProviderError, match="not a JSON object"):
        await provider.plan(_plan_request())


async def test_plan_falls_back_when_json_mode_is_refused(
    provider: OpenAIProvider, openai_server: FakeLLMServer
) -> None:
    refusal = {"error": {"message": "response_format is not supported", "type": "invalid"}}
    openai_server.push(Reply(status=400, body=refusal), Reply(text='{"plan": []}'))
    assert await provider.plan(_plan_request()) == {"plan": []}
    first, second = openai_server.bodies()
    assert "response_format" in first
    assert "response_format" not in second


async def test_spawn_block_is_parsed_when_spawning_is_allowed(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(text=SPAWN_REPLY))
    response = await provider.invoke(make_request(allow_spawn=True))
    assert response.spawns == [{"agent_id": "fix-1", "assignee": "coder", "instruction": "fix"}]
    assert response.text == "Patch written."
    system = openai_server.bodies()[0]["messages"][0]["content"]
    assert system.startswith("You are a careful coder.")
    assert SPAWN_GUIDANCE in system


async def test_spawn_block_is_left_alone_when_spawning_is_not_allowed(
    provider: OpenAIProvider,
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    openai_server.push(Reply(text=SPAWN_REPLY))
    response = await provider.invoke(make_request(allow_spawn=False))
    assert response.spawns == []
    assert response.text == SPAWN_REPLY
    assert SPAWN_GUIDANCE not in openai_server.bodies()[0]["messages"][0]["content"]


async def test_base_url_without_key_sends_a_placeholder(
    openai_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    provider = OpenAIProvider("test-model")
    try:
        await provider.invoke(make_request())
    finally:
        await provider.aclose()
    assert openai_server.requests[0].headers["authorization"] == "Bearer not-set"


def test_no_key_and_no_base_url_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="OPENAI_API_KEY"):
        make_provider("openai/gpt-test")
