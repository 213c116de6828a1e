"""Package namespaces whose names are imported on first access (PEP 562).

A package ``__init__`` that imported every submodule would make each reader pay for the
whole package: ``from steerflow.plan import SYNTHESIS_KEY`` would load pydantic, and
``from steerflow.checkpoint import load_state`` the asyncio writer. A package built with
:func:`lazy_exports` imports the submodule that defines a name when that name is first
looked up, and keeps it (later lookups are plain attribute reads). Its ``__init__``
still imports every name under ``TYPE_CHECKING``, so type checkers and
``tests/test_layers.py`` see the same imports as before.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``names`` maps a name to its submodule.

    The submodule is given relative to the package (``"_load"`` for
    ``steerflow.checkpoint._load``), or absolute for a name re-exported from another
    package (``"steerflow.control._queue"``).
    """
    table = dict(names)

    def __getattr__(name: str) -> Any:  # noqa: N807  # the PEP 562 hook's own name
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = module if module.startswith("steerflow.") else f"{package}.{module}"
        value = getattr(importlib.import_module(where), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this hook
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
