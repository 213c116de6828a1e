"""The tool node's loop (tools._loop): steps journaled in order, replayed without calls,
in-flight calls settled by idempotence or the operator's decision, limits, steering.

The model here is a real ``Provider`` subclass (the plugin protocol's ``invoke_step``)
playing a fixed list of replies; the tools are real functions behind the ``Toolset``
interface. The journal is the list the hooks append to, as the executor's recorder does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from steerflow.errors import ProviderError
from steerflow.providers._base import (
    Message,
    Provider,
    ProviderRequest,
    ProviderResponse,
    StepReply,
    StepRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from steerflow.tools import Tool, ToolOutput, Toolset
from steerflow.tools._loop import (
    UNKNOWN_OUTCOME,
    Admitted,
    LoopHeld,
    ToolCallUndecidedError,
    ToolLoop,
    undecided_calls,
)


class Played(Provider):
    """Replies in order; every request it got is kept."""

    spec = "test:played"
    supports_tools = True

    def __init__(self, replies: list[StepReply]) -> None:
        self.replies = list(replies)
        self.requests: list[StepRequest] = []

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        raise AssertionError("a tool node never calls invoke")

    async def plan(self, request: Any) -> object:
        raise AssertionError("no planning here")

    async def invoke_step(self, request: StepRequest) -> StepReply:
        self.requests.append(request)
        return self.replies.pop(0)


class Counted(Tool):
    def __init__(self, name: str, *, idempotent: bool = False, result: str = "ok") -> None:
        self.spec = ToolSpec(name, f"the {name} tool", {"type": "object", "properties": {}})
        self.source = f"test:{name}"
        self.idempotent = idempotent
        self.result = result
        self.calls: list[dict[str, Any]] = []

    async def call(self, args: Mapping[str, Any]) -> ToolOutput:
        self.calls.append(dict(args))
        return ToolOutput(f"{self.result}:{args.get('n')}")


class Tools(Toolset):
    def __init__(self, *tools: Counted) -> None:
        self._tools = {t.spec.name: t for t in tools}

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self._tools

    async def call(self, name: str, args: Mapping[str, Any]) -> ToolOutput:
        return await self._tools[name].call(args)


class Hooks:
    """The run's side, as the executor implements it: a journal and a message queue."""

    def __init__(self, messages: list[str] | None = None, *, hold_at: int | None = None):
        self.journal: list[dict[str, Any]] = []
        self.messages = list(messages or [])
        self.delivered_ids: list[str] = []
        self.hold_at = hold_at
        self.asked, self.verdicts = [], []
        self.prior: list[dict[str, Any]] = []  # what a resume was handed as recorded

    async def admit_request(self, step: int) -> Admitted:
        if self.hold_at is not None and step >= self.hold_at:
            raise LoopHeld("stopped by operator")
        sent = tuple({"control_id": f"m{i}", "text": t} for i, t in enumerate(self.messages))
        self.messages.clear()
        return Admitted(f"intent-{step}", sent)

    def delivered(self, admitted: Admitted) -> None:
        self.delivered_ids += [m["control_id"] for m in admitted.messages]

    def charge(self, usage: Any) -> Any:
        return usage

    def check_between(self) -> None:
        return None

    async def record(self, entry: dict[str, Any]) -> None:
        self.journal.append(entry)

    asked: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]

    async def await_approval(self, request: Mapping[str, Any]) -> dict[str, Any]:
        # The request is on record before anyone is asked (issue 41).
        last = [*self.prior, *self.journal][-1]
        assert (last["type"], last["status"]) == ("approval", "awaiting")
        self.asked.append(dict(request))
        return self.verdicts.pop(0)


def _request(tmp_path: Path) -> ProviderRequest:
    return ProviderRequest(
        run_id="r1", node_key="a", node_id="a", kind="planned", assignee=None,
        instruction="fix the test", history=(), artifact_dir=tmp_path / "a", home=tmp_path,
    )  # fmt: skip


def _calls(step: int, *names: str) -> StepReply:
    return StepReply(
        "", [ToolCall(f"c{step}_{i}", n, {"n": step * 10 + i}) for i, n in enumerate(names)]
    )


