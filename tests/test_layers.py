"""Layering: a lower layer never imports a higher one (imports found by walking the source).

Lowest first; packages in one group may import each other:
errors, home, plan; state, checkpoint, providers, artifacts; control, resume; executor, tracing;
orchestrate; views; cli, mcp, studio.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import steerflow

SRC = Path(steerflow.__file__).parent

LAYERS: list[set[str]] = [
    # _faults: test fault hooks; _lazy: the packages' import-on-first-access namespaces;
    # neither imports anything of ours; _live: the live-output files (decision 190);
    # _usage: stored token usage and cost, summed by the readers without the providers;
    # _values: the option checks the CLI and the API share (decision 245)
    {"errors", "home", "plan", "_faults", "_lazy", "_live", "_usage", "_values"},
    {"state", "checkpoint", "providers", "artifacts"},
    {"control", "resume", "cluster", "tools"},  # cluster: Ray; tools: the step loop
    {"executor", "tracing"},  # tracing: a run's spans from the executor's events (issue 45)
    {"orchestrate"},
    {"views"},  # the typed readers the CLI, the MCP server and the Studio share
    {"cli", "__main__", "mcp", "studio"},
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
ROOT_MODULES = {"__init__"}  # steerflow/__init__.py: the public facade, see below
ROOT_EAGER = {"errors"}  # what the facade may import at load time; the rest lazily


def _component(path: Path) -> str:
    """The top-level package or module of ``steerflow`` a file belongs to."""
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imported_components(path: Path) -> set[tuple[str, int]]:
    """(component, line) of every ``steerflow`` import in a file, lazy ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _component(path)
    package_parts = list(path.relative_to(SRC).parent.parts)
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)]
                if not base:  # ``from .. import x`` at the root: each name is a component
                    found.update((alias.name, node.lineno) for alias in node.names)
                    continue
                found.add((base[0], node.lineno))
                continue
            if node.module == "steerflow":  # from steerflow import _faults
                found.update((alias.name, node.lineno) for alias in node.names)
                continue
            modules = [node.module or ""]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "steerflow" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return {(c, line) for c, line in found if c != here}


def _eager_components(path: Path) -> set[str]:
    """Components a module imports when it is loaded: top-level, outside ``TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("steerflow."):
            found.add((node.module or "").split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[1] for a in node.names if a.name.startswith("steerflow.")
            )
    return found


FILES = sorted(SRC.rglob("*.py"))


def test_every_component_has_a_layer() -> None:
    components = {_component(f) for f in FILES} - ROOT_MODULES
    unknown = sorted(components - set(LEVEL))
    assert not unknown, f"place these in LAYERS: {unknown}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_upward_imports(path: Path) -> None:
    here = _component(path)
    imports = _imported_components(path)
    if here in ROOT_MODULES:
        eager = _eager_components(path)
        assert eager <= ROOT_EAGER, f"steerflow/__init__.py imports {sorted(eager)} at load time"
        return
    bad = [
        f"{path.relative_to(SRC)}:{line} imports steerflow.{target} "
        f"(layer {LEVEL.get(target)}) from layer {LEVEL[here]}"
        for target, line in sorted(imports)
        if target not in LEVEL or LEVEL[target] > LEVEL[here]
    ]
    assert not bad, "\n".join(bad)


def test_the_walker_sees_imports() -> None:
    """Guard against a walker that silently finds nothing."""
    run = SRC / "orchestrate" / "_run.py"
    targets = {c for c, _ in _imported_components(run)}
    assert {"executor", "plan", "checkpoint", "state"} <= targets
    cli = {c for f in (SRC / "cli").glob("*.py") for c, _ in _imported_components(f)}
    assert "orchestrate" in cli


def _module_name(path: Path) -> str:
    """``steerflow.a.b`` for ``a/b.py``, ``steerflow.a`` for ``a/__init__.py``."""
    parts = ["steerflow", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(f): f for f in FILES}


def _imported_modules(path: Path) -> set[str]:
    """Every ``steerflow`` module a file imports, lazy and ``TYPE_CHECKING`` ones included.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
    module, else of ``pkg``; the implicit import of parent packages is not counted.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a self-import (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_modules() -> None:
    graph = {name: _imported_modules(path) for name, path in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles among steerflow modules:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_finder_finds_cycles() -> None:
    """Guard against a cycle check that can never fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    registry = MODULES["steerflow.providers._registry"]
    assert "steerflow.providers.openai" in _imported_modules(registry)  # lazy imports count


VOCABULARIES = {"Phase", "NodeStatus", "NodeKind", "SessionStatus", "ControlVerb"}


def test_each_vocabulary_is_defined_once() -> None:
    """``Phase``, ``NodeStatus``, ``NodeKind``... are spelled only in ``state/_vocab.py``."""
    definitions = sorted(
        (target.id, str(path.relative_to(SRC)))
        for path in FILES
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id in VOCABULARIES
    )
    assert definitions == [(name, "state/_vocab.py") for name in sorted(VOCABULARIES)]


def test_nothing_imports_the_facade() -> None:
    """Packages import each other, never a name from ``steerflow/__init__.py``."""
    bad = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "steerflow" and not node.level:
                bad += [
                    f"{path.relative_to(SRC)}:{node.lineno} imports steerflow.{alias.name}"
                    for alias in node.names
                    if f"steerflow.{alias.name}" not in MODULES
                ]
    assert not bad, "\n".join(bad)
