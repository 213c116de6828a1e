"""Streamed provider calls (issue 31): real SDKs against loopback SSE servers.

The fake servers speak the OpenAI and Anthropic streaming wire formats (HTTP/1.1
chunked ``text/event-stream``); a cut is a body closed without its terminating chunk.
"""

from __future__ import annotations

import threading
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


async def _invoke(server: FakeLLMServer, request: ProviderRequest) -> Any:
    provider = make_provider(SPECS[server.flavour])
    try:
        return await provider.invoke(request)
    finally:
        await provider.aclose()


async def test_streamed_deltas_reach_the_sink_in_order_and_the_reply_is_whole(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    seen: list[str] = []
    server.push(Reply(chunks=["Hel", "lo, ", "wor", "ld"], input_tokens=5, output_tokens=4))
    response = await _invoke(server, make_request(live=seen.append))
    assert seen == ["Hel", "lo, ", "wor", "ld"]
    assert response.text == "Hello, world"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 4)
    assert server.bodies()[0]["stream"] is True


async def test_without_a_sink_the_call_is_not_streamed(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    server.push(Reply(text="plain"))
    response = await _invoke(server, make_request())
    assert response.text == "plain"
    assert "stream" not in server.bodies()[0]


async def test_a_stream_cut_mid_way_is_retried_and_only_the_whole_reply_is_returned(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    seen: list[str] = []
    server.push(
        Reply(chunks=["par", "tial", "never"], cut_after=2),
        Reply(chunks=["com", "plete"], input_tokens=3, output_tokens=2),
    )
    response = await _invoke(server, make_request(live=seen.append))
    assert response.text == "complete"  # nothing of the cut attempt in the reply
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)
    assert len(server.requests) == 2
    joined = "".join(seen)
    assert joined.startswith("partial") and joined.endswith("complete")
    assert "calling again" in joined and "never" not in joined


async def test_a_stream_cut_on_every_attempt_fails_the_call_retryable(
    server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "2")
    server.forever(Reply(chunks=["a", "b", "c"], cut_after=1))
    with pytest.raises(ProviderError, match="gave up after 2 attempt") as caught:
        await _invoke(server, make_request(live=lambda text: None))
    assert caught.value.retryable is True
    assert len(server.requests) == 2


async def test_a_held_stream_has_delivered_its_first_delta_before_it_ends(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    hold = threading.Event()
    first = threading.Event()
    seen: list[str] = []

    def sink(text: str) -> None:
        seen.append(text)
        first.set()

    server.push(Reply(chunks=["one", "two"], hold=hold, hold_after=1))
    import asyncio

    task = asyncio.create_task(_invoke(server, make_request(live=sink)))
    assert await asyncio.to_thread(first.wait, 10)
    assert seen == ["one"] and not task.done()
    hold.set()
    response = await asyncio.wait_for(task, 10)
    assert response.text == "onetwo"


async def test_an_error_status_on_a_streamed_call_is_classified_as_before(
    server: FakeLLMServer, make_request: Callable[..., ProviderRequest]
) -> None:
    server.push(Reply(status=400))
    with pytest.raises(ProviderError, match="HTTP 400") as caught:
        await _invoke(server, make_request(live=lambda text: None))
    assert caught.value.retryable is False


async def test_streamed_calls_in_a_row_survive_a_server_slow_to_close_its_connection(
    server: FakeLLMServer,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38 item 8: the fake closed every streamed connection without saying so, after
    an HTTP/1.1 reply the client keeps for its next request; a next request sent before
    the close arrived met "Server disconnected without sending a response". Here the
    server's thread lingers before closing (a loaded machine, made certain), and no call
    has a second attempt."""
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "1")
    server.forever(Reply(text="in a row", linger=0.3))
    provider = make_provider(SPECS[server.flavour])
    try:
        for _ in range(3):
            response = await provider.invoke(make_request(live=lambda text: None))
            assert response.text == "in a row"
    finally:
        await provider.aclose()
    assert len(server.requests) == 3