def _loop(model: Provider, tools: Toolset, hooks: Hooks, **kw: Any) -> ToolLoop:
    return ToolLoop(model, tools, hooks, node="a", record="op", key="a", **kw)


async def test_each_step_is_journaled_in_order_and_the_conversation_pairs_calls(
    tmp_path: Path,
) -> None:
    read, write = Counted("read"), Counted("write")
    model = Played([_calls(1, "read", "write"), _calls(2, "read"), StepReply("done")])
    hooks = Hooks()
    response = await _loop(model, Tools(read, write), hooks).run(_request(tmp_path))
    assert response.text == "done"
    kinds = [(e["index"], e["type"], e["status"]) for e in hooks.journal]
    assert kinds == [
        (1, "model", "completed"),
        (2, "tool", "in_flight"), (2, "tool", "completed"),
        (3, "tool", "in_flight"), (3, "tool", "completed"),
        (4, "model", "completed"),
        (5, "tool", "in_flight"), (5, "tool", "completed"),
        (6, "model", "completed"),
    ]  # fmt: skip
    # The model's first request carried the intent recorded for it.
    assert hooks.journal[0]["call_id"] == "intent-1"
    # The third request sees every call paired with its result, ids and order kept.
    third = model.requests[2].conversation
    assert isinstance(third[0], Message) and third[0].content == "fix the test"
    results = [item for item in third if isinstance(item, ToolResult)]
    assert [r.call_id for r in results] == ["c1_0", "c1_1", "c2_0"]
    assert [r.content for r in results] == ["ok:10", "ok:11", "ok:20"]
    assert [m.step for m in model.requests] == [1, 2, 3]


async def _run_to_the_end(tmp_path: Path) -> list[dict[str, Any]]:
    tool = Counted("post")
    model = Played([_calls(1, "post"), _calls(2, "post"), StepReply("done")])
    hooks = Hooks()
    await _loop(model, Tools(tool), hooks).run(_request(tmp_path))
    return hooks.journal


async def test_a_resume_replays_recorded_steps_without_calling_anything(tmp_path: Path) -> None:
    journal = await _run_to_the_end(tmp_path)
    # Everything up to the second tool's result is recorded: only the last request is new.
    prior = journal[:-1]
    tool = Counted("post")
    model = Played([StepReply("done again")])
    hooks = Hooks()
    response = await _loop(model, Tools(tool), hooks, prior=prior).run(_request(tmp_path))
    assert response.text == "done again"
    assert tool.calls == []
    assert len(model.requests) == 1 and model.requests[0].step == 3
    assert [e["index"] for e in hooks.journal] == [5]


async def test_an_unfinished_call_that_is_not_idempotent_is_refused_until_decided(
    tmp_path: Path,
) -> None:
    journal = await _run_to_the_end(tmp_path)
    prior = journal[:2]  # the model's step, then the intent of its call, and nothing after
    assert prior[-1]["status"] == "in_flight"
    assert [s["call_id"] for s in undecided_calls(prior, {})] == ["c1_0"]
    tool = Counted("post")
    with pytest.raises(ToolCallUndecidedError) as refused:
        await _loop(Played([]), Tools(tool), Hooks(), prior=prior).run(_request(tmp_path))
    message = str(refused.value)
    assert "'post'" in message and '{"n": 10}' in message and "c1_0=retry" in message
    assert tool.calls == []

    skipped = Hooks()
    model = Played([StepReply("went on")])
    await _loop(model, Tools(tool), skipped, prior=prior, decisions={"c1_0": "skip"}).run(
        _request(tmp_path)
    )
    assert tool.calls == []
    assert skipped.journal[0]["status"] == "skipped" and skipped.journal[0]["index"] == 2
    told = [i for i in model.requests[0].conversation if isinstance(i, ToolResult)]
    assert told[0].content == UNKNOWN_OUTCOME and told[0].is_error

    retried = Hooks()
    model = Played([StepReply("went on")])
    await _loop(model, Tools(tool), retried, prior=prior, decisions={"c1_0": "retry"}).run(
        _request(tmp_path)
    )
    assert tool.calls == [{"n": 10}]
    assert retried.journal[0]["status"] == "completed"
    assert retried.journal[0]["data"]["decision"] == "retry"


