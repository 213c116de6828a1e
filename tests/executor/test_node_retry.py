"""A node's own ``retry`` and ``timeout_s`` in the executor (issue 40 item 1).

Each try is announced as its own write-ahead intent with the next attempt number; a
resume's ``prior_calls`` count against ``1 + attempts``; a stop during the backoff
sends no further try; a call longer than ``timeout_s`` fails with the limit named, and
the node's retries apply to that failure too. An escalation rung keeps its op's retries.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_scheduler import executor, graph_of

from steerflow.errors import ProviderError, UnsafePathError
from steerflow.executor import CallIntent, Operation
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse
from waiting import wait_until_async

pytestmark = pytest.mark.timeout(30)


class Flaky(Provider):
    """Fails its first ``failures`` calls (``error`` raised), then answers (``stall``: never)."""

    spec = "flaky"

    def __init__(
        self, failures: int, *, stall: bool = False, error: type[ProviderError] = ProviderError
    ) -> None:
        self.calls: list[str] = []
        self.failures = failures
        self.stall = stall
        self.error = error

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.node_key)
        if self.stall:  # stalled: only its timeout_s (a cancellation) ends the call
            await asyncio.Event().wait()
        if len(self.calls) <= self.failures:
            raise self.error(f"try {len(self.calls)} failed")
        return ProviderResponse(text=f"answer {len(self.calls)}")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


def _one(**settings: object) -> list[dict[str, object]]:
    return [{"agent_id": "a", "instruction": "x", **settings}]


def _journal(ex: object) -> list[CallIntent]:
    seen: list[CallIntent] = []

    async def before(op: Operation, intent: CallIntent) -> bool:
        seen.append(intent)
        return True

    ex.before_call = before  # type: ignore[attr-defined]
    return seen


async def test_a_failing_call_is_tried_again_each_try_its_own_intent(tmp_path: Path) -> None:
    provider = Flaky(failures=2)
    graph = graph_of(_one(retry={"attempts": 3}))
    ex = executor(graph, provider, tmp_path)
    intents = _journal(ex)
    await ex.run()
    (op,) = graph
    assert op.status == "completed"
    assert op.response == "answer 3"
    assert provider.calls == ["a"] * 3
    assert [i.attempt for i in intents] == [1, 2, 3]
    assert len({i.call_id for i in intents}) == 3


async def test_the_last_failure_stands_after_one_plus_attempts_calls(tmp_path: Path) -> None:
    provider = Flaky(failures=10)
    graph = graph_of(_one(retry={"attempts": 2}))
    ex = executor(graph, provider, tmp_path)
    await ex.run()
    (op,) = graph
    assert provider.calls == ["a"] * 3
    assert op.status == "failed"
    assert op.error == "try 3 failed (after 3 calls: retry.attempts is 2)"


async def test_without_retry_a_failure_is_final(tmp_path: Path) -> None:
    provider = Flaky(failures=1)
    graph = graph_of(_one())
    await executor(graph, provider, tmp_path).run()
    assert provider.calls == ["a"]
    assert next(iter(graph)).error == "try 1 failed"


async def test_a_path_the_node_may_not_write_is_not_retried(tmp_path: Path) -> None:
    provider = Flaky(failures=10, error=UnsafePathError)
    graph = graph_of(_one(retry={"attempts": 4}))
    await executor(graph, provider, tmp_path).run()
    assert provider.calls == ["a"]
    assert next(iter(graph)).status == "failed"


async def test_a_resume_counts_the_calls_earlier_runs_made(tmp_path: Path) -> None:
    provider = Flaky(failures=10)
    graph = graph_of(_one(retry={"attempts": 2}))
    ex = executor(graph, provider, tmp_path)
    intents = _journal(ex)
    ex.prior_calls = {"a": 2}  # two tries made (and lost) by earlier runs of the chain
    await ex.run()
    assert provider.calls == ["a"]  # only the one try left
    assert [i.attempt for i in intents] == [3]
    assert next(iter(graph)).error == "try 1 failed (after 3 calls: retry.attempts is 2)"


async def test_a_resume_with_every_try_made_calls_nothing(tmp_path: Path) -> None:
    provider = Flaky(failures=0)
    graph = graph_of(_one(retry={"attempts": 1}))
    ex = executor(graph, provider, tmp_path)
    ex.prior_calls = {"a": 2}
    await ex.run()
    (op,) = graph
    assert provider.calls == []
    assert op.status == "failed"
    assert "already made its 2 call(s) (1 + retry.attempts 1)" in str(op.error)


async def test_a_stop_during_the_backoff_sends_no_further_try(tmp_path: Path) -> None:
    provider = Flaky(failures=10)
    graph = graph_of(_one(retry={"attempts": 3, "backoff_s": 60}))
    ex = executor(graph, provider, tmp_path)
    started = time.monotonic()
    run = asyncio.create_task(ex.run())
    await wait_until_async(lambda: provider.calls, timeout=10, what="the first try")
    ex.close_admission("stop")  # a graceful stop: no call is cancelled, none is sent
    await asyncio.wait_for(run, 10)
    (op,) = graph
    assert provider.calls == ["a"]
    assert op.status == "pending"  # a resume tries it again, counting this try
    assert op.cancelled == "stop"
    assert time.monotonic() - started < 30  # the backoff did not run out


async def test_a_call_longer_than_timeout_s_fails_and_is_retried(tmp_path: Path) -> None:
    provider = Flaky(failures=0, stall=True)
    graph = graph_of(
        [*_one(timeout_s=0.2, retry={"attempts": 1}), {"agent_id": "b", "instruction": "y"}]
    )
    slow_then_quick = {"a": provider, "b": Flaky(failures=0)}
    ex = executor(graph, provider, tmp_path)
    ex._provider_for = lambda op: slow_then_quick[op.key]
    started = time.monotonic()
    await ex.run()
    a, b = graph
    assert provider.calls == ["a", "a"]
    assert a.status == "failed"
    assert a.error == (
        "node 'a': the call took longer than its timeout_s of 0.2 s and was stopped "
        "(after 2 calls: retry.attempts is 1)"
    )
    assert b.status == "completed"  # the run goes on
    assert time.monotonic() - started < 20


async def test_a_signal_during_a_limited_call_still_stops_the_node(tmp_path: Path) -> None:
    provider = Flaky(failures=0, stall=True)
    graph = graph_of(_one(timeout_s=20, retry={"attempts": 2}))
    ex = executor(graph, provider, tmp_path)
    run = asyncio.create_task(ex.run())
    await wait_until_async(lambda: provider.calls, timeout=10, what="the call")
    ex.close_admission("SIGTERM", cancel_inflight=True)
    await asyncio.wait_for(run, 10)
    (op,) = graph
    assert op.status == "pending"  # cancelled by the signal, not failed by the limit
    assert op.cancelled == "SIGTERM"
    assert provider.calls == ["a"]


async def test_an_escalation_rung_keeps_its_ops_retries(tmp_path: Path) -> None:
    provider = Flaky(failures=10)
    graph = graph_of(
        [{"agent_id": "a", "instruction": "x", "assignee": "w", "retry": {"attempts": 1}}],
        roles={"w": {"escalation": ["bigger"]}},
    )
    ex = executor(graph, provider, tmp_path, escalation=lambda role: ["bigger"] if role else [])
    await ex.run()
    assert provider.calls == ["a", "a", "a.esc1", "a.esc1"]
    rung = graph.by_key["a.esc1"]
    assert (rung.retry_attempts, rung.pinned_model) == (1, "bigger")
