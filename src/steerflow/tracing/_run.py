"""One run as a trace, built from what the run already says.

The run hands over its bus events (nodes, tool calls, model steps, checkpoint saves,
approvals), each call's write-ahead intent (the moment a model request leaves), the
controls its poller stamped and its result; nothing is threaded through the executor.
Every method is called on the run's loop and only records: spans go to the
provider's processor, which exports on its own thread (decision 382).

Spans: the run (root), a node per admitted/replayed/skipped node under it, a model
request (``chat MODEL``) and a tool call (``execute_tool TOOL``) under their node.
Span events: controls (with their sender) and checkpoint saves on the run's span,
approvals on their node's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from steerflow.tracing import _attrs as attr
from steerflow.tracing._context import write_root
from steerflow.tracing._setup import TracerHandle, tracer_handle

if TYPE_CHECKING:
    from steerflow.executor import CallIntent, FlowEvent, Operation

__all__ = ["RunTracer"]

_END_STATUS = {
    "node_completed": "completed",
    "node_failed": "failed",
    "node_skipped": "skipped",
    "node_replayed": "replayed",
    "node_withheld": "withheld",
}


def _ns(ts: float | None) -> int:
    return int((ts if ts is not None else time.time()) * 1e9)


def _usage_attrs(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    if not usage:
        return {}
    out: dict[str, Any] = {}
    for key, name in (
        ("input_tokens", attr.INPUT_TOKENS),
        ("output_tokens", attr.OUTPUT_TOKENS),
        ("cost_usd", attr.COST),
    ):
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = value
    return out


class RunTracer:
    """The spans of one run; feed it with :meth:`on_event` and friends, then :meth:`end`."""

    def __init__(
        self,
        handle: TracerHandle,
        *,
        kind: str,
        resumed_from: str | None = None,
        source_root: tuple[int, int] | None = None,
    ) -> None:
        self.handle = handle
        self.tracer = handle.tracer
        self.capture = attr.capture_content()
        links: list[Link] = []
        context = None  # the current context: an application's span is the parent
        attributes: dict[str, Any] = {attr.RUN_KIND: kind, attr.OPENINFERENCE_KIND: "CHAIN"}
        if resumed_from is not None:
            attributes[attr.RESUMED_FROM] = resumed_from
        if source_root is not None:
            source = SpanContext(
                trace_id=source_root[0],
                span_id=source_root[1],
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            links.append(Link(source, {attr.LINK_KIND: "resumed_from"}))
            if not trace.get_current_span().get_span_context().is_valid:
                # No application span around the resume: it continues the source's trace,
                # so a chain reads as one trace (decision 383).
                context = trace.set_span_in_context(trace.NonRecordingSpan(source))
        self.root = self.tracer.start_span(
            f"run {kind}", context=context, kind=SpanKind.INTERNAL,
            attributes=attributes, links=links,
        )  # fmt: skip
        self._root_ctx = trace.set_span_in_context(self.root)
        self._nodes: dict[str, trace.Span] = {}  # by node id
        self._node_ctx: dict[str, Any] = {}
        self._attempts: dict[str, int] = {}  # node_started count by node id
        self._requests: dict[str, trace.Span] = {}  # the open model request by node id
        self._tools: dict[tuple[str, str], tuple[trace.Span, float]] = {}
        self._ops: Callable[[str], Operation | None] = lambda _id: None
        self.ended = False

    @classmethod
    def begin(
        cls,
        *,
        kind: str,
        resumed_from: str | None = None,
        source_root: tuple[int, int] | None = None,
    ) -> RunTracer:
        """A run's tracer over the application's provider or steerflow's own."""
        return cls(tracer_handle(), kind=kind, resumed_from=resumed_from, source_root=source_root)

    # -- what the runner tells it ------------------------------------------------------

    def session(self, *, run_id: str, session_id: str, name: str | None, run_dir: Path) -> None:
        """The run's session exists: name the root span and record it for a resume."""
        name = name or run_id
        self.root.update_name(f"run {name}")
        self.root.set_attributes(
            {attr.RUN_ID: run_id, attr.SESSION_ID: session_id, attr.RUN_NAME: name,
             attr.CONVERSATION_ID: session_id}
        )  # fmt: skip
        ctx = self.root.get_span_context()
        if ctx.is_valid:
            write_root(run_dir, ctx.trace_id, ctx.span_id)

    def watch_graph(self, ops: Callable[[str], Operation | None]) -> None:
        """How to find a node's operation by node id (the executor's graph)."""
        self._ops = ops

    def wrap_intent(
        self, hook: Callable[[Operation, CallIntent], Awaitable[bool]]
    ) -> Callable[[Operation, CallIntent], Awaitable[bool]]:
        """The executor's ``before_call``, also opening a model request span per intent."""

        async def before_call(op: Operation, intent: CallIntent) -> bool:
            allowed = await hook(op, intent)
            if allowed:
                self.request_started(op, intent)
            return allowed

        return before_call

    def request_started(self, op: Operation, intent: CallIntent) -> None:
        """A model request leaves now (its intent is durable)."""
        if op.node_id not in self._nodes:
            self._open_node(op.node_id, None, restart=False)
        prompt = op.rendered_instruction or "" if not op.tools else None
        self.model_request(
            op.node_id, key=op.key, model=intent.model or op.model, call_id=intent.call_id,
            attempt=intent.attempt, started_at=intent.started_at, prompt=prompt,
            # a tool node's intents number its loop's steps, not tries of the node
            node_attempt=not op.tools,
        )  # fmt: skip

    def model_request(
        self,
        node_id: str,
        *,
        key: str,
        model: str | None,
        call_id: str,
        attempt: int,
        started_at: float,
        prompt: str | None = None,
        node_attempt: bool = True,
    ) -> None:
        """A model request of node ``node_id`` leaves (an agent's turn says it directly)."""
        self._end_request(node_id, "retried", error=True)
        node = self._nodes.get(node_id)
        if node is not None and node_attempt and attempt > 1:
            # The chain's call count (a retry, or a resume's rerun): the node's attempt.
            node.set_attribute(attr.NODE_ATTEMPT, attempt)
        attributes: dict[str, Any] = {
            attr.OPERATION: "chat",
            attr.PROVIDER: attr.provider_of(model),
            attr.REQUEST_MODEL: attr.model_of(model),
            attr.CALL_ID: call_id,
            attr.CALL_ATTEMPT: attempt,
            attr.NODE_KEY: key,
            attr.OPENINFERENCE_KIND: "LLM",
        }
        if self.capture and prompt is not None:
            attributes[attr.INPUT_MESSAGES] = attr.content_json("user", prompt)
        self._requests[node_id] = self.tracer.start_span(
            f"chat {attr.model_of(model)}", context=self._node_ctx.get(node_id, self._root_ctx),
            kind=SpanKind.CLIENT, attributes=attributes, start_time=_ns(started_at),
        )  # fmt: skip

    def end_request(self, node_id: str, outcome: str, *, usage: object = None) -> None:
        """The model request open for ``node_id`` ended (the planner's: no node closes it)."""
        self._end_request(node_id, outcome, error=outcome != "completed", usage=usage)

    def on_event(self, event: FlowEvent) -> None:
        """An event-bus subscriber (it never blocks: spans are only recorded)."""
        if self.ended:
            return
        try:
            self._on_event(event)
        except Exception:  # tracing never fails a run
            return

    def on_control(self, verb: str, control_id: str, sender: str | None, result: str) -> None:
        """The poller stamped an operator control: a span event with its sender."""
        if self.ended:
            return
        attributes = {
            "steerflow.control.verb": verb,
            "steerflow.control.id": control_id,
            "steerflow.control.sender": sender or "unknown",
            "steerflow.control.result": result,
        }
        self.root.add_event(f"control {verb}", attributes)

    def end(
        self,
        *,
        status: str,
        exit_code: int | None = None,
        usage: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Close what is still open and the run's span (once)."""
        if self.ended:
            return
        for node_id in list(self._requests):
            self._end_request(node_id, "unfinished", error=True)
        for span, _start in self._tools.values():
            span.set_attribute(attr.TOOL_OUTCOME, "unfinished")
            span.end()
        self._tools.clear()
        for node_id, span in list(self._nodes.items()):
            span.set_attribute(attr.NODE_STATUS, "unfinished")
            span.end()
            del self._nodes[node_id]
        self.root.set_attribute(attr.RUN_STATUS, status)
        if exit_code is not None:
            self.root.set_attribute(attr.EXIT_CODE, exit_code)
        self.root.set_attributes(_usage_attrs(usage))
        if error is not None:
            self.root.record_exception(error)
            self.root.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif status not in ("completed", "planned"):
            self.root.set_status(Status(StatusCode.ERROR, status))
        self.root.end()
        self.ended = True

    def flush(self) -> None:
        """Send what is batched (steerflow's own provider only); blocking: call it in a thread."""
        self.handle.flush()

    # -- events -------------------------------------------------------------------------

    def _on_event(self, event: FlowEvent) -> None:
        kind, node_id = event.type, event.node_id or ""
        if kind == "node_started":
            self._attempts[node_id] = self._attempts.get(node_id, 0) + 1
            self._open_node(node_id, event, restart=True)
        elif kind in _END_STATUS:
            self._close_node(node_id, event, _END_STATUS[kind])
        elif kind == "model_step":
            self._end_request(node_id, str(event.data.get("status") or "completed"),
                              usage=event.data.get("usage"))  # fmt: skip
        elif kind == "tool_call_started":
            self._tool_started(node_id, event)
        elif kind == "tool_call_ended":
            self._tool_ended(node_id, event)
        elif kind == "checkpoint_saved":
            attributes = {"steerflow.checkpoint.what": str(event.data.get("what") or "")}
            key = event.data.get("key")
            if key:
                attributes["steerflow.node.id"] = str(key)
            self.root.add_event("checkpoint saved", attributes, _ns(event.ts))
        elif kind in ("checkpoint_failed", "admission_closed", "control_applied"):
            self.root.add_event(kind.replace("_", " "), _plain(event), _ns(event.ts))
        elif kind in ("approval_requested", "approval_decided"):
            span = self._nodes.get(node_id)
            target = span if span is not None else self.root
            target.add_event(kind.replace("_", " "), _plain(event), _ns(event.ts))

    def _open_node(self, node_id: str, event: FlowEvent | None, *, restart: bool) -> trace.Span:
        if node_id in self._nodes:
            if not restart:
                return self._nodes[node_id]
            again = self._nodes.pop(node_id)  # a node's call started again: a new attempt
            again.set_attribute(attr.NODE_STATUS, "retried")
            again.end()
        op = self._ops(node_id)
        attributes: dict[str, Any] = {
            attr.NODE_ID: node_id,
            attr.NODE_ATTEMPT: self._attempts.get(node_id, 1),
            attr.OPENINFERENCE_KIND: "AGENT",
        }
        key = event.node_key if event is not None else None
        if event is not None and isinstance(event.data.get("kind"), str):
            attributes[attr.NODE_KIND] = event.data["kind"]  # an agent's turn
        if op is not None:
            key = op.key
            attributes[attr.NODE_KIND] = op.kind
            if op.assignee:
                attributes[attr.NODE_ASSIGNEE] = op.assignee
                attributes[attr.AGENT_NAME] = op.assignee
        if key:
            attributes[attr.NODE_KEY] = key
        start = _ns(event.ts if event is not None else None)
        span = self.tracer.start_span(
            f"node {key or node_id}", context=self._root_ctx, attributes=attributes,
            start_time=start,
        )  # fmt: skip
        self._nodes[node_id] = span
        self._node_ctx[node_id] = trace.set_span_in_context(span)
        return span

    def _close_node(self, node_id: str, event: FlowEvent, status: str) -> None:
        span = self._nodes.get(node_id) or self._open_node(node_id, event, restart=False)
        op = self._ops(node_id)
        failed = status == "failed"
        if op is not None:
            usage = op.usage.to_json() if op.usage is not None else None
            reply = op.response if not op.tools else None
            error = op.error
        else:  # an agent's turn: what it says in the event
            given = event.data.get("usage")
            usage = dict(given) if isinstance(given, Mapping) else None
            reply, error = event.data.get("response"), _str(event.data.get("error"))
        if node_id in self._requests:
            self._end_request(node_id, status, error=failed, usage=usage, reply=reply)
        span.set_attribute(attr.NODE_STATUS, status)
        span.set_attributes(_usage_attrs(usage))
        reason = event.data.get("reason")
        if reason is not None:
            span.set_attribute("steerflow.node.reason", str(reason))
        if failed:
            error = error or "failed"
            span.set_attribute(attr.NODE_ERROR, error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(_ns(event.ts))
        del self._nodes[node_id]

    def _end_request(
        self,
        node_id: str,
        outcome: str,
        *,
        error: bool = False,
        usage: object = None,
        reply: object = None,
    ) -> None:
        span = self._requests.pop(node_id, None)
        if span is None:
            return
        span.set_attribute(attr.CALL_OUTCOME, outcome)
        span.set_attributes(_usage_attrs(usage if isinstance(usage, Mapping) else None))
        if self.capture and reply is not None:
            span.set_attribute(attr.OUTPUT_MESSAGES, attr.content_json("assistant", reply))
        if error:
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def _tool_started(self, node_id: str, event: FlowEvent) -> None:
        d = event.data
        call_id, tool = str(d.get("call_id")), str(d.get("tool"))
        attributes: dict[str, Any] = {
            attr.OPERATION: "execute_tool",
            attr.TOOL_NAME: tool,
            attr.TOOL_CALL_ID: call_id,
            attr.OPENINFERENCE_KIND: "TOOL",
        }
        if self.capture:
            attributes[attr.TOOL_ARGS] = json.dumps(d.get("args") or {}, default=str)
        parent = self._node_ctx.get(node_id, self._root_ctx)
        span = self.tracer.start_span(
            f"execute_tool {tool}", context=parent, kind=SpanKind.INTERNAL,
            attributes=attributes, start_time=_ns(event.ts),
        )  # fmt: skip
        self._tools[(node_id, call_id)] = (span, event.ts)

    def _tool_ended(self, node_id: str, event: FlowEvent) -> None:
        call_id = str(event.data.get("call_id"))
        opened = self._tools.pop((node_id, call_id), None)
        if opened is None:  # replayed on a resume: its start was in the source run
            self._tool_started(node_id, event)
            opened = self._tools.pop((node_id, call_id))
        span, started = opened
        outcome = str(event.data.get("status"))
        span.set_attribute(attr.TOOL_OUTCOME, outcome)
        span.set_attribute(attr.TOOL_DURATION, max(0.0, event.ts - started))
        if outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, "tool call failed"))
        span.end(_ns(event.ts))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _plain(event: FlowEvent) -> dict[str, Any]:
    """An event's scalar data as span-event attributes (content-free members only)."""
    out: dict[str, Any] = {}
    for key, value in event.data.items():
        if key in ("args", "text", "instruction", "response", "usage"):
            continue
        if isinstance(value, str | int | float | bool):
            out[f"steerflow.{key}"] = value
    if event.node_key:
        out[attr.NODE_KEY] = event.node_key
    return out
