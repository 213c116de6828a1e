"""Leg directories are made only when something writes into them (issue 17, decision 62)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
import yaml

from steerflow.executor import FlowExecutor, Graph, Operation, build_graph
from steerflow.plan import parse_plan
from steerflow.providers import (
    EchoProvider,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    ScriptProvider,
)

pytestmark = pytest.mark.timeout(60)

CHAIN = [
    {"agent_id": "scope", "instruction": "s"},
    {"agent_id": "build", "instruction": "b", "depends_on": ["scope"]},
    {"agent_id": "review", "instruction": "r", "depends_on": ["build"]},
    {"agent_id": "alone", "instruction": "a"},
]


def run_with(tmp_path: Path, graph: Graph, provider: Provider) -> FlowExecutor:
    (tmp_path / "home").mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "artifacts").mkdir(mode=0o700, exist_ok=True)
    return FlowExecutor(
        graph,
        provider_for=lambda op: provider,
        run_id="20260101T000000-abcdef",
        home=tmp_path / "home",
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def test_a_plain_echo_run_creates_no_leg_directories(tmp_path: Path) -> None:
    ex = run_with(tmp_path, build_graph(parse_plan({"plan": CHAIN}, source="t")), EchoProvider())
    await asyncio.wait_for(ex.run(), 20)
    assert {op.status for op in ex.graph} == {"completed"}
    assert list((tmp_path / "artifacts").iterdir()) == []


async def test_a_script_node_with_artifacts_gets_exactly_its_directory(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(
        yaml.safe_dump({"build": {"artifacts": {"out/report.md": "report", "top.txt": "t"}}})
    )
    provider = ScriptProvider(f"script:{script}")
    ex = run_with(tmp_path, build_graph(parse_plan({"plan": CHAIN}, source="t")), provider)
    await asyncio.wait_for(ex.run(), 20)
    assert {op.status for op in ex.graph} == {"completed"}
    root = tmp_path / "artifacts"
    assert [p.name for p in root.iterdir()] == ["build"]
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert files == ["build", "build/out", "build/out/report.md", "build/top.txt"]
    assert mode(root / "build") == 0o700 and mode(root / "build" / "out") == 0o700
    assert mode(root / "build" / "out" / "report.md") == 0o600
    assert mode(root / "build" / "top.txt") == 0o600
    assert (root / "build" / "out" / "report.md").read_text() == "report"
    assert ex.graph.by_key["build"].artifacts == ["out/report.md", "top.txt"]


class _Blocker(Provider):
    """A call that writes nothing and waits until it is cancelled."""

    spec = "blocker"
    needs_artifact_dir = False

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.started.set()
        await asyncio.Event().wait()  # until cancelled
        return ProviderResponse(text="never")

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


async def cancel_one(tmp_path: Path) -> Operation:
    graph = Graph()
    op = Operation(key="build", instruction="build it")
    graph.add(op)
    provider = _Blocker()
    ex = run_with(tmp_path, graph, provider)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(ex.run())
        await asyncio.wait_for(provider.started.wait(), 10)
        ex.close_admission("SIGINT", cancel_inflight=True)
    return op


async def test_a_cancelled_node_without_a_directory_lists_no_artifacts(tmp_path: Path) -> None:
    op = await cancel_one(tmp_path)
    assert op.status == "pending" and op.cancelled == "SIGINT" and op.error is None
    assert op.artifacts == []
    assert not (tmp_path / "artifacts" / "build").exists()


async def test_a_cancelled_node_does_not_list_through_a_planted_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the leg's")
    (tmp_path / "artifacts").mkdir(mode=0o700)
    (tmp_path / "artifacts" / "build").symlink_to(outside, target_is_directory=True)
    op = await cancel_one(tmp_path)
    assert op.status == "pending" and op.cancelled == "SIGINT"
    assert op.artifacts == []


async def test_a_bad_leg_key_still_fails_a_node_whose_provider_makes_no_directory(
    tmp_path: Path,
) -> None:
    graph = build_graph(parse_plan({"plan": [{"agent_id": "ok", "instruction": "x"}]}, source="t"))
    sneaky = next(iter(graph))
    sneaky.key = ".."  # around plan validation: the executor still refuses it
    ex = run_with(tmp_path, graph, EchoProvider())
    await asyncio.wait_for(ex.run(), 20)
    assert sneaky.status == "failed" and "cannot name an artifact directory" in (sneaky.error or "")
    assert list((tmp_path / "artifacts").iterdir()) == []
