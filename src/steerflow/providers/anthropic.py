"""The ``anthropic/MODEL`` provider: the Anthropic Messages API.

Honours ``ANTHROPIC_BASE_URL`` (the server root, with or without a trailing ``/v1``:
the SDK appends ``/v1/messages`` itself) and ``ANTHROPIC_API_KEY`` (or
``ANTHROPIC_AUTH_TOKEN``). With a base URL and no credentials a placeholder key
is sent. The SDK's own retries are off; :mod:`steerflow.providers._retry`
decides. ``STEERFLOW_ANTHROPIC_MAX_TOKENS`` sets ``max_tokens`` (default 8192).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import anthropic
from anthropic.types import ContentBlockParam, MessageParam, ToolParam
from anthropic.types import Message as AnthropicMessage

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
from steerflow.providers._env import env_float
from steerflow.providers._retry import RetryPolicy
from steerflow.providers._sdk import (
    SDKProvider,
    StreamCut,
    ended_after_final,
    is_event_stream,
    restarted,
)
from steerflow.providers._step_wire import step_items, tool_args
from steerflow.providers._structured import WireSchema

__all__ = ["DEFAULT_MAX_TOKENS", "PLACEHOLDER_KEY", "AnthropicProvider", "normalize_base_url"]

DEFAULT_MAX_TOKENS = 8192
#: Sent as the API key when only ``ANTHROPIC_BASE_URL`` is set.
PLACEHOLDER_KEY = "not-set"


def normalize_base_url(url: str | None) -> str | None:
    """``ANTHROPIC_BASE_URL`` as the SDK wants it: the root, without a trailing ``/v1``.

    ``OPENAI_BASE_URL`` conventionally ends in ``/v1`` and users copy that form; the
    Anthropic SDK adds ``/v1/messages`` itself, so ``.../v1`` would reach ``/v1/v1/messages``.
    """
    if url is None:
        return None
    return url.rstrip("/").removesuffix("/v1")


class AnthropicProvider(SDKProvider):
    """Messages through the official ``anthropic`` SDK.

    Args:
        model: Model name sent to the server.
        spec: The ``--model`` spec (defaults to ``anthropic/MODEL``).
        env: Environment to read settings from (``os.environ`` when None).
        policy: Retry policy (from ``STEERFLOW_PROVIDER_*`` when None).

    Raises:
        UsageError: No credentials and no base URL, or a bad max-tokens value.
    """

    supports_tools: ClassVar[bool] = True  # invoke_step: Messages with ``tools``

    def __init__(
        self,
        model: str,
        spec: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.spec = spec or f"anthropic/{model}"
        self.model = model
        self.base_url = normalize_base_url(env.get("ANTHROPIC_BASE_URL") or None)
        self._api_key = env.get("ANTHROPIC_API_KEY") or None
        self._auth_token = env.get("ANTHROPIC_AUTH_TOKEN") or None
        if self._api_key is None and self._auth_token is None:
            if self.base_url is None:
                raise UsageError(
                    f"model spec {self.spec!r}: set ANTHROPIC_API_KEY (or ANTHROPIC_BASE_URL "
                    "for a compatible server that needs no key)"
                )
            self._api_key = PLACEHOLDER_KEY
        max_tokens = env_float(env, "STEERFLOW_ANTHROPIC_MAX_TOKENS", DEFAULT_MAX_TOKENS, minimum=1)
        if max_tokens != int(max_tokens):
            raise UsageError("STEERFLOW_ANTHROPIC_MAX_TOKENS must be a whole number")
        self.max_tokens = int(max_tokens)
        self.policy = policy or RetryPolicy.from_env(env)
        self._client: anthropic.AsyncAnthropic | None = None

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        """The SDK client, created on first use (inside the running loop)."""
        if self._client is None:
            self._client = anthropic.AsyncAnthropic(
                api_key=self._api_key,
                auth_token=self._auth_token,
                base_url=self.base_url,
                max_retries=0,
            )
        return self._client

    async def _call(
        self,
        system: str | None,
        turns: Sequence[Message],
        *,
        timeout_s: float | None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, Usage | None]:
        messages = _messages(turns)
        per_call = self._per_call_s(timeout_s)
        extra: dict[str, Any] = {"system": system} if system else {}
        if emit is not None:
            return await self._streamed(messages, extra, per_call, emit)

        async def attempt() -> Any:
            return await self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                messages=messages,
                timeout=per_call,
                **extra,
            )

        return self._reply(await self._retried(anthropic, attempt, timeout_s=per_call))

    async def _call_structured(
        self,
        system: str | None,
        turns: Sequence[Message],
        wire: WireSchema,
        *,
        timeout_s: float | None,
    ) -> tuple[str, object, Usage | None]:
        """A Messages call forced to use one tool whose ``input_schema`` is the schema.

        The ``tool_use`` block's input is the output (a wrapped schema's ``value``); a
        reply without one returns its text, which the executor parses or re-asks about.
        """
        messages = _messages(turns)
        per_call = self._per_call_s(timeout_s)
        extra: dict[str, Any] = {"system": system} if system else {}
        tool: ToolParam = {
            "name": wire.name,
            "description": "Give your answer as this tool's input.",
            "input_schema": wire.schema,
        }

        async def attempt() -> Any:
            return await self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                messages=messages,
                timeout=per_call,
                tools=[tool],
                tool_choice={"type": "tool", "name": wire.name},
                **extra,
            )

        reply = await self._retried(anthropic, attempt, timeout_s=per_call)
        usage = _usage(getattr(reply, "usage", None))
        for block in getattr(reply, "content", None) or ():
            if getattr(block, "type", "") == "tool_use" and getattr(block, "name", "") == wire.name:
                value = wire.unwrap(getattr(block, "input", None))
                return json.dumps(value, ensure_ascii=False), value, usage
        text, _ = self._reply(reply)
        return text, None, usage

    async def invoke_step(self, request: StepRequest) -> StepReply:
        """One model request of a tool node's loop: a whole (non-streamed) Messages call.

        The system prompt goes apart, the turns as content blocks (``tool_use`` in the
        assistant's, every result of one reply as ``tool_result`` blocks of one user
        message), the node's tools with their ``input_schema``. Retried like :meth:`invoke`.

        Raises:
            ProviderError: The call failed, the model refused, or a ``tool_use`` input is
                not a JSON object (naming the tool).
        """
        system, items = step_items(request)
        extra_system, messages = _step_messages(items)
        system = "\n\n".join(part for part in (system, *extra_system) if part) or None
        per_call = self._per_call_s(request.node.timeout_s)
        extra: dict[str, Any] = {"system": system} if system else {}
        if request.tools:
            extra["tools"] = [_tool(t) for t in request.tools]

        async def attempt() -> Any:
            return await self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                messages=messages,
                timeout=per_call,
                **extra,
            )

        reply = self._step_reply(await self._retried(anthropic, attempt, timeout_s=per_call))
        request.node.emit(reply.text)  # whole, as a non-streamed invoke hands it over
        return reply

    def _step_reply(self, reply: object) -> StepReply:
        """Text blocks joined, ``tool_use`` blocks as calls in their order, and usage."""
        blocks = getattr(reply, "content", None)
        if blocks is None:
            raise ProviderError(f"{self.spec}: the server returned no content")
        parts: list[str] = []
        calls: list[ToolCall] = []
        for block in blocks:
            kind = getattr(block, "type", "")
            if kind == "text":
                parts.append(str(getattr(block, "text", "")))
            elif kind == "tool_use":
                name = str(getattr(block, "name", ""))
                args = tool_args(self.spec, name, getattr(block, "input", None))
                calls.append(ToolCall(str(getattr(block, "id", "")), name, args))
        text = "".join(parts)
        if not text and not calls and getattr(reply, "stop_reason", None) == "refusal":
            raise ProviderError(f"{self.spec}: the model refused the request")
        return StepReply(text=text, tool_calls=calls, usage=_usage(getattr(reply, "usage", None)))

    def _reply(self, reply: object) -> tuple[str, Usage | None]:
        """The text and usage of a whole (non-streamed) Messages reply."""
        blocks = getattr(reply, "content", None)
        if blocks is None:
            raise ProviderError(f"{self.spec}: the server returned no content")
        text = "".join(
            str(getattr(block, "text", ""))
            for block in blocks
            if getattr(block, "type", "") == "text"
        )
        if not text and getattr(reply, "stop_reason", None) == "refusal":
            raise ProviderError(f"{self.spec}: the model refused the request")
        return text, _usage(getattr(reply, "usage", None))

    async def _streamed(
        self,
        messages: list[MessageParam],
        extra: dict[str, Any],
        per_call: float,
        emit: Callable[[str], None],
    ) -> tuple[str, Usage | None]:
        """The streamed call: text deltas go to ``emit``, the whole reply is returned.

        Complete once a ``message_delta`` carried the ``stop_reason`` (or at
        ``message_stop``), however the stream then ends: a proxy may stop before
        ``message_stop``. A stream that ends before is a :class:`StreamCut`, retried
        whole. Usage is ``message_start``'s input counts and the last
        ``message_delta``'s output count. A whole JSON reply (the server did not
        stream) is the reply (decision 230).
        """
        attempts = 0

        async def attempt() -> tuple[str, Usage | None]:
            nonlocal attempts
            attempts += 1
            restarted(emit, attempts)
            parts: list[str] = []
            counts: dict[str, Any] = {}
            stop_reason: object = None
            stopped = False
            stream = await self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                messages=messages,
                timeout=per_call,
                stream=True,
                **extra,
            )
            async with stream:
                if not is_event_stream(stream.response):
                    return await self._whole(stream.response, AnthropicMessage.construct, emit)
                try:
                    async for event in stream:
                        kind = event.type
                        if kind == "message_start":
                            counts.update(_counts(event.message.usage))
                        elif kind == "content_block_delta" and event.delta.type == "text_delta":
                            parts.append(event.delta.text)
                            emit(event.delta.text)
                        elif kind == "message_delta":
                            stop_reason = event.delta.stop_reason
                            stopped = stopped or stop_reason is not None
                            counts.update(_counts(event.usage))
                        elif kind == "message_stop":
                            stopped = True
                except Exception as exc:
                    if not (stopped and ended_after_final(anthropic, exc)):
                        raise
            if not stopped:
                raise StreamCut("the server ended the stream before its stop_reason")
            if not parts and stop_reason == "refusal":
                raise ProviderError(f"{self.spec}: the model refused the request")
            return "".join(parts), _usage(SimpleNamespace(**counts)) if counts else None

        result: tuple[str, Usage | None] = await self._retried(
            anthropic, attempt, timeout_s=per_call
        )
        return result


def _counts(raw: object) -> dict[str, Any]:
    """The token counts a streamed event reports (the ones it leaves out stay as they were)."""
    names = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return {
        name: value
        for name in (*names, "output_tokens")
        if (value := getattr(raw, name, None)) is not None
    }


#: The first user turn the API wants when a conversation starts with the assistant's.
_CONVERSATION_FOLLOWS = "(The conversation so far follows.)"


def _messages(turns: Sequence[Message]) -> list[MessageParam]:
    """Alternate user/assistant turns, merging neighbours of the same role.

    The Messages API wants alternating roles starting with a user turn.
    """
    merged: list[list[str]] = []
    roles: list[str] = []
    for turn in turns:
        if roles and roles[-1] == turn.role:
            merged[-1].append(turn.content)
        else:
            roles.append(turn.role)
            merged.append([turn.content])
    if roles and roles[0] != "user":
        roles.insert(0, "user")
        merged.insert(0, [_CONVERSATION_FOLLOWS])
    result: list[MessageParam] = []
    for role, parts in zip(roles, merged, strict=True):
        content = "\n\n".join(parts)
        param: MessageParam = (
            {"role": "assistant", "content": content}
            if role == "assistant"
            else {"role": "user", "content": content}
        )
        result.append(param)
    return result


def _tool(spec: ToolSpec) -> ToolParam:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


_Role = Literal["user", "assistant"]


def _step_messages(items: Sequence[ConversationItem]) -> tuple[list[str], list[MessageParam]]:
    """The system messages among ``items``, and the rest as alternating block messages.

    Neighbours of one role merge into one message, so the results of one reply's calls
    travel as ``tool_result`` blocks of ONE user message (the API wants every result of
    a turn in the message right after it), followed by any user text sent with them.
    The Messages API has one system prompt: a system message in the conversation joins
    it, as :func:`split_history` does for the history's.
    """
    system: list[str] = []
    merged: list[tuple[_Role, list[ContentBlockParam]]] = []
    for item in items:
        if isinstance(item, Message) and item.role == "system":
            system.append(item.content)
            continue
        role, blocks = _blocks(item)
        if not blocks:
            continue  # an empty text block is refused; an empty turn says nothing
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, blocks))
    if merged and merged[0][0] != "user":
        merged.insert(0, ("user", [{"type": "text", "text": _CONVERSATION_FOLLOWS}]))
    messages: list[MessageParam] = [
        {"role": "assistant", "content": blocks}
        if role == "assistant"
        else {"role": "user", "content": blocks}
        for role, blocks in merged
    ]
    return system, messages


def _blocks(item: ConversationItem) -> tuple[_Role, list[ContentBlockParam]]:
    """One item's role and content blocks (system messages are taken out before)."""
    if isinstance(item, ModelTurn):
        blocks: list[ContentBlockParam] = [{"type": "text", "text": item.text}] if item.text else []
        blocks.extend(
            {"type": "tool_use", "id": call.call_id, "name": call.name, "input": call.args}
            for call in item.tool_calls
        )
        return "assistant", blocks
    if isinstance(item, Message):
        role: _Role = "assistant" if item.role == "assistant" else "user"
        return role, [{"type": "text", "text": item.content}] if item.content else []
    result: ContentBlockParam = {
        "type": "tool_result",
        "tool_use_id": item.call_id,
        "content": item.content,
        "is_error": item.is_error,
    }
    return "user", [result]


def _usage(raw: object) -> Usage | None:
    """Input tokens include cache writes and reads; the API reports no price."""
    if raw is None:
        return None
    input_tokens = 0
    seen = False
    for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = getattr(raw, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            input_tokens += value
            seen = True
    output = getattr(raw, "output_tokens", None)
    return Usage(
        input_tokens=input_tokens if seen else None,
        output_tokens=_count(output),
        cache_read_tokens=_count(getattr(raw, "cache_read_input_tokens", None)),
        cache_write_tokens=_count(getattr(raw, "cache_creation_input_tokens", None)),
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
