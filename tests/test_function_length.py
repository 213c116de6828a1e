"""No function in ``src/steerflow`` is longer than 80 lines (AGENTS rules, issue 29 item 6).

Counted from the ``def`` line (decorators not included) to the last line of the body, so a
docstring counts and a long signature counts; nested functions count inside their parent and
on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import steerflow

SRC = Path(steerflow.__file__).parent
LIMIT = 80


def _long_functions(source: str, name: str) -> list[str]:
    """``path:line name (N lines)`` of every function in ``source`` over :data:`LIMIT`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                found.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_over_80_lines() -> None:
    long = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in _long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(SRC)))
    ]
    assert not long, f"split these (at most {LIMIT} lines each):\n" + "\n".join(long)


def _function(lines: int, head: str = "def f() -> None:\n", indent: str = "") -> str:
    """A function of exactly ``lines`` lines, ``head`` included."""
    body_lines = lines - head.count("\n")
    return (
        "".join(indent + line + "\n" for line in head.splitlines())
        + (indent + "    x = 1\n") * body_lines
    )


def test_the_counter_counts_def_to_last_body_line() -> None:
    """Guard against a counter that never finds anything: 81 lines fail, 80 pass."""
    assert _long_functions(_function(80), "m.py") == []
    assert _long_functions(_function(81), "m.py") == ["m.py:1 f (81 lines)"]
    assert _long_functions("@decorator\n" + _function(80), "m.py") == []  # not counted
    signature = "async def g(\n    a: int,\n) -> None:\n"
    assert _long_functions(_function(81, signature), "m.py") == ["m.py:1 g (81 lines)"]
    method = "class C:\n" + _function(81, "def h(self) -> None:\n", indent="    ")
    assert _long_functions(method, "m.py") == ["m.py:2 h (81 lines)"]
