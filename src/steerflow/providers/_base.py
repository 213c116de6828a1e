"""The provider interface every model and agent worker implements.

A provider turns one rendered operation into a response. The executor owns
everything around the call (dependencies, pause gate, steer rendering, retries
of whole nodes on resume); a provider only talks to its model.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from steerflow._usage import USAGE_MEMBERS, Usage
from steerflow.providers._paths import ensure_leg_dir

__all__ = [
    "USAGE_MEMBERS",
    "ConversationItem",
    "DependencyResult",
    "Message",
    "ModelTurn",
    "PlanReply",
    "PlanRequest",
    "Provider",
    "ProviderRequest",
    "ProviderResponse",
    "StepReply",
    "StepRequest",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
]


@dataclass(frozen=True)
class Message:
    """One turn of a node's conversation (its branch)."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class DependencyResult:
    """One dependency's outcome as a node receives it (the rendered block, unrendered).

    ``text`` is the dependency's response when it completed, its error when it failed.
    A skipped dependency has no result and is left out, as in the rendered instruction.
    """

    node_id: str
    status: Literal["completed", "failed"]
    text: str
    #: A completed dependency's validated structured output (its ``output_schema``'s),
    #: else None; ``text`` is then that output as JSON.
    output: object = None


@dataclass(frozen=True)
class ProviderRequest:
    """Everything a provider needs to run one operation.

    ``instruction`` is the complete rendered instruction: operator steer block,
    the node's own instruction and its dependencies' results. ``history`` is
    the branch before this turn (system prompt first, then any inherited turns).
    ``artifact_dir`` is the leg's directory; it exists at the call only when the
    provider's ``needs_artifact_dir`` is true (or a resumed leg already wrote there).
    """

    run_id: str
    node_key: str
    node_id: str
    kind: Literal["planned", "spawned"]
    assignee: str | None
    instruction: str
    history: tuple[Message, ...]
    artifact_dir: Path
    home: Path
    allow_spawn: bool = False
    timeout_s: float | None = None
    #: A vendor-side conversation to continue (the claude CLI's session id), so an
    #: agent worker resumes its own context instead of being sent ``history`` again.
    conversation: str | None = None
    #: The dependencies' results rendered into ``instruction`` (for the synthesis: every
    #: worker's), in the same order; for providers that want them as data.
    dependencies: tuple[DependencyResult, ...] = ()
    #: Where the call's text goes as it is produced (the run's live file: decision 190);
    #: None when nobody records it. Call :meth:`emit`, never this directly.
    live: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    #: The JSON Schema the reply must satisfy (the node's ``output_schema``), or None.
    #: A provider that supports structured output asks for it (docs/outputs.md) and may
    #: return the decoded value as ``ProviderResponse.output``; the executor validates
    #: either that or the reply text parsed as JSON, and asks again when it does not fit.
    output_schema: dict[str, Any] | None = None

    def emit(self, text: str) -> None:
        """Hand a chunk of output produced so far to the live view; cheap, never blocks.

        What is emitted is only watched, never recorded: the response the call returns is
        what counts, so a call that fails after emitting records nothing of it.
        """
        if self.live is not None and text:
            self.live(text)

    def ensure_artifact_dir(self) -> Path:
        """Make (0700, no symlink followed) and return ``artifact_dir``; blocking I/O.

        For a provider with ``needs_artifact_dir = False`` that writes files only
        sometimes: it pays the ``mkdir`` only for the nodes that do.
        """
        return ensure_leg_dir(self.artifact_dir.parent, self.artifact_dir.name)


@dataclass
class ProviderResponse:
    """What one call produced.

    ``spawns`` holds raw spawn requests (mappings, or None for a null child);
    the executor validates each and records a rejection reason for bad ones.
    """

    text: str
    spawns: list[object] = field(default_factory=list)
    usage: Usage | None = None
    artifacts: list[str] = field(default_factory=list)
    #: The vendor-side conversation this call ran in, when the worker reports one.
    conversation: str | None = None
    #: Where the call ran when it was not this process (``--executor ray``: the Ray node
    #: id and address, worker pid): shown with the node, never part of its result.
    placement: dict[str, object] | None = None
    #: The structured output, decoded, when the request had an ``output_schema`` and the
    #: provider produced it as data (a forced tool's input, a function's return value);
    #: None: the executor parses ``text`` as JSON.
    output: object = None


@dataclass(frozen=True)
class PlanRequest:
    """A planning call: turn a prompt into plan data matching ``schema``."""

    prompt: str
    schema: dict[str, object]
    max_entries: int
    feedback: str | None = None