async def test_an_idempotent_unfinished_call_runs_again_on_its_own(tmp_path: Path) -> None:
    tool = Counted("read", idempotent=True)
    model = Played([_calls(1, "read"), StepReply("done")])
    hooks = Hooks()
    await _loop(model, Tools(tool), hooks).run(_request(tmp_path))
    prior = hooks.journal[:2]
    assert prior[-1]["data"]["idempotent"] is True
    assert undecided_calls(prior, {}) == []
    again = Counted("read", idempotent=True)
    await _loop(Played([StepReply("done")]), Tools(again), Hooks(), prior=prior).run(
        _request(tmp_path)
    )
    assert again.calls == [{"n": 10}]


async def test_max_steps_fails_the_node_naming_the_limit(tmp_path: Path) -> None:
    model = Played([_calls(i, "read") for i in range(1, 5)])
    with pytest.raises(ProviderError, match="max_steps 3"):
        await _loop(model, Tools(Counted("read")), Hooks(), max_steps=3).run(_request(tmp_path))
    assert len(model.requests) == 3


async def test_a_long_result_is_cut_with_a_marker_and_recorded_as_truncated(
    tmp_path: Path,
) -> None:
    tool = Counted("read", result="x" * 100)
    model = Played([_calls(1, "read"), StepReply("done")])
    hooks = Hooks()
    await _loop(model, Tools(tool), hooks, max_result_chars=10).run(_request(tmp_path))
    ended = hooks.journal[2]
    assert ended["data"]["truncated"] is True
    assert ended["data"]["result"].startswith("x" * 10 + "\n[... truncated by steerflow")
    told = [i for i in model.requests[1].conversation if isinstance(i, ToolResult)]
    assert told[0].content == ended["data"]["result"]


async def test_an_operator_message_reaches_the_next_request_once_and_is_recorded(
    tmp_path: Path,
) -> None:
    model = Played([_calls(1, "read"), _calls(2, "read"), StepReply("done")])
    hooks = Hooks()
    loop = _loop(model, Tools(Counted("read")), hooks)
    hooks.messages.append("use the other file")  # queued before the first request
    await loop.run(_request(tmp_path))
    firsts = [m for m in model.requests[0].conversation if isinstance(m, Message)]
    assert [m.content for m in firsts] == ["fix the test", "use the other file"]
    later = [m for m in model.requests[2].conversation if isinstance(m, Message)]
    assert [m.content for m in later] == ["fix the test", "use the other file"]  # once, kept
    assert hooks.delivered_ids == ["m0"]
    assert hooks.journal[0]["data"]["steered"] == [
        {"control_id": "m0", "text": "use the other file"}
    ]


async def test_a_stop_between_steps_holds_the_loop_with_its_steps_recorded(
    tmp_path: Path,
) -> None:
    model = Played([_calls(1, "read"), StepReply("done")])
    hooks = Hooks(hold_at=2)
    with pytest.raises(LoopHeld):
        await _loop(model, Tools(Counted("read")), hooks).run(_request(tmp_path))
    assert [(e["index"], e["status"]) for e in hooks.journal] == [
        (1, "completed"), (2, "in_flight"), (2, "completed"),
    ]  # fmt: skip


async def test_recorded_steps_out_of_order_are_refused(tmp_path: Path) -> None:
    journal = await _run_to_the_end(tmp_path)
    reordered = [journal[0], journal[3], journal[1], journal[2]]
    from steerflow.errors import FlowResumeError

    with pytest.raises(FlowResumeError, match="model reply before every tool call"):
        await _loop(Played([]), Tools(Counted("post")), Hooks(), prior=reordered).run(
            _request(tmp_path)
        )


def _verdict(verdict: str, **more: Any) -> dict[str, Any]:
    return {"verdict": verdict, "control_id": "ctl1", "sender": "cli:op@h:1",
            "edited_args": None, "reason": None, **more}  # fmt: skip


