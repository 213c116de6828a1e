"""``anthropic/MODEL`` against a loopback Messages API server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
from llm_fakes import FakeLLMServer, Reply

from steerflow.errors import ProviderError, UsageError
from steerflow.plan._model import PlanFile
from steerflow.providers._base import Message, PlanRequest, ProviderRequest
from steerflow.providers._registry import make_provider
from steerflow.providers._remote import SPAWN_GUIDANCE
from steerflow.providers.anthropic import AnthropicProvider


@pytest.fixture
async def provider(anthropic_server: FakeLLMServer) -> AsyncIterator[AnthropicProvider]:
    built = make_provider("anthropic/claude-test")
    assert isinstance(built, AnthropicProvider)
    try:
        yield built
    finally:
        await built.aclose()


def _sent_key(headers: dict[str, str]) -> str | None:
    """The credential a request carried (SDK versions differ in the header used)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth else None


def _plan_request(feedback: str | None = None) -> PlanRequest:
    return PlanRequest(
        prompt="Review PR 7", schema=PlanFile.model_json_schema(), max_entries=5, feedback=feedback
    )


async def test_invoke_sends_system_prompt_and_instruction(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(Reply(text="done", input_tokens=30, output_tokens=4))
    response = await provider.invoke(make_request())

    assert response.text == "done"
    [body] = anthropic_server.bodies()
    assert body["model"] == "claude-test"
    assert body["system"] == "You are a careful coder."
    assert body["messages"] == [{"role": "user", "content": "Write the patch for issue 42."}]
    assert body["max_tokens"] == 8192
    assert _sent_key(anthropic_server.requests[0].headers) == "sk-ant-test"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (30, 4)
    assert response.usage.cost_usd is None


async def test_cache_tokens_count_as_input(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(
        Reply(
            input_tokens=3,
            usage_extra={"cache_read_input_tokens": 100, "cache_creation_input_tokens": 20},
        )
    )
    response = await provider.invoke(make_request())
    assert response.usage is not None
    assert response.usage.input_tokens == 123


async def test_inherited_turns_alternate_and_merge(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    history = (
        Message(role="system", content="sys one"),
        Message(role="system", content="sys two"),
        Message(role="assistant", content="earlier answer"),
        Message(role="user", content="follow-up"),
    )
    await provider.invoke(make_request(history=history))
    body = anthropic_server.bodies()[0]
    assert body["system"] == "sys one\n\nsys two"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == "earlier answer"
    assert body["messages"][2]["content"] == "follow-up\n\nWrite the patch for issue 42."


async def test_overloaded_then_ok_is_retried(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.push(Reply(status=529), Reply(status=429), Reply(text="finally"))
    response = await provider.invoke(make_request())
    assert response.text == "finally"
    assert len(anthropic_server.requests) == 3


async def test_500_forever_gives_up(
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "2")
    anthropic_server.forever(Reply(status=500))
    provider = AnthropicProvider("claude-test")
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.invoke(make_request())
    finally:
        await provider.aclose()
    assert caught.value.retryable is True
    assert len(anthropic_server.requests) == 2


async def test_401_fails_at_once(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    anthropic_server.forever(Reply(status=401))
    with pytest.raises(ProviderError) as caught:
        await provider.invoke(make_request())
    assert caught.value.retryable is False
    assert len(anthropic_server.requests) == 1


async def test_plan_parses_a_fenced_json_reply(
    provider: AnthropicProvider, anthropic_server: FakeLLMServer
) -> None:
    plan = {"plan": [{"agent_id": "a", "instruction": "do a"}]}
    anthropic_server.push(Reply(text="Here it is:\n```json\n" + json.dumps(plan) + "\n```"))
    assert await provider.plan(_plan_request(feedback="missing plan")) == plan
    body = anthropic_server.bodies()[0]
    assert "JSON Schema" in body["system"]
    assert "missing plan" in body["messages"][0]["content"]


async def test_plan_malformed_json_is_a_provider_error(
    provider: AnthropicProvider, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.push(Reply(text='{"plan": [unquoted]}'))
    with pytest.raises(ProviderError, match="not a JSON object"):
        await provider.plan(_plan_request())


async def test_spawn_block_is_parsed(
    provider: AnthropicProvider,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
) -> None:
    reply = 'Reviewed.\n```json\n{"spawn": [{"agent_id": "x", "instruction": "y"}, null]}\n```'
    anthropic_server.push(Reply(text=reply))
    response = await provider.invoke(make_request(allow_spawn=True))
    assert response.spawns == [{"agent_id": "x", "instruction": "y"}, None]
    assert response.text == "Reviewed."
    assert SPAWN_GUIDANCE in anthropic_server.bodies()[0]["system"]


async def test_base_url_without_key_sends_a_placeholder(
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.setenv("STEERFLOW_ANTHROPIC_MAX_TOKENS", "512")
    provider = AnthropicProvider("claude-test")
    try:
        await provider.invoke(make_request(history=()))
    finally:
        await provider.aclose()
    assert _sent_key(anthropic_server.requests[0].headers) == "not-set"
    body = anthropic_server.bodies()[0]
    assert body["max_tokens"] == 512
    assert "system" not in body


def test_no_key_and_no_base_url_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        make_provider("anthropic/claude-test")


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_with_or_without_v1_reaches_messages(
    suffix: str,
    anthropic_server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Users copy the OPENAI_BASE_URL form (ending in /v1); the SDK adds /v1/messages itself.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.base_url + suffix)
    anthropic_server.push(Reply(text="reached"))
    provider = AnthropicProvider("claude-test")
    try:
        response = await provider.invoke(make_request())
    finally:
        await provider.aclose()
    assert response.text == "reached"
    assert [r.path for r in anthropic_server.requests] == ["/v1/messages"]
