"""A Python function given as a tool (``Op(tools=[fn])``) as the spec a resume can import.

A plan is stored as data, and a resume in another process must find each tool again, so
a callable is kept as ``python:MODULE:QUALNAME``. One that another process cannot import
back (a lambda, a function defined inside another, one of ``__main__``) is refused when
the plan is built, not when a resume needs it (issue 39 item 1).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from steerflow.errors import InvalidValueError

__all__ = ["IMPORTABLE_HOW", "importable_spec", "main_spec_problem", "tool_spec_of"]

IMPORTABLE_HOW = (
    "define it with `def` at the top level of a module that can be imported "
    "(not in the script you run, not inside another function), or give the spec "
    "'python:MODULE:FUNCTION' as a string"
)


def importable_spec(fn: Callable[..., Any], where: str = "tools", what: str = "a tool") -> str:
    """``python:MODULE:QUALNAME`` of ``fn``, once importing it gives ``fn`` back.

    Raises:
        InvalidValueError: ``fn`` cannot be imported again by another process.
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    name = qualname or repr(fn)
    if not module or not qualname:
        raise InvalidValueError(where, f"{fn!r} has no module-level name; {IMPORTABLE_HOW}")
    if qualname == "<lambda>" or "<lambda>" in qualname:
        raise InvalidValueError(
            where, f"a lambda cannot be {what} a resume finds again; {IMPORTABLE_HOW}"
        )
    if "<locals>" in qualname:
        raise InvalidValueError(
            where, f"{name} is defined inside another function, so no other process can "
            f"import it; {IMPORTABLE_HOW}"
        )  # fmt: skip
    if module == "__main__":
        raise InvalidValueError(
            where, f"{name} is defined in the script being run (__main__), which a resume "
            f"in another process does not import; {IMPORTABLE_HOW}"
        )  # fmt: skip
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidValueError(
            where, f"{module}:{qualname} cannot be imported back ({exc}); {IMPORTABLE_HOW}"
        ) from exc
    if found is not fn:
        raise InvalidValueError(
            where, f"importing {module}:{qualname} gives another object than the one "
            f"given (a decorator that does not keep the name?); {IMPORTABLE_HOW}"
        )  # fmt: skip
    return f"python:{module}:{qualname}"


def tool_spec_of(item: object, where: str) -> str:
    """A tools list item: a spec string as given, a function as its importable spec."""
    if isinstance(item, str):
        return item
    if callable(item):
        return importable_spec(item, where)
    raise InvalidValueError(where, f"{item!r} is neither a tool spec nor a function")


def main_spec_problem(spec: object) -> str | None:
    """Why a ``python:__main__:NAME`` spec given in code cannot be resumed, or None.

    The script that built the plan is ``__main__`` only in its own process: a resume
    (``steerflow resume``, another script) imports another ``__main__``.
    """
    if not isinstance(spec, str) or not spec.strip().startswith("python:__main__:"):
        return None
    return (
        f"{spec.strip()!r} names a function of the script being run (__main__), which a "
        f"resume in another process does not import; {IMPORTABLE_HOW}"
    )
