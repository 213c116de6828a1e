"""Reactive growth: accepted spawns, every rejection reason, and the spawn budget (ADR D5)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from steerflow.executor import (
    CLI_DEFAULT_MAX_SPAWN,
    Edge,
    FlowExecutor,
    Graph,
    build_graph,
)
from steerflow.orchestrate import FlowOptions, run_flow
from steerflow.plan import parse_plan, parse_reactive
from steerflow.providers import Message, PlanRequest, Provider, ProviderRequest, ProviderResponse

pytestmark = pytest.mark.timeout(60)


class Spawner(Provider):
    """Answers every node; nodes named in ``spawns`` also return those raw spawn requests."""

    spec = "spawner"

    def __init__(self, spawns: dict[str, list[object]], *, delay: float = 0.0) -> None:
        self.spawns = spawns
        self.delay = delay
        self.requests: dict[str, ProviderRequest] = {}

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.requests[request.node_key] = request
        if self.delay:
            await asyncio.sleep(self.delay)
        return ProviderResponse(
            text=f"answer of {request.node_key}",
            spawns=list(self.spawns.get(request.node_key, [])),
        )

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


PLAN = [
    {"agent_id": "lead", "assignee": "boss", "instruction": "lead the work"},
    {"agent_id": "tail", "instruction": "finish", "depends_on": ["lead"]},
]


def graph_of(entries: list[dict[str, Any]]) -> Graph:
    return build_graph(parse_plan({"plan": entries}, source="test"))


async def run_spawns(
    tmp_path: Path,
    spawns: dict[str, list[object]],
    *,
    entries: list[dict[str, Any]] | None = None,
    reactive: str = "all",
    **kw: Any,
) -> tuple[FlowExecutor, Spawner]:
    provider = Spawner(spawns)
    ex = FlowExecutor(
        graph_of(entries or PLAN),
        provider_for=lambda op: provider,
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
        system_prompt=lambda op: "be brief",
        reactive=parse_reactive(reactive),
        **kw,
    )
    await asyncio.wait_for(ex.run(), 20)
    return ex, provider


def reasons(ex: FlowExecutor) -> list[tuple[str | None, str]]:
    return [(r.agent_id, r.reason) for r in ex.spawn_rejections]


def rejected_events(ex: FlowExecutor) -> list[dict[str, object]]:
    return [e.data for e in ex.events.history if e.type == "spawn_rejected"]


def child(agent_id: str, **extra: object) -> dict[str, object]:
    return {"agent_id": agent_id, "instruction": f"do {agent_id}", **extra}


# -- accepted spawns ---------------------------------------------------------------------------


async def test_accepted_spawn_becomes_a_node(tmp_path: Path) -> None:
    ex, provider = await run_spawns(tmp_path, {"lead": [child("fix-1", assignee="coder")]})
    assert ex.spawn_rejections == []
    lead = ex.graph.by_key["lead"]
    fix = ex.graph.by_key["fix-1"]
    assert fix.kind == "spawned"
    assert fix.assignee == "coder"
    assert fix.status == "completed"
    assert fix.parent_id == lead.node_id
    assert fix.node_id != "fix-1" and len(fix.node_id) == 32  # a fresh uuid; the key is spawn_id
    assert Edge(source=lead.node_id) in fix.edges  # an edge from the emitter
    assert ex.spawned_count == 1
    spawned = [e for e in ex.events.history if e.type == "node_spawned"]
    assert len(spawned) == 1
    assert spawned[0].node_key == "fix-1" and spawned[0].node_id == fix.node_id
    assert spawned[0].data["emitter"] == "lead"
    # the child ran after its emitter completed, as a spawned request
    kinds = [(e.type, e.node_key) for e in ex.events.history]
    assert kinds.index(("node_completed", "lead")) < kinds.index(("node_started", "fix-1"))
    assert provider.requests["fix-1"].kind == "spawned"
    assert provider.requests["fix-1"].artifact_dir == tmp_path / "artifacts" / "fix-1"


async def test_spawned_node_starts_from_a_clone_of_the_emitters_branch(tmp_path: Path) -> None:
    ex, provider = await run_spawns(tmp_path, {"lead": [child("fix-1")]})
    lead = ex.graph.by_key["lead"]
    fix = ex.graph.by_key["fix-1"]
    emitter_branch = [
        Message("system", "be brief"),
        Message("user", "lead the work"),
        Message("assistant", "answer of lead"),
    ]
    assert lead.branch == emitter_branch
    assert list(provider.requests["fix-1"].history) == emitter_branch
    # a clone: the child's conversation grew, the emitter's did not
    assert fix.branch[: len(emitter_branch)] == emitter_branch
    assert len(fix.branch) == len(emitter_branch) + 2
    assert lead.branch == emitter_branch
    assert fix.branch is not lead.branch


async def test_spawn_without_emitter_link_and_with_extra_deps(tmp_path: Path) -> None:
    ex, _ = await run_spawns(
        tmp_path,
        {"tail": [child("free", link_to_emitter=False, depends_on=["lead"])]},
    )
    free = ex.graph.by_key["free"]
    lead, tail = ex.graph.by_key["lead"], ex.graph.by_key["tail"]
    assert [e.source for e in free.edges] == [lead.node_id]
    assert tail.node_id not in {e.source for e in free.edges}
    assert free.parent_id == tail.node_id
    assert free.status == "completed"


async def test_spawned_nodes_may_spawn_again(tmp_path: Path) -> None:
    ex, _ = await run_spawns(
        tmp_path, {"lead": [child("kid")], "kid": [child("grandkid")]}, max_spawn=5
    )
    assert ex.graph.by_key["grandkid"].parent_id == ex.graph.by_key["kid"].node_id
    assert ex.graph.by_key["grandkid"].status == "completed"
    assert ex.spawned_count == 2


# -- every rejection reason --------------------------------------------------------------------


async def test_null_child(tmp_path: Path) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [None, {}]})
    assert reasons(ex) == [(None, "null_child"), (None, "null_child")]
    assert len(ex.graph) == 2


@pytest.mark.parametrize(
    "raw",
    [
        {"agent_id": "no-instruction"},
        {"agent_id": "extra", "instruction": "x", "unexpected": True},
        {"instruction": "no id"},
        "not a mapping",
        {"agent_id": "ghost-dep", "instruction": "x", "depends_on": ["nobody"]},
    ],
    ids=["no-instruction", "unknown-key", "no-id", "not-a-dict", "unknown-dep"],
)
async def test_builder_error(tmp_path: Path, raw: object) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [raw]})
    assert [r for _, r in reasons(ex)] == ["builder_error"]
    assert ex.spawn_rejections[0].emitter == "lead"
    assert ex.spawn_rejections[0].detail
    assert len(ex.graph) == 2
    assert rejected_events(ex)[0]["reason"] == "builder_error"


@pytest.mark.parametrize("bad", ["..", ".", ".hidden", "a/b", "../../etc", "bad id!", "", 7])
async def test_invalid_id(tmp_path: Path, bad: object) -> None:
    ex, provider = await run_spawns(tmp_path, {"lead": [{"agent_id": bad, "instruction": "x"}]})
    assert [r for _, r in reasons(ex)] == ["invalid_id"]
    rejection = ex.spawn_rejections[0]
    assert rejection.emitter == "lead" and "must match" in rejection.detail
    assert rejected_events(ex)[0]["reason"] == "invalid_id"
    assert len(ex.graph) == 2 and ex.spawned_count == 0
    assert set(provider.requests) == {"lead", "tail"}
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == ["lead", "tail"]


async def test_a_node_whose_key_names_a_path_component_fails_before_its_call(
    tmp_path: Path,
) -> None:
    # Defence in depth: a graph built around plan validation still cannot use `..`.
    graph = graph_of([{"agent_id": "ok", "instruction": "x"}])
    sneaky = next(iter(graph))
    sneaky.key = ".."
    provider = Spawner({})
    ex = FlowExecutor(
        graph,
        provider_for=lambda op: provider,
        run_id="r",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "runs" / "r" / "artifacts" / key,
    )
    await asyncio.wait_for(ex.run(), 20)
    assert sneaky.status == "failed" and "cannot name an artifact directory" in (sneaky.error or "")
    assert provider.requests == {}
    assert not (tmp_path / "runs" / "r" / "artifacts").exists() or not any(
        (tmp_path / "runs" / "r" / "artifacts").iterdir()
    )


async def test_cycle(tmp_path: Path) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [child("loop", depends_on=["loop"])]})
    assert reasons(ex) == [("loop", "cycle")]
    assert "loop" not in ex.graph.by_key


@pytest.mark.parametrize("existing", ["lead", "tail"])
async def test_duplicate_of_a_planned_node(tmp_path: Path, existing: str) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [child(existing)]})
    assert reasons(ex) == [(existing, "duplicate")]
    assert len(ex.graph) == 2


async def test_duplicate_of_a_spawned_node(tmp_path: Path) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [child("twin"), child("twin")]})
    assert reasons(ex) == [("twin", "duplicate")]
    assert ex.spawned_count == 1


async def test_max_spawn_exceeded(tmp_path: Path) -> None:
    ex, _ = await run_spawns(
        tmp_path, {"lead": [child("k1"), child("k2"), child("k3")]}, max_spawn=1
    )
    assert reasons(ex) == [("k2", "max_spawn_exceeded"), ("k3", "max_spawn_exceeded")]
    assert [op.key for op in ex.graph if op.kind == "spawned"] == ["k1"]


async def test_zero_budget_rejects_every_spawn(tmp_path: Path) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [child("k1")]}, max_spawn=0)
    assert reasons(ex) == [("k1", "max_spawn_exceeded")]


async def test_each_rejection_emits_an_event(tmp_path: Path) -> None:
    ex, _ = await run_spawns(
        tmp_path,
        {
            "lead": [
                None,
                {"agent_id": "x y", "instruction": "bad"},
                child("selfish", depends_on=["selfish"]),
                child("tail"),
                child("ok"),
                child("over"),
            ]
        },
        max_spawn=1,
    )
    expected = [
        (None, "null_child"),
        ("x y", "invalid_id"),
        ("selfish", "cycle"),
        ("tail", "duplicate"),
        ("over", "max_spawn_exceeded"),
    ]
    assert reasons(ex) == expected
    assert [(d["agent_id"], d["reason"]) for d in rejected_events(ex)] == expected
    assert ex.graph.by_key["ok"].status == "completed"


async def test_library_default_budget_is_50(tmp_path: Path) -> None:
    kids = [child(f"k{i:02d}") for i in range(51)]
    ex, _ = await run_spawns(tmp_path, {"lead": kids}, concurrency=16)
    assert ex.spawned_count == 50
    assert reasons(ex) == [("k50", "max_spawn_exceeded")]


async def test_reactive_off_ignores_spawns(tmp_path: Path) -> None:
    ex, _ = await run_spawns(tmp_path, {"lead": [child("k1")]}, reactive="off")
    assert len(ex.graph) == 2
    assert ex.spawned_count == 0
    assert [d["reason"] for d in rejected_events(ex)] == ["reactive_disabled"]


async def test_reactive_role_list(tmp_path: Path) -> None:
    spawns: dict[str, list[object]] = {"lead": [child("from-boss")], "tail": [child("from-none")]}
    ex, provider = await run_spawns(tmp_path, spawns, reactive="boss")
    assert "from-boss" in ex.graph.by_key
    assert "from-none" not in ex.graph.by_key
    assert provider.requests["lead"].allow_spawn is True
    assert provider.requests["tail"].allow_spawn is False


async def test_failed_emitter_spawns_nothing(tmp_path: Path) -> None:
    class FailingSpawner(Spawner):
        async def invoke(self, request: ProviderRequest) -> ProviderResponse:
            from steerflow.errors import ProviderError

            raise ProviderError("no")

    provider = FailingSpawner({"lead": [child("k")]})
    ex = FlowExecutor(
        graph_of(PLAN),
        provider_for=lambda op: provider,
        run_id="r",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / key,
        reactive=parse_reactive("all"),
    )
    await ex.run()
    assert len(ex.graph) == 2 and ex.spawn_rejections == []


# -- the budget as the run computes it (run_flow) ----------------------------------------------


def _files(tmp_path: Path, kids: int) -> tuple[Path, Path]:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "plan": [
                    {"agent_id": "root", "instruction": "r"},
                    {"agent_id": "mid", "instruction": "m", "depends_on": ["root"]},
                    {"agent_id": "end", "instruction": "e", "depends_on": ["mid"]},
                ]
            }
        )
    )
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"root": {"spawn": [child(f"kid-{i:02d}") for i in range(kids)]}}))
    return plan, script


def stored_checkpoint(result: Any) -> dict[str, Any]:
    """The run's checkpoint file as written (version 2: one JSON document)."""
    data = json.loads(Path(result.checkpoint["path"]).read_text())
    assert isinstance(data, dict)
    return data


