"""One step of a tool node's loop, as a model sees it (issue 39, decision 253).

A tool node is a conversation: the node's instruction, then model replies that may ask
for tools, then the tools' results, then the next reply, until a reply asks for none.
A model that calls tools implements :meth:`Provider.invoke_step` over these types; the
loop itself (journaling each step, replaying them on resume, steering between them)
lives in ``steerflow.tools`` and never in a provider.

Standard library only: a plugin implements the protocol without importing the tools
package, and nodes without tools never load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from steerflow._usage import Usage
from steerflow.providers._base import Message, ProviderRequest

__all__ = [
    "ConversationItem",
    "ModelTurn",
    "StepReply",
    "StepRequest",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is told about it: name, description, JSON Schema of its args."""

    name: str
    description: str
    #: A JSON Schema of type ``object`` (the arguments by name).
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model reply asked for.

    ``call_id`` is the vendor's id (OpenAI ``call_…``, Anthropic ``toolu_…``; ``script:``
    makes a stable one), kept exactly: the result sent back names the same id.
    """

    call_id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ModelTurn:
    """An assistant reply in the conversation: its text and the tool calls it made."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    role: Literal["assistant"] = "assistant"


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned, sent back to the model under the call's id.

    ``is_error`` marks a tool's error (bad arguments, a raised exception, a timeout, an
    unknown outcome): the model sees it as the tool's answer, the node goes on.
    """

    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"


#: A conversation item after the node's history: a user message (the instruction, an
#: operator's message between steps), an assistant reply, or a tool's result.
ConversationItem = Message | ModelTurn | ToolResult


@dataclass(frozen=True)
class StepRequest:
    """One model request of a tool node's loop.

    The messages to send are ``node.history`` (system prompt and inherited turns) followed
    by ``conversation``, whose first item is the node's instruction as a user message.
    Every :class:`ModelTurn` with tool calls is followed by one :class:`ToolResult` per
    call, in the calls' order, before the next user message or turn.
    """

    node: ProviderRequest
    conversation: tuple[ConversationItem, ...]
    tools: tuple[ToolSpec, ...]
    #: 1 for the node's first model request, 2 for the next, ... (stable across a resume).
    step: int


@dataclass
class StepReply:
    """What one model request returned: text, the tool calls asked for, usage."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
