"""The shared shape of the two SDK-backed providers (``openai/`` and ``anthropic/``).

Both turn a request into the same steps: split the history into a system prompt
and turns, add the spawn guidance, make one retried SDK call, and take the spawn
block out of the reply. :class:`SDKProvider` does those steps once; a vendor
implements :meth:`SDKProvider._call` (one call with its SDK's message shape)
and builds its client lazily in ``_client``.

A streamed call degrades to the plain one and never fails for streaming's sake
(decision 230): a whole JSON reply to a streamed request is the reply
(:func:`is_event_stream`, :func:`whole_reply`), a stream that delivered its final
chunk is complete however it then ends (:func:`ended_after_final`), and a server
that refuses streamed requests is asked without, from then on (:func:`refuses_streaming`).
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

from steerflow.errors import ProviderError
from steerflow.providers._base import (
    Message,
    PlanReply,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    Usage,
)
from steerflow.providers._conventions import (
    extract_spawns,
    parse_plan_reply,
    plan_system_prompt,
    plan_user_prompt,
    split_history,
    system_with_spawn,
)
from steerflow.providers._retry import Failure, RetryPolicy, call_with_retry, classify_sdk_error
from steerflow.providers._structured import WireSchema, wire_schema

__all__ = [
    "SDKProvider",
    "StreamCut",
    "ended_after_final",
    "is_event_stream",
    "refuses_streaming",
    "restarted",
    "whole_reply",
]


class StreamCut(Exception):  # noqa: N818 - a condition, named as the retry policy reports it
    """A streamed reply that ended before the server said it was complete.

    Transient: the attempt is retried whole, and nothing of it is returned, so a cut
    stream is never recorded as a (partial) response.
    """


_RESTART = "\n[… the stream was cut; calling again …]\n"


def restarted(emit: Callable[[str], None], attempt: int) -> None:
    """Tell the live view that attempt ``attempt`` (1-based) starts over."""
    if attempt > 1:
        emit(_RESTART)


def _classify(sdk: ModuleType, exc: BaseException) -> Failure | None:
    """The SDK's errors, plus a stream cut by the server or the network mid-way."""
    if isinstance(exc, StreamCut):
        return Failure(transient=True, message=f"stream cut: {exc}")
    if _is_transport_error(exc):  # raised while iterating, not wrapped by the SDK
        return Failure(transient=True, message=f"stream cut ({type(exc).__name__}: {exc})")
    return classify_sdk_error(sdk, exc)


def _is_transport_error(exc: BaseException) -> bool:
    """An HTTP transport failure of the SDK's client (``httpx``, or the ``httpx2`` fork).

    Matched by name: each SDK may bring its own copy of the library.
    """
    return any(
        cls.__name__ == "TransportError" and cls.__module__.partition(".")[0] in _HTTP_LIBS
        for cls in type(exc).__mro__
    )


_HTTP_LIBS = ("httpx", "httpx2")


def ended_after_final(sdk: ModuleType, exc: BaseException) -> bool:
    """True if ``exc`` is the connection ending (or going quiet) under a stream.

    Raised after the stream's final chunk, it ends a complete reply, which is kept:
    a proxy may drop the connection once the reply is over, without ``[DONE]``,
    ``message_stop`` or the body's terminating chunk.
    """
    return isinstance(exc, sdk.APIConnectionError) or _is_transport_error(exc)


def is_event_stream(response: object) -> bool:
    """True if ``response`` (the SDK stream's HTTP response) says it is an event stream."""
    return _content_type(response) == "text/event-stream"


async def whole_reply(response: Any, spec: str) -> dict[str, Any]:
    """The JSON object of a whole reply to a streamed request (the server did not stream).

    Args:
        response: The HTTP response, its body not read yet.
        spec: The model spec, for the error message.

    Returns:
        The decoded body, in the vendor's non-streamed reply shape.

    Raises:
        ProviderError: Not retryable: the body is not a JSON object (a server that
            answers this way will answer the same way again). A body cut while it
            is read raises the HTTP library's transport error: a cut, retried.
    """
    raw: bytes = await response.aread()
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        kind = _content_type(response) or "no content type"
        raise ProviderError(
            f"{spec}: the server answered a streamed request with neither an event stream "
            f"nor a JSON reply ({kind}, {len(raw)} bytes)",
            retryable=False,
        )
    return data


def _content_type(response: object) -> str:
    headers = getattr(response, "headers", None)
    value = headers.get("content-type") if headers is not None else None
    return str(value or "").partition(";")[0].strip().lower()


_REFUSED = re.compile(r"\bstream(ing|_options)?\b", re.IGNORECASE)


def refuses_streaming(exc: ProviderError) -> bool:
    """True if a streamed request was refused for streaming (HTTP 400/422 naming it)."""
    text = str(exc)
    return ("HTTP 400" in text or "HTTP 422" in text) and _REFUSED.search(text) is not None


class _Closeable(Protocol):
    async def close(self) -> None: ...