def _needs_post(name: str) -> bool:
    return name == "post"


async def test_a_call_needing_approval_is_recorded_then_runs_with_the_edited_arguments(
    tmp_path: Path,
) -> None:
    read, post = Counted("read"), Counted("post")
    model = Played([_calls(1, "read", "post"), StepReply("done")])
    hooks = Hooks()
    hooks.verdicts.append(_verdict("approved", edited_args={"n": 99}))
    loop = _loop(model, Tools(read, post), hooks, needs_approval=_needs_post)
    assert (await loop.run(_request(tmp_path))).text == "done"
    kinds = [(e["index"], e["type"], e["status"]) for e in hooks.journal]
    assert kinds == [
        (1, "model", "completed"),
        (2, "tool", "in_flight"), (2, "tool", "completed"),
        (3, "approval", "awaiting"), (3, "approval", "approved"),
        (4, "tool", "in_flight"), (4, "tool", "completed"),
        (5, "model", "completed"),
    ]  # fmt: skip
    [asked] = hooks.asked
    assert (asked["tool"], asked["args"]) == ("post", {"n": 11})
    assert asked["request_id"].startswith("apr_")
    assert post.calls == [{"n": 99}] and read.calls == [{"n": 10}]
    ran = hooks.journal[6]["data"]
    assert (ran["args"], ran["edited"], ran["requested_args"]) == ({"n": 99}, True, {"n": 11})
    assert ran["approval"] == asked["request_id"]


async def test_a_denied_call_never_runs_and_the_model_gets_the_reason(tmp_path: Path) -> None:
    post = Counted("post")
    model = Played([_calls(1, "post"), StepReply("understood")])
    hooks = Hooks()
    hooks.verdicts.append(_verdict("denied", reason="not on a Friday"))
    loop = _loop(model, Tools(post), hooks, needs_approval=_needs_post)
    assert (await loop.run(_request(tmp_path))).text == "understood"
    assert post.calls == []
    [result] = [i for i in model.requests[1].conversation if isinstance(i, ToolResult)]
    assert (result.call_id, result.is_error) == ("c1_0", True)
    assert result.content == "the operator denied this call: not on a Friday"


async def test_a_resume_waits_again_on_an_undecided_request_without_asking_the_model(
    tmp_path: Path,
) -> None:
    post = Counted("post")
    first = Hooks()
    first.verdicts.append(_verdict("approved"))
    model = Played([_calls(1, "post"), StepReply("done")])
    await _loop(model, Tools(post), first, needs_approval=_needs_post).run(_request(tmp_path))
    # Cut after the request was recorded: the process died while it waited.
    prior = first.journal[:2]
    assert prior[1]["status"] == "awaiting"
    again, post2 = Hooks(), Counted("post")
    again.prior = prior
    again.verdicts.append(_verdict("denied", reason="late"))
    model2 = Played([StepReply("fine")])
    await _loop(model2, Tools(post2), again, prior=prior, needs_approval=_needs_post).run(
        _request(tmp_path)
    )
    assert again.asked == [first.asked[0]]  # the same request, asked again, not re-recorded
    assert [(e["index"], e["status"]) for e in again.journal] == [(2, "denied"), (3, "completed")]
    assert len(model2.requests) == 1 and model2.requests[0].step == 2
    assert post2.calls == []


async def test_a_decision_on_record_is_never_asked_again(tmp_path: Path) -> None:
    post = Counted("post")
    first = Hooks()
    first.verdicts.append(_verdict("approved"))
    model = Played([_calls(1, "post"), StepReply("done")])
    await _loop(model, Tools(post), first, needs_approval=_needs_post).run(_request(tmp_path))
    prior = first.journal[:3]  # model, awaiting, approved: the call itself not yet started
    again, post2 = Hooks(), Counted("post")
    model2 = Played([StepReply("done")])
    await _loop(model2, Tools(post2), again, prior=prior, needs_approval=_needs_post).run(
        _request(tmp_path)
    )
    assert again.asked == [] and post2.calls == [{"n": 10}]
