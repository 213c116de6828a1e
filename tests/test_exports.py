"""Every public package's ``__init__`` declares an ordered ``__all__`` of names that exist."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import steerflow

SRC = Path(steerflow.__file__).parent


def _public_packages() -> list[str]:
    names = ["steerflow"]
    for info in pkgutil.walk_packages(steerflow.__path__, prefix="steerflow."):
        if info.ispkg and not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


PACKAGES = _public_packages()


def _ruff_key(name: str) -> tuple[int, str]:
    """RUF022's isort-style order: SCREAMING_CASE, then CamelCase, then the rest."""
    if len(name) > 1 and re.fullmatch(r"[A-Z0-9_]+", name):
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _declared_all(package: str) -> list[str]:
    """``__all__`` as written in the source (a literal list or tuple of strings)."""
    init = SRC.joinpath(*package.split(".")[1:], "__init__.py")
    tree = ast.parse(init.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[arg-type]
            assert isinstance(value, list | tuple), f"{package}.__all__ is not a literal list"
            return list(value)
    raise AssertionError(f"{package}/__init__.py declares no __all__")


def test_the_expected_packages_are_found() -> None:
    expected = {
        "steerflow",
        "steerflow.checkpoint",
        "steerflow.cli",
        "steerflow.control",
        "steerflow.executor",
        "steerflow.orchestrate",
        "steerflow.plan",
        "steerflow.providers",
        "steerflow.resume",
        "steerflow.state",
    }
    assert expected <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_declared_ordered_and_resolves(package: str) -> None:
    names = _declared_all(package)
    assert names, f"{package}.__all__ is empty"
    assert all(isinstance(n, str) for n in names)
    assert len(names) == len(set(names)), f"{package}.__all__ repeats a name"
    assert names in (sorted(names), sorted(names, key=_ruff_key)), (
        f"{package}.__all__ is neither sorted nor in ruff (RUF022) order: {names}"
    )
    module = importlib.import_module(package)
    assert list(module.__all__) == names
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{package}.__all__ names missing attributes: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_works(package: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert set(_declared_all(package)) <= set(namespace)
