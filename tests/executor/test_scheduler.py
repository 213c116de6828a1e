"""FlowExecutor scheduling: dependency order, capacity, conditional edges, failure handling."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from steerflow.errors import ProviderError
from steerflow.executor import (
    LIBRARY_DEFAULT_MAX_SPAWN,
    FlowEvent,
    FlowExecutor,
    Graph,
    Operation,
    build_graph,
)
from steerflow.plan import parse_plan
from steerflow.providers import (
    EchoProvider,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
)

pytestmark = pytest.mark.timeout(30)


#: Upper bound on how long a ``quorum`` call waits for the others (see :class:`Scripted`).
QUORUM_WAIT_S = 5.0


class Scripted(Provider):
    """Per-node behaviour: ``delay`` seconds, then fail (``fails``) or answer (``answers``).

    With ``quorum``, calls are held until that many are in flight at once (the first time
    only, each for at most :data:`QUORUM_WAIT_S`), so a capacity the executor grants is
    reached however slowly its worker threads run, instead of depending on the calls'
    delays overlapping.
    """

    spec = "test"

    def __init__(
        self,
        *,
        delays: dict[str, float] | None = None,
        fails: set[str] | None = None,
        answers: dict[str, str] | None = None,
        crash: set[str] | None = None,
        quorum: int = 0,
    ) -> None:
        self.delays = delays or {}
        self.fails = fails or set()
        self.answers = answers or {}
        self.crash = crash or set()
        self.requests: list[ProviderRequest] = []
        self.running = 0
        self.peak = 0
        self.started = asyncio.Event()
        self.quorum = quorum
        self.quorum_reached = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.requests.append(request)
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.set()
        if self.running >= self.quorum:
            self.quorum_reached.set()
        try:
            if not self.quorum_reached.is_set():
                with contextlib.suppress(TimeoutError):  # too few in flight: the peak shows it
                    await asyncio.wait_for(self.quorum_reached.wait(), QUORUM_WAIT_S)
            await asyncio.sleep(self.delays.get(request.node_key, 0.0))
        finally:
            self.running -= 1
        if request.node_key in self.crash:
            raise RuntimeError("provider bug")
        if request.node_key in self.fails:
            raise ProviderError(f"{request.node_key} failed on purpose")
        return ProviderResponse(text=self.answers.get(request.node_key, f"done {request.node_key}"))

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


def graph_of(entries: list[dict[str, Any]], **extra: Any) -> Graph:
    return build_graph(parse_plan({"plan": entries, **extra}, source="test"))


def executor(graph: Graph, provider: Provider, tmp_path: Path, **kw: Any) -> FlowExecutor:
    return FlowExecutor(
        graph,
        provider_for=lambda op: provider,
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
        **kw,
    )


def statuses(graph: Graph) -> dict[str, str]:
    return {op.key: op.status for op in graph}


def events_of(ex: FlowExecutor, kind: str) -> list[str]:
    return [e.node_key for e in ex.events.history if e.type == kind and e.node_key]


def order_violations(ex: FlowExecutor) -> list[str]:
    """Nodes that started before one of their dependencies reached a terminal event."""
    finished: set[str] = set()
    bad = []
    for event in ex.events.history:
        if event.type in ("node_completed", "node_failed", "node_skipped"):
            finished.add(event.node_id or "")
        elif event.type == "node_started":
            op = ex.graph.ops[event.node_id or ""]
            missing = [e.source for e in op.edges if e.source not in finished]
            if missing:
                bad.append(op.key)
    return bad


# -- ordering ----------------------------------------------------------------------------------


DIAMOND = [
    {"agent_id": "root", "instruction": "r"},
    {"agent_id": "left", "instruction": "l", "depends_on": ["root"]},
    {"agent_id": "right", "instruction": "r", "depends_on": ["root"]},
    {"agent_id": "join", "instruction": "j", "depends_on": ["left", "right"]},
    {"agent_id": "after", "instruction": "a", "depends_on": ["join", "root"]},
    {"agent_id": "alone", "instruction": "a"},
]


async def test_no_node_starts_before_its_dependencies_complete(tmp_path: Path) -> None:
    # The slow branch is declared first, so a scheduler that ignored edges would show it.
    provider = Scripted(delays={"root": 0.05, "left": 0.08, "right": 0.01, "alone": 0.02})
    ex = executor(graph_of(DIAMOND), provider, tmp_path, concurrency=4)
    await ex.run()
    assert statuses(ex.graph) == dict.fromkeys(
        ["root", "left", "right", "join", "after", "alone"], "completed"
    )
    assert order_violations(ex) == []
    started = events_of(ex, "node_started")
    assert sorted(started) == sorted(op.key for op in ex.graph)
    assert started.index("join") > started.index("left")
    # a node with no dependencies does not wait for unrelated ones
    assert started.index("alone") < started.index("left")
    completed = events_of(ex, "node_completed")
    assert completed.index("left") < started.index("join")
    assert completed.index("right") < started.index("join")


async def test_dependents_receive_their_dependencies_results(tmp_path: Path) -> None:
    provider = Scripted(answers={"left": "LEFT-RESULT", "right": "RIGHT-RESULT"})
    ex = executor(graph_of(DIAMOND), provider, tmp_path)
    await ex.run()
    join = next(r for r in provider.requests if r.node_key == "join")
    assert join.instruction.startswith("j")
    assert "LEFT-RESULT" in join.instruction and "RIGHT-RESULT" in join.instruction
    root = next(r for r in provider.requests if r.node_key == "root")
    assert root.instruction == "r"
    assert root.kind == "planned" and root.artifact_dir == tmp_path / "artifacts" / "root"
    assert root.artifact_dir.is_dir()


async def test_event_stream_brackets_each_node(tmp_path: Path) -> None:
    seen: list[FlowEvent] = []
    ex = executor(graph_of(DIAMOND), Scripted(), tmp_path)
    ex.events.subscribe(seen.append)
    await ex.run()
    assert seen == ex.events.history
    for op in ex.graph:
        kinds = [e.type for e in seen if e.node_id == op.node_id]
        assert kinds == ["node_started", "node_completed"], (op.key, kinds)


async def test_observers_see_every_terminal_node(tmp_path: Path) -> None:
    observed: list[tuple[str, str]] = []

    async def observer(op: Operation) -> None:
        observed.append((op.key, op.status))

    provider = Scripted(fails={"left"})
    ex = executor(graph_of(DIAMOND), provider, tmp_path, observers=[observer])
    await ex.run()
    assert sorted(observed) == sorted(
        [("root", "completed"), ("left", "failed"), ("right", "completed"), ("alone", "completed")]
    )


# -- capacity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 2, 3])
async def test_capacity_bound_is_honoured(tmp_path: Path, concurrency: int) -> None:
    entries = [{"agent_id": f"p{i}", "instruction": "x"} for i in range(6)]
    provider = Scripted(delays={f"p{i}": 0.05 for i in range(6)}, quorum=concurrency)
    ex = executor(graph_of(entries), provider, tmp_path, concurrency=concurrency)
    running_now: list[int] = []
    ex.events.subscribe(lambda e: running_now.append(ex.running))
    await ex.run()
    assert all(s == "completed" for s in statuses(ex.graph).values())
    assert provider.peak == concurrency  # reached, never exceeded
    assert ex.max_running == concurrency
    assert max(running_now) <= concurrency


async def test_concurrency_two_six_parallel_nodes(tmp_path: Path) -> None:
    entries = [{"agent_id": f"p{i}", "instruction": "x"} for i in range(6)]
    provider = Scripted(delays={f"p{i}": 0.05 for i in range(6)}, quorum=2)
    ex = executor(graph_of(entries), provider, tmp_path, concurrency=2)
    await ex.run()
    assert provider.peak == 2
    assert len(provider.requests) == 6


def test_concurrency_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        executor(graph_of(DIAMOND), Scripted(), tmp_path, concurrency=0)


# -- failures and conditional edges -------------------------------------------------------------


async def test_failure_skips_dependents_transitively(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "a", "instruction": "x"},
        {"agent_id": "b", "instruction": "x", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "x", "depends_on": ["b"]},
        {"agent_id": "side", "instruction": "x"},
        {"agent_id": "mixed", "instruction": "x", "depends_on": ["side", "a"]},
    ]
    provider = Scripted(fails={"a"})
    ex = executor(graph_of(entries), provider, tmp_path)
    await ex.run()
    assert statuses(ex.graph) == {
        "a": "failed",
        "b": "skipped",
        "c": "skipped",
        "side": "completed",
        "mixed": "skipped",
    }
    assert ex.graph.by_key["a"].error == "a failed on purpose"
    assert sorted(events_of(ex, "node_skipped")) == ["b", "c", "mixed"]
    assert events_of(ex, "node_failed") == ["a"]
    assert {r.node_key for r in provider.requests} == {"a", "side"}  # skipped nodes never ran


async def test_provider_bug_fails_only_its_node(tmp_path: Path) -> None:
    provider = Scripted(crash={"left"})
    ex = executor(graph_of(DIAMOND), provider, tmp_path)
    await ex.run()
    assert ex.graph.by_key["left"].status == "failed"
    assert "RuntimeError" in (ex.graph.by_key["left"].error or "")
    assert ex.graph.by_key["join"].status == "skipped"
    assert ex.graph.by_key["alone"].status == "completed"


CONDITIONAL = [
    {"agent_id": "src", "instruction": "x"},
    {"agent_id": "on_ok", "instruction": "x", "depends_on": [{"id": "src"}]},
    {"agent_id": "on_fail", "instruction": "x", "depends_on": [{"id": "src", "when": "failed"}]},
    {"agent_id": "on_any", "instruction": "x", "depends_on": [{"id": "src", "when": "always"}]},
    {"agent_id": "after_fail", "instruction": "x", "depends_on": ["on_fail"]},
]


async def test_when_failed_and_always_run_after_a_failure(tmp_path: Path) -> None:
    provider = Scripted(fails={"src"})
    ex = executor(graph_of(CONDITIONAL), provider, tmp_path)
    await ex.run()
    assert statuses(ex.graph) == {
        "src": "failed",
        "on_ok": "skipped",
        "on_fail": "completed",
        "on_any": "completed",
        "after_fail": "completed",
    }
    fallback = next(r for r in provider.requests if r.node_key == "on_fail")
    assert "src failed on purpose" in fallback.instruction  # the error reaches the fallback
    assert order_violations(ex) == []


async def test_when_failed_is_skipped_after_a_success(tmp_path: Path) -> None:
    ex = executor(graph_of(CONDITIONAL), Scripted(), tmp_path)
    await ex.run()
    assert statuses(ex.graph) == {
        "src": "completed",
        "on_ok": "completed",
        "on_fail": "skipped",
        "on_any": "completed",
        "after_fail": "skipped",
    }


async def test_always_runs_after_a_skipped_source(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "a", "instruction": "x"},
        {"agent_id": "b", "instruction": "x", "depends_on": ["a"]},
        {"agent_id": "cleanup", "instruction": "x", "depends_on": [{"id": "b", "when": "always"}]},
    ]
    ex = executor(graph_of(entries), Scripted(fails={"a"}), tmp_path)
    await ex.run()
    assert statuses(ex.graph) == {"a": "failed", "b": "skipped", "cleanup": "completed"}


@pytest.mark.parametrize(("answer", "ran"), [("review: LGTM, ship", True), ("needs work", False)])
async def test_if_contains(tmp_path: Path, answer: str, ran: bool) -> None:
    entries = [
        {"agent_id": "review", "instruction": "x"},
        {
            "agent_id": "ship",
            "instruction": "x",
            "depends_on": [{"id": "review", "if_contains": "LGTM"}],
        },
        {
            "agent_id": "fix",
            "instruction": "x",
            "depends_on": [{"id": "review", "when": "always", "if_contains": "needs"}],
        },
    ]
    ex = executor(graph_of(entries), Scripted(answers={"review": answer}), tmp_path)
    await ex.run()
    assert ex.graph.by_key["ship"].status == ("completed" if ran else "skipped")
    assert ex.graph.by_key["fix"].status == ("skipped" if ran else "completed")


async def test_if_contains_never_matches_a_failed_source(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "review", "instruction": "x"},
        {
            "agent_id": "any",
            "instruction": "x",
            "depends_on": [{"id": "review", "when": "always", "if_contains": "purpose"}],
        },
    ]
    ex = executor(graph_of(entries), Scripted(fails={"review"}), tmp_path)
    await ex.run()
    assert ex.graph.by_key["any"].status == "skipped"


# -- admission, pause, defaults ------------------------------------------------------------------


async def test_close_admission_leaves_unstarted_nodes_pending(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "a", "instruction": "x"},
        {"agent_id": "b", "instruction": "x", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "x", "depends_on": ["b"]},
    ]
    provider = Scripted(delays={"a": 0.05, "b": 0.05})
    ex = executor(graph_of(entries), provider, tmp_path)

    def stop_after_a(event: FlowEvent) -> None:
        if event.type == "node_completed" and event.node_key == "a":
            ex.close_admission("test")

    ex.events.subscribe(stop_after_a)
    await asyncio.wait_for(ex.run(), 10)
    assert statuses(ex.graph) == {"a": "completed", "b": "pending", "c": "pending"}
    assert "b" in events_of(ex, "node_withheld")
    assert [e.data for e in ex.events.history if e.type == "admission_closed"] == [
        {"reason": "test"}
    ]


async def test_close_admission_can_cancel_inflight_calls(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "slow", "instruction": "x"},
        {"agent_id": "next", "instruction": "x", "depends_on": ["slow"]},
    ]
    provider = Scripted(delays={"slow": 30})
    ex = executor(graph_of(entries), provider, tmp_path)
    task = asyncio.ensure_future(ex.run())

    await asyncio.wait_for(provider.started.wait(), 5)
    ex.close_admission("SIGINT", cancel_inflight=True)
    await asyncio.wait_for(task, 5)
    assert statuses(ex.graph) == {"slow": "pending", "next": "pending"}
    assert ex.graph.by_key["slow"].error is None


async def test_pause_gate_holds_unstarted_nodes(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "a", "instruction": "x"},
        {"agent_id": "b", "instruction": "x", "depends_on": ["a"]},
    ]
    provider = Scripted()
    ex = executor(graph_of(entries), provider, tmp_path)
    ex.pause()
    task = asyncio.ensure_future(ex.run())
    paused = asyncio.Event()
    ex.events.subscribe(lambda e: paused.set() if e.type == "node_paused" else None)
    await asyncio.wait_for(paused.wait(), 5)
    assert provider.requests == [] and ex.has_pending()
    ex.resume()
    await asyncio.wait_for(task, 10)
    assert statuses(ex.graph) == {"a": "completed", "b": "completed"}


async def test_library_default_spawn_budget_is_50(tmp_path: Path) -> None:
    ex = executor(graph_of(DIAMOND), EchoProvider(), tmp_path)
    assert LIBRARY_DEFAULT_MAX_SPAWN == 50
    assert ex.max_spawn == 50
    await ex.run()
    assert all(op.status == "completed" for op in ex.graph)
    echo = ex.graph.by_key["root"].response
    assert isinstance(echo, str) and "root" in echo