async def _run(tmp_path: Path, kids: int, **options: Any) -> Any:
    plan, script = _files(tmp_path, kids)
    opts = FlowOptions(
        plan_path=plan, model=f"script:{script}", reactive="all", checkpoint_version=2, **options
    )
    return await run_flow(opts, home=tmp_path / "home")


async def test_max_ops_5_with_3_planned_allows_exactly_2_spawns(tmp_path: Path) -> None:
    result = await _run(tmp_path, 4, max_ops=5)
    assert result.exit_code == 0, result.to_json()
    spawned = [n["id"] for n in result.nodes if n["kind"] == "spawned"]
    assert spawned == ["kid-00", "kid-01"]
    assert [(r["agent_id"], r["reason"]) for r in result.spawn_rejections] == [
        ("kid-02", "max_spawn_exceeded"),
        ("kid-03", "max_spawn_exceeded"),
    ]
    stored = stored_checkpoint(result)
    assert stored["max_spawn"] == 2
    assert stored["config"]["max_ops"] == 5
    assert sorted(e["spawn_id"] for e in stored["spawned"]) == ["kid-00", "kid-01"]


@pytest.mark.parametrize(("max_ops", "budget"), [(3, 0), (2, 0), (4, 1)])
async def test_budget_never_negative(tmp_path: Path, max_ops: int, budget: int) -> None:
    result = await _run(tmp_path, 2, max_ops=max_ops)
    assert len([n for n in result.nodes if n["kind"] == "spawned"]) == budget
    assert stored_checkpoint(result)["max_spawn"] == budget


async def test_uncapped_run_uses_the_cli_default_of_20(tmp_path: Path) -> None:
    assert CLI_DEFAULT_MAX_SPAWN == 20
    result = await _run(tmp_path, 21, concurrency=8)
    assert len([n for n in result.nodes if n["kind"] == "spawned"]) == 20
    assert [r["reason"] for r in result.spawn_rejections] == ["max_spawn_exceeded"]
    assert stored_checkpoint(result)["max_spawn"] == 20
