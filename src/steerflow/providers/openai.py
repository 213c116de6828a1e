"""The ``openai/MODEL`` provider: any OpenAI-compatible chat-completions server.

Honours ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. With a base URL and no key
(a local server that wants none) a placeholder key is sent. The SDK's own
retries are off; :mod:`steerflow.providers._retry` decides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionToolParam,
    ChatCompletionUserMessageParam,
)

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import (
    ConversationItem,
    Message,
    ModelTurn,
    StepReply,
    StepRequest,
    ToolCall,
    ToolSpec,
    Usage,
)
from steerflow.providers._retry import RetryPolicy
from steerflow.providers._sdk import (
    SDKProvider,
    StreamCut,
    ended_after_final,
    is_event_stream,
    restarted,
)
from steerflow.providers._step_wire import args_json, step_items, tool_args
from steerflow.providers._structured import WireSchema

__all__ = ["PLACEHOLDER_KEY", "OpenAIProvider"]

#: Sent as the API key when only ``OPENAI_BASE_URL`` is set.
PLACEHOLDER_KEY = "not-set"

Emit = Callable[[str], None]


class OpenAIProvider(SDKProvider):
    """Chat completions through the official ``openai`` SDK.

    Args:
        model: Model name sent to the server.
        spec: The ``--model`` spec (defaults to ``openai/MODEL``).
        env: Environment to read settings from (``os.environ`` when None).
        policy: Retry policy (from ``STEERFLOW_PROVIDER_*`` when None).

    Raises:
        UsageError: Neither ``OPENAI_API_KEY`` nor ``OPENAI_BASE_URL`` is set.
    """

    supports_tools: ClassVar[bool] = True  # invoke_step: chat completions with ``tools``

    def __init__(
        self,
        model: str,
        spec: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.spec = spec or f"openai/{model}"
        self.model = model
        self.base_url = env.get("OPENAI_BASE_URL") or None
        key = env.get("OPENAI_API_KEY") or None
        if key is None:
            if self.base_url is None:
                raise UsageError(
                    f"model spec {self.spec!r}: set OPENAI_API_KEY (or OPENAI_BASE_URL for an "
                    "OpenAI-compatible server that needs no key)"
                )
            key = PLACEHOLDER_KEY
        self._api_key = key
        self.policy = policy or RetryPolicy.from_env(env)
        self._client: openai.AsyncOpenAI | None = None
        self._json_mode = True

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client, created on first use (inside the running loop)."""
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self.base_url, max_retries=0
            )
        return self._client

    async def invoke_step(self, request: StepRequest) -> StepReply:
        """One model request of a tool node's loop: a whole (non-streamed) chat completion.

        The node's history and the loop's conversation go as chat messages, the node's
        tools as ``function`` tools; the reply's text, its tool calls in the order given
        (parallel calls included) and its usage come back. Retried like :meth:`invoke`.

        Raises:
            ProviderError: The call failed, the model refused, or a tool call's arguments
                are not a JSON object (naming the tool).
        """
        system, items = step_items(request)
        messages = _step_messages(system, items)
        per_call = self._per_call_s(request.node.timeout_s)
        # An empty ``tools`` array is refused by the API: a step without tools sends none.
        extra: dict[str, Any] = (
            {"tools": [_tool(t) for t in request.tools]} if request.tools else {}
        )

        body = {"model": self.model, "messages": messages, **extra}

        async def attempt() -> Any:
            # The SDK's documented ``post`` (for requests it has no method for), not
            # ``chat.completions.create``: create walks the whole conversation through its
            # TypedDict transform on every request, which a tool loop's growing history
            # makes quadratic (7 of 12 s of CPU in a 60-step loop, profiled); our messages
            # are plain JSON already.
            from openai.types.chat import ChatCompletion

            return await self.client.post(
                "/chat/completions", body=body, cast_to=ChatCompletion,
                options={"timeout": per_call},
            )  # fmt: skip

        reply = self._step_reply(await self._retried(openai, attempt, timeout_s=per_call))
        request.node.emit(reply.text)  # whole, as a non-streamed invoke hands it over
        return reply

    def _step_reply(self, completion: object) -> StepReply:
        """Text, tool calls and usage of one step's chat completion."""
        choices = getattr(completion, "choices", None)
        if not choices:
            raise ProviderError(f"{self.spec}: the server returned no choices")
        message = getattr(choices[0], "message", None)
        calls = [self._tool_call(raw) for raw in getattr(message, "tool_calls", None) or ()]
        content = getattr(message, "content", None)
        if content is None and not calls:
            refusal = getattr(message, "refusal", None)
            if refusal:
                raise ProviderError(f"{self.spec}: the model refused: {refusal}")
        usage = _usage(getattr(completion, "usage", None))
        return StepReply(text=str(content or ""), tool_calls=calls, usage=usage)

    def _tool_call(self, raw: object) -> ToolCall:
        """One ``function`` tool call of a reply, its id kept exactly, its arguments decoded."""
        function = getattr(raw, "function", None)
        name = getattr(function, "name", None)
        call_id = getattr(raw, "id", None)
        if not isinstance(name, str) or not isinstance(call_id, str):
            kind = getattr(raw, "type", None)
            raise ProviderError(f"{self.spec}: a tool call of type {kind!r} has no function name")
        arguments = getattr(function, "arguments", None)
        return ToolCall(call_id, name, tool_args(self.spec, name, arguments))

    async def _call_structured(
        self,
        system: str | None,
        turns: Sequence[Message],
        wire: WireSchema,
        *,
        timeout_s: float | None,
    ) -> tuple[str, object, Usage | None]:
        """A chat completion with ``response_format: json_schema`` (strict when it qualifies).

        The reply's content is the JSON text; the executor parses and validates it, and
        a wrapped schema's ``{"value": ...}`` is unwrapped here.
        """
        messages = _messages(system, turns)
        per_call = self._per_call_s(timeout_s)
        json_schema: dict[str, Any] = {"name": wire.name, "schema": wire.schema}
        if wire.strict:
            json_schema["strict"] = True
        extra: dict[str, Any] = {
            "response_format": {"type": "json_schema", "json_schema": json_schema}
        }

        async def attempt() -> Any:
            return await self.client.chat.completions.create(
                model=self.model, messages=messages, timeout=per_call, **extra
            )

        text, usage = self._reply(await self._retried(openai, attempt, timeout_s=per_call))
        if not wire.wrapped:
            return text, None, usage
        try:
            decoded = json.loads(text)
        except ValueError:
            return text, None, usage  # not JSON: the executor says so and asks again
        value = wire.unwrap(decoded)
        return json.dumps(value, ensure_ascii=False), value, usage

    async def _plan_text(self, system: str, turns: Sequence[Message]) -> tuple[str, Usage | None]:
        """Ask in JSON mode where the server supports it, and remember when it does not."""
        if self._json_mode:
            try:
                return await self._call(system, turns, timeout_s=None, json_mode=True)
            except ProviderError as exc:
                if exc.retryable or not _rejects_json_mode(exc):
                    raise
                # The server refused response_format: ask again without it, and remember.
                self._json_mode = False
        return await self._create(system, turns, timeout_s=None)

    async def _call(
        self,
        system: str | None,
        turns: Sequence[Message],
        *,
        timeout_s: float | None,
        emit: Callable[[str], None] | None = None,
        json_mode: bool = False,
    ) -> tuple[str, Usage | None]:
        messages = _messages(system, turns)
        per_call = self._per_call_s(timeout_s)
        if emit is not None:
            return await self._streamed(messages, per_call, emit)
        extra: dict[str, Any] = {}
        if json_mode:
            extra["response_format"] = {"type": "json_object"}

        async def attempt() -> Any:
            return await self.client.chat.completions.create(
                model=self.model, messages=messages, timeout=per_call, **extra
            )

        return self._reply(await self._retried(openai, attempt, timeout_s=per_call))

    def _reply(self, completion: object) -> tuple[str, Usage | None]:
        """The text and usage of a whole (non-streamed) chat completion."""
        choices = getattr(completion, "choices", None)
        if not choices:
            raise ProviderError(f"{self.spec}: the server returned no choices")
        message = getattr(choices[0], "message", None)
        content = getattr(message, "content", None)
        if content is None:
            refusal = getattr(message, "refusal", None)
            if refusal:
                raise ProviderError(f"{self.spec}: the model refused: {refusal}")
            content = ""
        return str(content), _usage(getattr(completion, "usage", None))

    async def _streamed(
        self, messages: list[ChatCompletionMessageParam], per_call: float, emit: Emit
    ) -> tuple[str, Usage | None]:
        """The streamed call: deltas go to ``emit``, the whole reply is returned.

        Complete once a choice reported its ``finish_reason``, however the stream then
        ends (``[DONE]``, the body's end, the connection dropped); a stream that ends
        before that is a :class:`StreamCut`, retried. A server that ignores ``stream``
        and sends the whole completion as JSON has answered: that is the reply
        (decision 230).
        """
        attempts = 0

        async def attempt() -> tuple[str, Usage | None]:
            nonlocal attempts
            attempts += 1
            restarted(emit, attempts)
            parts: list[str] = []
            finished, usage, refusal = False, None, ""
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                timeout=per_call,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with stream:
                if not is_event_stream(stream.response):
                    return await self._whole(stream.response, ChatCompletion.construct, emit)
                try:
                    async for chunk in stream:
                        usage = _usage(getattr(chunk, "usage", None)) or usage
                        for choice in chunk.choices[:1]:
                            if text := choice.delta.content:
                                parts.append(text)
                                emit(text)
                            refusal += getattr(choice.delta, "refusal", None) or ""
                            finished = finished or choice.finish_reason is not None
                except Exception as exc:
                    if not (finished and ended_after_final(openai, exc)):
                        raise
            if not finished:
                raise StreamCut("the server ended the stream before the reply was complete")
            if not parts and refusal:
                raise ProviderError(f"{self.spec}: the model refused: {refusal}")
            return "".join(parts), usage

        result: tuple[str, Usage | None] = await self._retried(openai, attempt, timeout_s=per_call)
        return result