@dataclass(frozen=True)
class PlanReply:
    """What one planning call returned: the raw plan data, and its usage if reported."""

    data: object
    usage: Usage | None = None


# -- one step of a tool node's loop (issue 39, decision 253): exported by steerflow.providers --


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


class Provider(abc.ABC):
    """A model or agent worker behind a ``--model`` spec: the protocol a plugin implements.

    A plugin (entry point group ``steerflow.providers``, docs/providers.md) subclasses this
    class; its factory is called with the whole spec and returns an instance.

    Call
        :meth:`invoke` gets one :class:`ProviderRequest` per node and returns a
        :class:`ProviderResponse` (anything else fails the node, naming the provider).
        ``request.instruction`` is already complete (operator steers, the node's
        instruction, its dependencies' results); the executor owns dependencies, the
        pause gate, admission, checkpointing and replay, so a completed node's response
        is recorded and a resume never calls the provider for it again.
        Raise :class:`steerflow.errors.ProviderError` for a failure the node should report
        as its error; any other exception fails the node too, as ``TypeName: text``.
    Usage
        Put token counts and cost in ``ProviderResponse.usage`` (:class:`Usage`) when the
        vendor reports them; they add up into the run's usage. ``None`` is "not reported".
    Cancellation
        A call runs inside the node's task. ``ctl stop --now``, SIGINT/SIGTERM and, for a
        provider with ``cancel_at_deadline``, the deadline (with ``deadline_grace_s``, that
        many seconds after it) cancel that task: ``invoke`` sees
        :class:`asyncio.CancelledError` at its current ``await``, must release what it holds
        (close a stream, kill a subprocess) and let the error propagate; the node stays
        pending and reruns on resume. Blocking work belongs in a thread, never on the loop.
    Artifacts
        ``needs_artifact_dir = True`` (the default, kept for existing providers) makes the
        executor create the leg directory before every call; a provider that writes files
        only sometimes sets it False and calls ``request.ensure_artifact_dir()`` (in a
        thread) when it does, so a node that writes nothing costs no ``mkdir``.
    """

    spec: str
    #: True for calls that can outlast a deadline by far (agent workers run for
    #: minutes to hours). A deadline cancels these instead of letting them finish,
    #: which Amendment 3 otherwise does for calls already invoked (decision 23).
    cancel_at_deadline: ClassVar[bool] = False
    #: Seconds a call still running at the deadline may go on before it is cancelled
    #: as ``cancel_at_deadline`` calls are; None (the default): it finishes. For code
    #: that no timeout of its own bounds (function nodes: decision 241).
    deadline_grace_s: ClassVar[float | None] = None
    #: True if ``invoke`` expects ``request.artifact_dir`` to exist already: the executor
    #: then makes it (0700, off the loop) before the call. The built-in providers make
    #: it themselves, and only when they write into it (``ensure_leg_dir`` /
    #: ``write_leg_file``), so a node that writes nothing gets no directory (decision 62).
    needs_artifact_dir: ClassVar[bool] = True
    #: False for a provider that never reports token usage (``echo``): a token or cost
    #: cap cannot be enforced on it, so such a run is refused before it starts.
    reports_usage: ClassVar[bool] = True
    #: True for a provider whose :meth:`invoke_step` runs a model that can call tools;
    #: a node with tools on any other model is refused before the run starts.
    supports_tools: ClassVar[bool] = False

    @abc.abstractmethod
    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Run one operation; raise :class:`steerflow.errors.ProviderError` on failure."""

    @abc.abstractmethod
    async def plan(self, request: PlanRequest) -> object:
        """Return raw plan data (validated by the caller against ``request.schema``)."""

    async def invoke_step(self, request: StepRequest) -> StepReply:
        """One model request of a tool node's loop (issue 39): text, tool calls, usage.

        A provider that can call tools overrides this and sets ``supports_tools``; the
        loop around it (journal, replay, steering, running the tools) is not its concern.
        """
        from steerflow.errors import ProviderError

        raise ProviderError(f"model {self.spec!r} cannot call tools")

    async def plan_with_usage(self, request: PlanRequest) -> PlanReply:
        """Plan data and the call's usage; a provider that reports usage overrides this.

        The planner call is paid work of the run: its usage counts in the run's total.
        """
        return PlanReply(await self.plan(request))

    def portable_spec(self) -> str:
        """The spec that builds this provider again in another process (a Ray worker).

        The same as ``spec`` unless it depends on this process (``script:`` gives its
        file's absolute path, so a worker with another working directory reads that file).
        """
        return self.spec

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release clients or subprocesses."""
