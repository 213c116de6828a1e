"""Escalation ladders (Amendment 3 item 4): retries spliced after the attempt they replace."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from steerflow.errors import ProviderError
from steerflow.executor import Edge, FlowEvent, FlowExecutor, Graph, Operation, build_graph
from steerflow.plan import parse_plan, parse_reactive
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse

pytestmark = pytest.mark.timeout(60)

LADDER = {"worker": ["m1", "m2"]}


class ByModel(Provider):
    """One model of a ladder: fails the node keys in ``fails``, answers the others."""

    def __init__(self, spec: str, fails: set[str], calls: list[tuple[str, str]]) -> None:
        self.spec = spec
        self.fails = fails
        self.calls = calls

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append((request.node_key, self.spec))
        if request.node_key in self.fails:
            raise ProviderError(f"{self.spec} cannot do {request.node_key}")
        return ProviderResponse(text=f"{request.node_key} by {self.spec}: {request.instruction}")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


PLAN = [
    {"agent_id": "up", "instruction": "upstream"},
    {"agent_id": "a", "assignee": "worker", "instruction": "do a", "depends_on": ["up"]},
    {"agent_id": "b", "instruction": "use a", "depends_on": ["a"]},
    {"agent_id": "fb", "instruction": "fallback", "depends_on": [{"id": "a", "when": "failed"}]},
]


def graph_of(entries: list[dict[str, Any]]) -> Graph:
    return build_graph(parse_plan({"plan": entries}, source="test"))


async def run_ladder(
    tmp_path: Path,
    fails: dict[str, set[str]],
    *,
    ladder: dict[str, list[str]] | None = None,
    **kw: Any,
) -> tuple[FlowExecutor, list[tuple[str, str]], list[FlowEvent]]:
    calls: list[tuple[str, str]] = []
    models = {m: ByModel(m, fails.get(m, set()), calls) for m in ("base", "m1", "m2", "m3")}
    ladders = LADDER if ladder is None else ladder
    ex = FlowExecutor(
        graph_of(PLAN),
        provider_for=lambda op: models[op.pinned_model or "base"],
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
        escalation=lambda assignee: ladders.get(assignee or "", []),
        **kw,
    )
    events: list[FlowEvent] = []
    ex.events.subscribe(events.append)
    await asyncio.wait_for(ex.run(), 20)
    return ex, calls, events


def edges(graph: Graph) -> set[tuple[str, str, str]]:
    return {(graph.ops[e.source].key, op.key, e.when) for op in graph for e in op.edges}


async def test_one_failure_then_the_next_model_answers(tmp_path: Path) -> None:
    ex, calls, events = await run_ladder(tmp_path, {"base": {"a"}})
    g = ex.graph
    status = {op.key: op.status for op in g}
    assert status == {
        "up": "completed",
        "a": "failed",
        "a.esc1": "completed",
        "b": "completed",
        "fb": "skipped",  # the ladder rescued it: the fallback does not fire
    }
    retry = g.by_key["a.esc1"]
    assert (retry.kind, retry.escalated_from, retry.parent_id) == (
        "spawned",
        g.by_key["a"].node_id,
        g.by_key["a"].node_id,
    )
    assert (retry.escalation, retry.pinned_model, retry.model) == (1, "m1", "m1")
    # the same instruction, with the same dependency results, at the next model
    assert ("a.esc1", "m1") in calls and ("a", "base") in calls
    assert "up by base: upstream" in str(retry.rendered_instruction)
    # dependents moved to the retry: b got the retry's result
    assert "a.esc1 by m1" in str(g.by_key["b"].rendered_instruction)
    assert edges(g) == {
        ("up", "a", "completed"),
        ("a", "a.esc1", "failed"),
        ("a.esc1", "b", "completed"),
        ("a.esc1", "fb", "failed"),
    }
    assert g.superseded(g.by_key["a"]) and ex.spawned_count == 1
    started = {e.node_key: e.data.get("model") for e in events if e.type == "node_started"}
    assert started["a"] == "base" and started["a.esc1"] == "m1"
    spawned = [e.data for e in events if e.type == "node_spawned"]
    assert spawned == [{"emitter": "a", "escalation": 1, "model": "m1"}]


async def test_exhausted_ladder_fires_the_fallback(tmp_path: Path) -> None:
    ex, calls, _ = await run_ladder(tmp_path, {"base": {"a"}, "m1": {"a.esc1"}, "m2": {"a.esc2"}})
    g = ex.graph
    status = {op.key: op.status for op in g}
    assert status["a.esc2"] == "failed" and status["fb"] == "completed"
    assert status["b"] == "skipped"
    retry2 = g.by_key["a.esc2"]
    assert retry2.escalated_from == g.by_key["a"].node_id
    assert retry2.parent_id == g.by_key["a.esc1"].node_id  # the attempt it replaces
    assert [c for c in calls if c[0].startswith("a")] == [
        ("a", "base"),
        ("a.esc1", "m1"),
        ("a.esc2", "m2"),
    ]
    assert ("a.esc2", "fb", "failed") in edges(g) and ("a.esc2", "b", "completed") in edges(g)
    assert "a.esc3" not in g.by_key


async def test_budget_refuses_the_retry(tmp_path: Path) -> None:
    ex, _, events = await run_ladder(tmp_path, {"base": {"a"}}, max_spawn=0)
    status = {op.key: op.status for op in ex.graph}
    assert "a.esc1" not in status and status["fb"] == "completed" and status["b"] == "skipped"
    assert [(r.emitter, r.agent_id, r.reason) for r in ex.spawn_rejections] == [
        ("a", "a.esc1", "max_spawn_exceeded")
    ]
    assert any(e.type == "spawn_rejected" and e.node_key == "a" for e in events)


async def test_closed_admission_refuses_the_retry(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class Closing(ByModel):
        async def invoke(self, request: ProviderRequest) -> ProviderResponse:
            if request.node_key == "a":
                ex.close_admission("deadline")
                gate.set()
            return await super().invoke(request)

    calls: list[tuple[str, str]] = []
    base = Closing("base", {"a"}, calls)
    ex = FlowExecutor(
        graph_of(PLAN),
        provider_for=lambda op: base,
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / key,
        escalation=lambda assignee: LADDER.get(assignee or "", []),
    )
    await asyncio.wait_for(ex.run(), 20)
    assert gate.is_set()
    assert [(r.agent_id, r.reason) for r in ex.spawn_rejections] == [("a.esc1", "admission_closed")]
    assert "a.esc1" not in ex.graph.by_key


async def test_no_ladder_means_no_retry(tmp_path: Path) -> None:
    ex, _, _ = await run_ladder(tmp_path, {"base": {"a"}}, ladder={})
    assert {op.key: op.status for op in ex.graph}["fb"] == "completed"
    assert ex.spawned_count == 0 and not ex.graph.replaced_by


def test_splice_after_moves_edges_with_their_conditions() -> None:
    g = Graph()
    a, b, c = Operation("a", "a"), Operation("b", "b"), Operation("c", "c")
    for op in (a, b, c):
        g.add(op)
    b.edges = [Edge(a.node_id)]
    c.edges = [Edge(a.node_id, when="always", if_contains="x"), Edge(b.node_id)]
    r = Operation("a.esc1", "a", kind="spawned", edges=[Edge(a.node_id, when="failed")])
    g.splice_after(a.node_id, r)
    assert g.ops[r.node_id] is r and r.edges == [Edge(a.node_id, when="failed")]
    assert b.edges == [Edge(r.node_id)]
    assert c.edges == [Edge(r.node_id, when="always", if_contains="x"), Edge(b.node_id)]
    assert g.chain_end(a.node_id) == r.node_id and g.superseded(a) and not g.superseded(r)
    with pytest.raises(ValueError, match="already replaced"):
        g.splice_after(a.node_id, Operation("a.esc2", "a", kind="spawned"))


async def test_a_spawned_node_escalates_from_its_emitters_branch(tmp_path: Path) -> None:
    histories: dict[str, tuple[str, ...]] = {}

    class Spawning(ByModel):
        async def invoke(self, request: ProviderRequest) -> ProviderResponse:
            histories[request.node_key] = tuple(m.content for m in request.history)
            if request.node_key == "lead":
                spawn = {"agent_id": "kid", "instruction": "kid work", "assignee": "worker"}
                return ProviderResponse(text="lead answer", spawns=[spawn])
            return await super().invoke(request)

    calls: list[tuple[str, str]] = []
    models = {m: Spawning(m, {"kid"} if m == "base" else set(), calls) for m in ("base", "m1")}
    ex = FlowExecutor(
        graph_of([{"agent_id": "lead", "instruction": "lead"}]),
        provider_for=lambda op: models[op.pinned_model or "base"],
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / key,
        reactive=parse_reactive("all"),
        escalation=lambda assignee: LADDER.get(assignee or "", []),
    )
    await asyncio.wait_for(ex.run(), 20)
    g = ex.graph
    assert {op.key: op.status for op in g} == {
        "lead": "completed",
        "kid": "failed",
        "kid.esc1": "completed",
    }
    retry = g.by_key["kid.esc1"]
    assert retry.escalated_from == retry.parent_id == g.by_key["kid"].node_id
    assert ("kid.esc1", "m1") in calls
    # the retry starts from the same conversation its root started from
    assert histories["kid.esc1"] == histories["kid"] == ("lead", "lead answer")