def _messages(system: str | None, turns: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = []
    if system:
        messages.append(ChatCompletionSystemMessageParam(role="system", content=system))
    for turn in turns:
        if turn.role == "assistant":
            messages.append(
                ChatCompletionAssistantMessageParam(role="assistant", content=turn.content)
            )
        else:
            messages.append(ChatCompletionUserMessageParam(role="user", content=turn.content))
    return messages


def _tool(spec: ToolSpec) -> ChatCompletionToolParam:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _step_messages(
    system: str | None, items: Sequence[ConversationItem]
) -> list[ChatCompletionMessageParam]:
    """Chat messages of one step: a turn with tool calls, then one ``tool`` message per result.

    Call ids go back exactly as the model gave them, so each result pairs with its call.
    """
    messages: list[ChatCompletionMessageParam] = []
    if system:
        messages.append(ChatCompletionSystemMessageParam(role="system", content=system))
    for item in items:
        if isinstance(item, ModelTurn):
            messages.append(_assistant(item))
        elif isinstance(item, Message) and item.role == "system":
            messages.append(ChatCompletionSystemMessageParam(role="system", content=item.content))
        elif isinstance(item, Message):
            messages.extend(_messages(None, [item]))
        else:
            messages.append(
                ChatCompletionToolMessageParam(
                    role="tool", tool_call_id=item.call_id, content=item.content
                )
            )
    return messages


def _assistant(turn: ModelTurn) -> ChatCompletionAssistantMessageParam:
    if not turn.tool_calls:
        return ChatCompletionAssistantMessageParam(role="assistant", content=turn.text)
    calls: list[ChatCompletionMessageToolCallParam] = [
        {
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": args_json(call.args)},
        }
        for call in turn.tool_calls
    ]
    # A turn that only called tools has no text: ``null`` content, as the API returned it.
    return ChatCompletionAssistantMessageParam(
        role="assistant", content=turn.text or None, tool_calls=calls
    )


def _rejects_json_mode(exc: ProviderError) -> bool:
    text = str(exc)
    return ("HTTP 400" in text or "HTTP 422" in text) and "response_format" in text


def _usage(raw: object) -> Usage | None:
    """Token counts, and a cost only when the server itself reports one."""
    if raw is None:
        return None
    extra = getattr(raw, "model_extra", None) or {}
    cost = extra.get("cost")
    if cost is None:
        cost = extra.get("cost_usd")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        cost = None
    # prompt_tokens already counts the cached ones; the details say how many were.
    details = getattr(raw, "prompt_tokens_details", None)
    return Usage(
        input_tokens=_int_or_none(getattr(raw, "prompt_tokens", None)),
        output_tokens=_int_or_none(getattr(raw, "completion_tokens", None)),
        cost_usd=None if cost is None else float(cost),
        cache_read_tokens=_int_or_none(getattr(details, "cached_tokens", None)),
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