class SDKProvider(Provider):
    """A provider whose every call is one retried request through a vendor SDK.

    Subclasses set ``spec``, ``model`` and ``policy`` in ``__init__`` and leave
    ``_client`` None until first use.
    """

    needs_artifact_dir: ClassVar[bool] = False  # a model call writes no file
    #: False once the server refused a streamed request: this instance asks without.
    streams: bool = True
    spec: str
    model: str
    policy: RetryPolicy
    _client: _Closeable | None

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Send history + instruction as one call.

        Args:
            request: The rendered operation.

        Returns:
            The reply text (without a spawn block), raw spawn items and usage.

        Raises:
            ProviderError: The call failed (see :func:`call_with_retry`).
        """
        system, turns = split_history(request.history)
        if request.output_schema is not None:
            # A structured reply is one JSON value: no room for a spawn block in it.
            turns = [*turns, Message(role="user", content=request.instruction)]
            return await self._structured(system, turns, request)
        system = system_with_spawn(system, request.allow_spawn)
        turns = [*turns, Message(role="user", content=request.instruction)]
        # Streamed only when someone watches (the run's live file): the reply recorded is
        # the same text either way, and a library call without a sink keeps one request.
        emit = request.emit if request.live is not None else None
        text, usage = await self._create(system, turns, timeout_s=request.timeout_s, emit=emit)
        spawns: list[object] = []
        if request.allow_spawn:
            text, spawns = extract_spawns(text)
        return ProviderResponse(text=text, spawns=spawns, usage=usage)

    async def _structured(
        self, system: str | None, turns: Sequence[Message], request: ProviderRequest
    ) -> ProviderResponse:
        """One whole (non-streamed) call asking for ``request.output_schema``'s reply.

        The text reaches the live view whole once it is in. The executor validates what
        comes back (``output`` when the vendor returned data, else the text as JSON).
        """
        assert request.output_schema is not None
        wire = wire_schema(request.output_schema)
        text, output, usage = await self._call_structured(
            system, turns, wire, timeout_s=request.timeout_s
        )
        request.emit(text)
        return ProviderResponse(text=text, usage=usage, output=output)

    async def _call_structured(
        self,
        system: str | None,
        turns: Sequence[Message],
        wire: WireSchema,
        *,
        timeout_s: float | None,
    ) -> tuple[str, object, Usage | None]:
        """One retried call asking for structured output: text, decoded value (or None), usage.

        A vendor overrides this; the default asks as :meth:`_create` does, the executor
        parsing the text.
        """
        text, usage = await self._create(system, turns, timeout_s=timeout_s)
        return text, None, usage

    async def plan(self, request: PlanRequest) -> object:
        """Ask for a plan as one JSON object.

        Args:
            request: Prompt, schema, entry limit and the previous rejection.

        Returns:
            The decoded plan object.

        Raises:
            ProviderError: The call failed or the reply is not a JSON object.
        """
        return (await self.plan_with_usage(request)).data

    async def plan_with_usage(self, request: PlanRequest) -> PlanReply:
        """:meth:`plan`, with the call's token usage."""
        turns = [Message(role="user", content=plan_user_prompt(request))]
        text, usage = await self._plan_text(plan_system_prompt(request), turns)
        return PlanReply(parse_plan_reply(text, self.spec), usage)

    async def aclose(self) -> None:
        """Close the SDK client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def _plan_text(self, system: str, turns: Sequence[Message]) -> tuple[str, Usage | None]:
        """The reply text of a planning call and its usage; a vendor may ask for JSON mode."""
        return await self._create(system, turns, timeout_s=None)

    async def _create(
        self,
        system: str | None,
        turns: Sequence[Message],
        *,
        timeout_s: float | None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, Usage | None]:
        """One retried call: the reply text and its usage.

        With ``emit`` the call streams, handing each text delta to it; the text returned
        is still the whole reply of the one attempt that finished (decision 192). A server
        that refuses the streamed request is asked again without, and this instance
        streams no more (decision 230); the reply then reaches ``emit`` in one piece.
        """
        if emit is not None and self.streams:
            try:
                return await self._call(system, turns, timeout_s=timeout_s, emit=emit)
            except ProviderError as exc:
                if exc.retryable or not refuses_streaming(exc):
                    raise
                self.streams = False
        text, usage = await self._call(system, turns, timeout_s=timeout_s)
        if emit is not None and text:
            emit(text)
        return text, usage

    async def _whole(
        self, response: Any, build: Callable[..., object], emit: Callable[[str], None]
    ) -> tuple[str, Usage | None]:
        """A streamed request answered with the whole reply as JSON: that is the reply.

        ``build`` makes the SDK's reply object from the decoded body (its lenient
        ``construct``, as the SDK does for a plain call); the text reaches ``emit`` whole.
        """
        text, usage = self._reply(build(**await whole_reply(response, self.spec)))
        if text:
            emit(text)
        return text, usage

    @abc.abstractmethod
    def _reply(self, reply: object) -> tuple[str, Usage | None]:
        """The text and usage of the SDK's whole (non-streamed) reply object."""

    @abc.abstractmethod
    async def _call(
        self,
        system: str | None,
        turns: Sequence[Message],
        *,
        timeout_s: float | None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, Usage | None]:
        """One retried SDK call, streamed when ``emit`` is given (see :meth:`_create`)."""

    def _per_call_s(self, timeout_s: float | None) -> float:
        """The request's own timeout when it has one, else the policy's."""
        return timeout_s if timeout_s and timeout_s > 0 else self.policy.timeout_s

    async def _retried(
        self, sdk: ModuleType, attempt: Callable[[], Awaitable[Any]], *, timeout_s: float
    ) -> Any:
        """Run ``attempt`` under the retry policy, classifying ``sdk``'s errors."""
        return await call_with_retry(
            attempt,
            classify=functools.partial(_classify, sdk),
            policy=self.policy,
            label=self.spec,
            timeout_s=timeout_s,
        )
