"""A streamed call degrades to the plain one, never fails it (issue 38 item 3, decision 230).

Real SDKs against loopback servers that do not stream the way the SDK expects: one that
ignores ``stream: true`` and answers the whole completion as JSON, one that stops the
event stream at its final chunk (no ``[DONE]`` / no ``message_stop``, the body ended or
the connection dropped), one that refuses a streamed request with HTTP 400. A reply the
server completed is the reply, with its usage, after exactly one request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from llm_fakes import FakeLLMServer, Reply

from steerflow.errors import ProviderError
from steerflow.providers._base import ProviderRequest
from steerflow.providers._registry import make_provider

SPECS = {"openai": "openai/test-model", "anthropic": "anthropic/test-model"}


@pytest.fixture(params=["openai", "anthropic"])
def server(request: pytest.FixtureRequest) -> FakeLLMServer:
    fixture = "openai_server" if request.param == "openai" else "anthropic_server"
    found: FakeLLMServer = request.getfixturevalue(fixture)
    return found


async def _invoke(server: FakeLLMServer, *requests: ProviderRequest) -> list[Any]:
    """Each request in turn through one provider (one client, as in a run)."""
    provider = make_provider(SPECS[server.flavour])
    try:
        return [await provider.invoke(request) for request in requests]
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", None]
)
async def test_a_whole_json_reply_to_a_streamed_request_is_the_reply(
    server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    content_type: str | None,
) -> None:
    seen: list[str] = []
    server.forever(
        Reply(
            text="the whole reply",
            input_tokens=13,
            output_tokens=5,
            stream_as="json",
            content_type=content_type,
        )
    )
    [response] = await _invoke(server, make_request(live=seen.append))
    assert response.text == "the whole reply"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (13, 5)
    assert len(server.requests) == 1  # answered: never asked again
    assert server.bodies()[0]["stream"] is True
    assert seen == ["the whole reply"]  # the live view gets it in one piece


@pytest.mark.parametrize(
    ("flavour", "cut"),
    # (An OpenAI stream whose body ends after its finish chunk was complete already.)
    [("openai", True), ("anthropic", False), ("anthropic", True)],
    ids=["openai-connection-dropped", "anthropic-body-ended", "anthropic-connection-dropped"],
)
async def test_a_stream_that_stops_at_its_final_chunk_is_the_reply(
    request: pytest.FixtureRequest,
    make_request: Callable[..., ProviderRequest],
    flavour: str,
    cut: bool,
) -> None:
    """OpenAI: the ``finish_reason`` chunk (with usage), no ``[DONE]``; Anthropic: the
    ``message_delta`` with ``stop_reason``, no ``message_stop`` (LiteLLM's proxy)."""
    server: FakeLLMServer = request.getfixturevalue(f"{flavour}_server")
    seen: list[str] = []
    server.forever(
        Reply(
            chunks=["fin", "al ", "chunk"],
            input_tokens=9,
            output_tokens=3,
            stream_as="final",
            cut_at_end=cut,
        )
    )
    [response] = await _invoke(server, make_request(live=seen.append))
    assert response.text == "final chunk"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 3)
    assert len(server.requests) == 1
    assert seen == ["fin", "al ", "chunk"]


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (Reply(body={"unexpected": True}, stream_as="json"), "returned no"),
        (
            Reply(body="<html>gateway</html>", stream_as="json", content_type="text/html"),
            "neither an event stream nor a JSON reply (text/html, 20 bytes)",
        ),
    ],
    ids=["json-not-a-reply", "html"],
)
async def test_a_whole_body_that_is_not_a_reply_fails_at_once(
    server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    reply: Reply,
    says: str,
) -> None:
    server.forever(reply)
    with pytest.raises(ProviderError, match=re.escape(says)) as caught:
        await _invoke(server, make_request(live=lambda text: None))
    assert caught.value.retryable is False  # the same server would answer the same again
    assert len(server.requests) == 1


async def test_a_server_that_refuses_streamed_requests_is_asked_without_from_then_on(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    refused = {"error": {"message": "stream_options: extra inputs are not permitted"}}
    server.route('"stream": true', Reply(status=400, body=refused))
    server.forever(Reply(text="plain reply", input_tokens=4, output_tokens=2))
    first: list[str] = []
    second: list[str] = []
    replies = await _invoke(
        server, make_request(live=first.append), make_request(live=second.append)
    )
    assert [r.text for r in replies] == ["plain reply", "plain reply"]
    assert [(r.usage.input_tokens, r.usage.output_tokens) for r in replies] == [(4, 2)] * 2
    # Refused once (not paid for), asked without; the provider remembers.
    assert [body.get("stream", False) for body in server.bodies()] == [True, False, False]
    assert first == second == ["plain reply"]


async def test_an_unrelated_400_on_a_streamed_request_is_not_asked_again(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    bad = {"error": {"message": "upstream model 'test-model' does not exist"}}
    server.forever(Reply(status=400, body=bad))
    with pytest.raises(ProviderError, match="HTTP 400") as caught:
        await _invoke(server, make_request(live=lambda text: None))
    assert caught.value.retryable is False
    assert len(server.requests) == 1
