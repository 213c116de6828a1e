"""Layering: a lower layer never imports a higher one (imports found by walking the source).

Lowest first; packages in one group may import each other:
errors, home, plan; state, checkpoint, providers; control, resume; executor; orchestrate; cli.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import steerflow

SRC = Path(steerflow.__file__).parent

LAYERS: list[set[str]] = [
    {"errors", "home", "plan", "_faults"},  # _faults: test fault hooks, imports nothing of ours
    {"state", "checkpoint", "providers"},
    {"control", "resume"},
    {"executor"},
    {"orchestrate"},
    {"cli", "__main__"},
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
ROOT_MODULES = {"__init__"}  # steerflow/__init__.py must import nothing of ours


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
        assert not imports, f"steerflow/__init__.py imports {sorted(imports)}"
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
