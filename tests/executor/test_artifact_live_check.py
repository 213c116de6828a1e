"""The live check: an operation that declared artifacts completes only if it produced them."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from steerflow.executor import FlowExecutor, Graph, build_graph
from steerflow.plan import parse_plan, parse_reactive
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse

pytestmark = pytest.mark.timeout(60)

Maker = Callable[[Path], None]


class _Maker(Provider):
    """Leaves in each leg directory what ``makers[key]`` makes, then answers."""

    spec = "maker"

    def __init__(self, makers: dict[str, Maker], spawns: dict[str, list[object]] | None = None):
        self.makers = makers
        self.spawns = spawns or {}

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        make = self.makers.get(request.node_key)
        if make is not None:
            await asyncio.to_thread(_make_in, request.artifact_dir, make)
        return ProviderResponse(
            text=f"done {request.node_key}", spawns=list(self.spawns.get(request.node_key, []))
        )

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


def _make_in(leg: Path, make: Maker) -> None:
    leg.mkdir(parents=True, exist_ok=True)
    make(leg)


def _write(files: dict[str, bytes]) -> Maker:
    def make(leg: Path) -> None:
        for rel, data in files.items():
            (leg / rel).parent.mkdir(parents=True, exist_ok=True)
            (leg / rel).write_bytes(data)

    return make


def _graph(declared: list[str], *, role: list[str] | None = None) -> Graph:
    return build_graph(
        parse_plan(
            {
                "roles": {"coder": {"artifacts": role or []}},
                "plan": [
                    {
                        "agent_id": "build",
                        "assignee": "coder",
                        "instruction": "build",
                        "artifacts": declared,
                    },
                    {"agent_id": "after", "instruction": "use it", "depends_on": ["build"]},
                    {
                        "agent_id": "fallback",
                        "instruction": "recover",
                        "depends_on": [{"id": "build", "when": "failed"}],
                    },
                ],
            },
            source="test",
        )
    )


async def _run(graph: Graph, provider: Provider, root: Path, **kwargs: object) -> FlowExecutor:
    executor = FlowExecutor(
        graph,
        provider_for=lambda _: provider,
        run_id="run",
        home=root,
        artifact_dir=lambda key: root / "artifacts" / key,
        **kwargs,  # type: ignore[arg-type]
    )
    await asyncio.wait_for(executor.run(), timeout=30)
    return executor


def _digest(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=32).hexdigest()


async def test_declared_files_found_are_recorded_with_size_and_digest(tmp_path: Path) -> None:
    graph = _graph(["out/report.md"], role=["patch.diff"])
    maker = _Maker({"build": _write({"out/report.md": b"report!", "patch.diff": b"diff"})})
    await _run(graph, maker, tmp_path)
    build = graph.by_key["build"]
    assert build.status == "completed", build.error
    assert [r.to_json() for r in build.artifact_records] == [
        {"path": "out/report.md", "bytes": 7, "digest": _digest(b"report!")},
        {"path": "patch.diff", "bytes": 4, "digest": _digest(b"diff")},
    ]
    assert graph.by_key["after"].status == "completed"
    assert graph.by_key["fallback"].status == "skipped"


def _symlink(leg: Path) -> None:
    (leg.parent / "real.txt").write_bytes(b"real bytes")
    (leg / "a.txt").symlink_to(leg.parent / "real.txt")


def _directory(leg: Path) -> None:
    (leg / "a.txt").mkdir()
    (leg / "a.txt" / "inside").write_bytes(b"x")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_write({}), "a.txt (missing)"),
        (_write({"a.txt": b""}), "a.txt (empty)"),
        (_symlink, "a.txt (not a regular file: a symlink)"),
        (_directory, "a.txt (not a regular file: a directory)"),
    ],
    ids=["missing", "empty", "symlink", "directory"],
)
async def test_a_declared_file_not_produced_fails_the_node_naming_it(
    tmp_path: Path, make: Maker, said: str
) -> None:
    graph = _graph(["a.txt", "b.txt"])

    def both(leg: Path) -> None:
        (leg / "b.txt").write_bytes(b"fine")
        make(leg)

    await _run(graph, _Maker({"build": both}), tmp_path)
    build = graph.by_key["build"]
    assert build.status == "failed"
    assert build.error is not None and said in build.error
    assert str(tmp_path / "artifacts" / "build") in build.error
    assert "b.txt" not in build.error  # only what is wrong is named
    assert build.artifact_records == []
    # dependents follow the usual edge rules
    assert graph.by_key["after"].status == "skipped"
    assert graph.by_key["fallback"].status == "completed"


async def test_a_node_that_writes_nothing_fails_naming_every_declared_file(
    tmp_path: Path,
) -> None:
    graph = _graph(["a.txt", "sub/b.txt"])
    await _run(graph, _Maker({}), tmp_path)  # not even a leg directory
    error = graph.by_key["build"].error or ""
    assert "a.txt (missing)" in error and "sub/b.txt (missing)" in error


async def test_a_node_without_a_declaration_is_not_checked(tmp_path: Path) -> None:
    graph = _graph([])
    await _run(graph, _Maker({}), tmp_path)
    assert graph.by_key["build"].status == "completed"
    assert graph.by_key["build"].artifact_records == []


async def test_a_spawned_leg_declares_its_role_and_request_paths_under_its_spawn_id(
    tmp_path: Path,
) -> None:
    graph = _graph([])
    spawn = {"agent_id": "fix-1", "assignee": "coder", "instruction": "fix", "artifacts": ["f.txt"]}
    bad = {"agent_id": "fix-2", "instruction": "fix", "artifacts": ["../escape"]}
    maker = _Maker({"fix-1": _write({"f.txt": b"F", "r.txt": b"R"})}, {"build": [spawn, bad]})
    executor = await _run(
        graph,
        maker,
        tmp_path,
        reactive=parse_reactive("all"),
        role_artifacts=lambda role: ["r.txt"] if role == "coder" else [],
    )
    child = graph.by_key["fix-1"]
    assert child.declared_artifacts == ("r.txt", "f.txt")
    assert child.status == "completed", child.error
    assert [r.path for r in child.artifact_records] == ["f.txt", "r.txt"]
    assert (tmp_path / "artifacts" / "fix-1" / "f.txt").is_file()
    assert "fix-2" not in graph.by_key
    (rejection,) = executor.spawn_rejections
    assert (rejection.agent_id, rejection.reason) == ("fix-2", "builder_error")
    assert "artifacts[0]" in rejection.detail


async def test_a_symlinked_leg_directory_is_not_read_through(tmp_path: Path) -> None:
    # The check lstat()s the leg directory here: the blockbuster fixture fails this test
    # if that (or any of the check's file I/O) ran on the event loop.
    elsewhere = tmp_path / "elsewhere"

    def swap(leg: Path) -> None:
        (leg / "a.txt").write_bytes(b"through the link")
        leg.rename(elsewhere)
        leg.symlink_to(elsewhere)

    graph = _graph(["a.txt"])
    await _run(graph, _Maker({"build": swap}), tmp_path)
    build = graph.by_key["build"]
    assert (tmp_path / "artifacts" / "build" / "a.txt").is_file()  # followed, it is there
    assert build.status == "failed"
    assert "a.txt (not a regular file: the leg directory is a symlink)" in (build.error or "")
