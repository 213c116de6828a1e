"""The tool node's loop: model request, tool calls, results, next request (issue 39).

Each step is journaled before the next begins (decision 254): a model reply as soon as
it returned (closing its request's write-ahead intent), a tool call as ``in_flight``
before it starts and again when it ended. A resume hands the recorded steps back in
``prior``: they are replayed without calling the model or a tool, the conversation is
rebuilt exactly (every call paired with its result, ids and order kept), and the loop
goes on at the first unrecorded step. A call recorded as started and never ended runs
again only if it was idempotent when it started, or the operator said ``retry``;
``skip`` gives the model "the call's outcome is unknown" (decision 255).

A call of a tool that needs approval (issue 41) is asked about first: an ``approval``
step is journaled ``awaiting`` (request id, tool, arguments, the model's text before it)
before the loop waits for the operator, and ended ``approved`` (the call runs, with the
operator's edited arguments if given) or ``denied`` (the model gets the reason as the
tool's result) before anything else happens. A resume replays a decided request and
waits again, without asking the model anything, on one still undecided.

The loop owns no policy of the run: the pause gate, operator messages, the budget, the
write-ahead intent and the journal are reached through :class:`StepHooks`, which the
executor implements, so the loop is the same under every front end.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from steerflow import _faults
from steerflow._usage import Usage
from steerflow.errors import FlowResumeError, ProviderError
from steerflow.providers._base import (
    ConversationItem,
    Message,
    ModelTurn,
    Provider,
    ProviderRequest,
    ProviderResponse,
    StepRequest,
    ToolCall,
    ToolResult,
)
from steerflow.tools._toolset import ToolOutput, Toolset

__all__ = [
    "DEFAULT_MAX_RESULT_CHARS",
    "DEFAULT_MAX_STEPS",
    "OP_APPROVAL",
    "UNKNOWN_OUTCOME",
    "Admitted",
    "LoopHeld",
    "StepHooks",
    "ToolCallUndecidedError",
    "ToolLoop",
    "denied_text",
    "new_request_id",
    "undecided_calls",
    "undecided_message",
]

#: ``max_steps`` when the plan does not say: model requests per node (CONTRACT §12).
DEFAULT_MAX_STEPS = 25
#: A tool result longer than this is cut before the model sees it, with a marker.
DEFAULT_MAX_RESULT_CHARS = 20_000
#: What the model is told for a call the operator chose not to run again (``skip``).
UNKNOWN_OUTCOME = (
    "the call's outcome is unknown: the run stopped while it was running, and the "
    "operator chose not to run it again"
)
#: The ``call_id`` of an op's own approval step (``approval: required`` on a plan entry):
#: the node waits before its call, with its instruction as the request (issue 41).
OP_APPROVAL = "instruction"
_TRUNCATED = "\n[... truncated by steerflow: {cut} of {total} characters not shown]"


@dataclass(frozen=True)
class Admitted:
    """What the executor gives a model request it admits.

    ``call_id``: the write-ahead intent recorded for it (closed by the step's record);
    ``messages``: operator messages to deliver with it, oldest first, as
    ``{"control_id", "text"}`` (``text`` already rendered as the steer block).
    """

    call_id: str
    messages: tuple[dict[str, str], ...] = ()


class LoopHeld(Exception):  # noqa: N818 - a signal between steps, not an error
    """The loop stopped between steps (pause ended by stop, deadline, budget, lease).

    The node stays pending; its recorded steps let a resume continue where it stopped.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ToolCallUndecidedError(FlowResumeError):
    """A tool call started before the crash and never ended, and nothing says what to do."""


class StepHooks(Protocol):
    """What the loop needs from the run (implemented by the executor)."""

    async def admit_request(self, step: int) -> Admitted:
        """Wait out a pause; raise :class:`LoopHeld` on stop/deadline/budget; record intent."""
        ...

    def delivered(self, admitted: Admitted) -> None:
        """The request carrying ``admitted.messages`` left: they count as delivered."""
        ...

    def charge(self, usage: Usage | None) -> Usage | None:
        """Price one model reply and add it to the run's spend."""
        ...

    def check_between(self) -> None:
        """Raise :class:`LoopHeld` if the loop must stop before the next tool call."""
        ...

    async def record(self, entry: dict[str, Any]) -> None:
        """Journal one step entry (``checkpoint.STEP_MEMBERS``) and wait for its ack."""
        ...

    async def await_approval(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Wait for the operator's decision on a journaled request (issue 41).

        ``request``: ``request_id``, ``tool``, ``args``, ``text``, ``requested_at``. The
        decision: ``verdict`` (``approved``/``denied``), ``edited_args`` (or None),
        ``reason``, ``control_id``, ``sender``. Raises :class:`LoopHeld` on a stop.
        """
        ...


def new_request_id() -> str:
    """A fresh approval request id (``apr_`` and 16 hex digits), unique across runs."""
    return f"apr_{uuid.uuid4().hex[:16]}"


def denied_text(data: Mapping[str, Any]) -> str:
    """What the model is told for a call the operator denied: the reason, as its result."""
    reason = data.get("reason")
    said = f": {reason}" if reason else " (no reason given)"
    return f"the operator denied this call{said}"


@dataclass
class _Replay:
    """The conversation and position rebuilt from recorded steps."""

    conversation: list[ConversationItem]
    index: int = 0  # the last recorded step's index
    requests: int = 0  # model requests made so far
    usage: Usage | None = None
    last: ModelTurn | None = None  # the last reply; its calls still to run follow
    pending: list[ToolCall] = field(default_factory=list)
    in_flight: dict[str, Any] | None = None  # a call started and never ended
    awaiting: dict[str, Any] | None = None  # the next call's request, still undecided
    approved: dict[str, dict[str, Any]] = field(default_factory=dict)  # by call id


def _turn(data: Mapping[str, Any]) -> ModelTurn:
    calls = tuple(
        ToolCall(str(c["call_id"]), str(c["name"]), dict(c["args"]))
        for c in data.get("tool_calls", ())
    )
    return ModelTurn(str(data.get("text", "")), calls)


def _replay(instruction: str, prior: Sequence[Mapping[str, Any]], node: str) -> _Replay:
    """Rebuild the conversation from recorded steps; refuse one that does not fit."""
    state = _Replay([Message("user", instruction)])
    for step in prior:
        data = step["data"]
        state.index = int(step["index"])
        if step["type"] == "approval" and step["call_id"] == OP_APPROVAL:
            continue  # the op's own approval, before its first request
        if step["type"] == "model":
            if state.pending or state.in_flight is not None:
                raise FlowResumeError(
                    f"node {node!r}: step {state.index} is a model reply before every "
                    "tool call of the previous one has a result"
                )
            for message in data.get("steered", ()):
                state.conversation.append(Message("user", str(message["text"])))
            state.last = _turn(data)
            state.conversation.append(state.last)
            state.pending = list(state.last.tool_calls)
            state.requests += 1
            state.usage = _add(state.usage, Usage.from_json(data.get("usage")))
            continue
        expected = state.pending[0] if state.pending else None
        if expected is None or expected.call_id != step["call_id"]:
            raise FlowResumeError(
                f"node {node!r}: tool step {state.index} ({step['call_id']!r}) answers no "
                "call of the reply before it, or not in the order it asked"
            )
        if step["type"] == "approval":
            _replay_approval(state, expected, step)
            continue
        if step["status"] == "in_flight":
            state.in_flight = dict(step)
            continue
        state.in_flight = None  # its intent, if recorded, is closed by this record
        state.pending.pop(0)
        state.conversation.append(_result(expected, step))
    return state


def _replay_approval(state: _Replay, call: ToolCall, step: Mapping[str, Any]) -> None:
    """Fold one recorded approval step of ``call`` (the next call to run)."""
    state.awaiting = None
    if step["status"] == "awaiting":
        state.awaiting = dict(step)
    elif step["status"] == "approved":
        state.approved[call.call_id] = dict(step)
    else:  # denied: the reason is the call's result, and the call never ran
        state.pending.pop(0)
        state.conversation.append(
            ToolResult(call.call_id, call.name, denied_text(step["data"]), is_error=True)
        )


def _result(call: ToolCall, step: Mapping[str, Any]) -> ToolResult:
    if step["status"] == "skipped":
        return ToolResult(call.call_id, call.name, UNKNOWN_OUTCOME, is_error=True)
    content = str(step["data"].get("result", ""))
    return ToolResult(call.call_id, call.name, content, is_error=step["status"] == "failed")


def _add(a: Usage | None, b: Usage | None) -> Usage | None:
    if a is None:
        return b
    return a if b is None else a + b


def undecided_calls(
    prior: Sequence[Mapping[str, Any]], decisions: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The tool calls left ``in_flight`` that may not simply run again, and are undecided.

    A call recorded as idempotent when it started runs again on its own; any other needs
    the operator's ``--tool-call CALL_ID=retry|skip`` (issue 39 item 3).
    """
    last: dict[str, dict[str, Any]] = {}
    for step in prior:
        if step["type"] == "tool":
            last[str(step["call_id"])] = dict(step)
    return [
        step
        for call_id, step in last.items()
        if step["status"] == "in_flight"
        and not step["data"].get("idempotent")
        and call_id not in decisions
    ]


class ToolLoop:
    """One tool node's loop over a model that calls tools and the node's toolset."""

    def __init__(
        self,
        model: Provider,
        toolset: Toolset,
        hooks: StepHooks,
        *,
        node: str,
        record: str,
        key: str,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        prior: Sequence[Mapping[str, Any]] = (),
        decisions: Mapping[str, str] | None = None,
        needs_approval: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.model, self.toolset, self.hooks = model, toolset, hooks
        self.node_id, self.record_kind, self.key = node, record, key
        self.max_steps, self.max_result_chars = max_steps, max_result_chars
        self.prior, self.decisions = tuple(prior), dict(decisions or {})
        self.needs_approval = needs_approval
        self._live: ProviderRequest | None = None  # where each step is shown as it happens
        self.usage: Usage | None = None  # what this run's requests cost (charged)
        self.total: Usage | None = None  # every step's, the replayed ones included

    async def run(self, request: ProviderRequest) -> ProviderResponse:
        """Run (or continue) the loop until a reply asks for no tool; the final reply.

        Raises:
            LoopHeld: stopped between steps; the node stays pending.
            ProviderError: the model failed, or ``max_steps`` was reached.
        """
        node = self.node_id
        self._live = request
        state = _replay(request.instruction, self.prior, node)
        self.total = state.usage
        if state.in_flight is not None:
            await self._settle_in_flight(state)
        while True:
            await self._run_pending(state)
            self.total = state.usage
            if state.last is not None and not state.last.tool_calls:
                return ProviderResponse(text=state.last.text, usage=state.usage)
            if state.requests >= self.max_steps:
                raise ProviderError(
                    f"node {node!r} reached max_steps {self.max_steps} (model requests) "
                    "without a final reply; raise max_steps on the op to let it go on"
                )
            await self._request(request, state)

    async def _request(self, request: ProviderRequest, state: _Replay) -> None:
        step = state.requests + 1
        admitted = await self.hooks.admit_request(step)
        steered = [Message("user", m["text"]) for m in admitted.messages]
        conversation = (*state.conversation, *steered)
        ask = StepRequest(request, conversation, self.toolset.specs(), step)
        self.hooks.delivered(admitted)
        started = time.time()
        reply = await self.model.invoke_step(ask)
        usage = self.hooks.charge(reply.usage)
        self.usage = _add(self.usage, usage)
        turn = ModelTurn(reply.text, tuple(reply.tool_calls))
        data: dict[str, Any] = {
            "text": reply.text,
            "tool_calls": [
                {"call_id": c.call_id, "name": c.name, "args": c.args} for c in turn.tool_calls
            ],
            "usage": usage.to_json() if usage is not None else None,
            "steered": list(admitted.messages),
            "model": self.model.spec,
            "started_at": started,
            "ended_at": time.time(),
        }
        _faults.seam("model-step", "before")
        await self._record(state.index + 1, "model", admitted.call_id, "completed", data)
        _faults.seam("model-step", "after")
        state.index += 1
        state.requests = step
        state.usage = self.total = _add(state.usage, usage)
        state.conversation.extend([*steered, turn])
        state.last, state.pending = turn, list(turn.tool_calls)

    async def _run_pending(self, state: _Replay) -> None:
        """Run the last reply's calls that have no recorded step yet, in order."""
        while state.pending:
            call = state.pending[0]
            self.hooks.check_between()
            approved = await self._approval(state, call)
            if approved is None:
                continue  # denied: its result is the reason, and it never runs
            state.index += 1
            await self._call(state, call, state.index, retried=None, approved=approved)

    async def _approval(self, state: _Replay, call: ToolCall) -> dict[str, Any] | None:
        """Ask (or replay) the operator's approval of ``call``; what its record carries.

        ``{}`` for a call that needs none; ``None`` once it was denied.
        """
        step = state.approved.pop(call.call_id, None)
        if step is None:
            waiting, state.awaiting = state.awaiting, None
            if waiting is None:
                if not self.needs_approval(call.name):
                    return {}
                state.index += 1
                text = state.last.text if state.last is not None else ""
                now = time.time()
                request = {"request_id": new_request_id(), "tool": call.name,
                           "args": call.args, "text": text, "requested_at": now}  # fmt: skip
                waiting = {"index": state.index, "data": request}
                await self._record(state.index, "approval", call.call_id, "awaiting", request)
            decision = await self.hooks.await_approval(waiting["data"])
            data = {**waiting["data"], **decision, "decided_at": time.time()}
            status = str(decision["verdict"])
            await self._record(int(waiting["index"]), "approval", call.call_id, status, data)
            step = {"status": status, "data": data}
        data = step["data"]
        if step["status"] == "denied":
            state.pending.pop(0)
            state.conversation.append(
                ToolResult(call.call_id, call.name, denied_text(data), is_error=True)
            )
            return None
        edited = data.get("edited_args")
        out: dict[str, Any] = {"approval": data.get("request_id")}
        if isinstance(edited, dict):
            out.update(args=edited, edited=True, requested_args=call.args)
        return out

    async def _call(
        self,
        state: _Replay,
        call: ToolCall,
        index: int,
        *,
        retried: str | None,
        approved: Mapping[str, Any],
    ) -> None:
        tool = self.toolset.tools.get(call.name)
        idempotent = bool(tool is not None and tool.idempotent)
        args = approved.get("args", call.args)
        base: dict[str, Any] = {"tool": call.name, "args": args, "idempotent": idempotent}
        base.update({k: v for k, v in approved.items() if k != "args"})
        started = time.time()
        if retried is None:
            _faults.seam("tool-intent", "before")
            intent = {**base, "started_at": started}
            await self._record(index, "tool", call.call_id, "in_flight", intent)
            _faults.seam("tool-intent", "after")
        else:
            base["decision"] = retried
        output = await self.toolset.call(call.name, args)
        _faults.seam("tool-result", "before")  # the tool returned; its result not yet saved
        content, truncated = self._cut(output)
        data = {**base, "result": content, "truncated": truncated, "started_at": started,
                "ended_at": time.time()}  # fmt: skip
        status = "failed" if output.is_error else "completed"
        await self._record(index, "tool", call.call_id, status, data)
        _faults.seam("tool-result", "after")
        state.pending.pop(0)
        state.conversation.append(ToolResult(call.call_id, call.name, content, output.is_error))

    async def _settle_in_flight(self, state: _Replay) -> None:
        """A call that started before the crash and never ended: rerun, skip or refuse."""
        step = state.in_flight
        assert step is not None
        state.in_flight = None
        call = state.pending[0]
        decision = self.decisions.get(call.call_id)
        if decision is None and step["data"].get("idempotent"):
            decision = "retry"
        if decision == "retry":
            # As it was approved: the arguments it started with, edited or not.
            recorded = step["data"]
            approved = {k: recorded[k] for k in _APPROVED_MEMBERS if k in recorded}
            await self._call(state, call, int(step["index"]), retried="retry", approved=approved)
            return
        if decision == "skip":
            data = {**step["data"], "result": None, "decision": "skip", "ended_at": time.time()}
            await self._record(int(step["index"]), "tool", call.call_id, "skipped", data)
            state.pending.pop(0)
            state.conversation.append(_result(call, {"status": "skipped", "data": data}))
            return
        raise ToolCallUndecidedError(undecided_message(step))

    def _cut(self, output: ToolOutput) -> tuple[str, bool]:
        text, limit = output.content, self.max_result_chars
        if len(text) <= limit:
            return text, False
        return text[:limit] + _TRUNCATED.format(cut=len(text) - limit, total=len(text)), True

    async def _record(
        self, index: int, type_: str, call_id: str, status: str, data: dict[str, Any]
    ) -> None:
        await self.hooks.record(
            {
                "node": self.node_id,
                "record": self.record_kind,
                "key": self.key,
                "index": index,
                "type": type_,
                "call_id": call_id,
                "status": status,
                "data": data,
            }
        )
        if self._live is not None:  # `show RUN NODE --follow` prints it as it happens
            self._live.emit(live_line(index, type_, status, data))


#: What a tool step's record keeps of its approval (a retry after a crash keeps it too).
_APPROVED_MEMBERS = ("args", "approval", "edited", "requested_args")


def live_line(index: int, type_: str, status: str, data: Mapping[str, Any]) -> str:
    """One step as the node's live output shows it (a line; the model's text in full)."""
    if type_ == "approval":
        what = f"tool {data.get('tool')}" if data.get("tool") else "the node's call"
        if status == "awaiting":
            return f"[step {index}] {what} awaits approval ({data.get('request_id')})\n"
        return f"[step {index}] {what} {status} by {data.get('sender') or 'timeout'}\n"
    if type_ == "model":
        names = ", ".join(str(c["name"]) for c in data.get("tool_calls", ()))
        text = str(data.get("text") or "")
        said = f"{text}\n" if text else ""
        return f"{said}[step {index}] model " + (f"calls {names}\n" if names else "replied\n")
    if status == "in_flight":
        args = json.dumps(data.get("args"), sort_keys=True, ensure_ascii=False)
        return f"[step {index}] tool {data.get('tool')} {args}\n"
    result = str(data.get("result") or "").split("\n", 1)[0][:200]
    return f"[step {index}] tool {data.get('tool')} -> {status}: {result}\n"


def undecided_message(step: Mapping[str, Any]) -> str:
    """The refusal for one undecided call: node, step, tool, arguments and the way out."""
    data = step["data"]
    args = json.dumps(data.get("args"), sort_keys=True, ensure_ascii=False)
    return (
        f"node {step['node']!r}, step {step['index']}: tool {data.get('tool')!r} was called "
        f"with {args} and the run stopped before it returned; it is not declared "
        "idempotent, so running it again could repeat its side effect. Decide with "
        f"`steerflow resume RUN --tool-call {step['call_id']}=retry` (run it again) or "
        "`=skip` (tell the model its outcome is unknown)"
    )
