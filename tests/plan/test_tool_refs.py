"""``Op(tools=[fn])``: a function is kept as the spec a resume in another process imports;
one that cannot be imported again is refused when the plan is built (issue 39 item 1)."""

from __future__ import annotations

import pytest

import tool_fns
from steerflow import Op, Plan
from steerflow.errors import InvalidValueError
from steerflow.plan._tool_ref import importable_spec


def test_a_module_level_function_becomes_its_importable_spec() -> None:
    op = Op("a", "do it", tools=[tool_fns.post, "mcp:files/read"], max_steps=7)
    assert op.tools == ("python:tool_fns:post", "mcp:files/read")
    plan = Plan([op], tools=[tool_fns.lookup], tool_options={"post": {"idempotent": False}})
    entry = plan.plan_file.plan[0]
    assert plan.plan_file.tools_of(entry) == [
        "python:tool_fns:lookup", "python:tool_fns:post", "mcp:files/read",
    ]  # fmt: skip
    assert entry.max_steps == 7
    # The YAML form reads back to the same plan.
    again = Plan.from_plan_file(plan.plan_file)
    assert again.ops[0].tools == op.tools and again.tool_options["post"] == {"idempotent": False}


def test_a_lambda_is_refused_saying_how_to_fix_it() -> None:
    with pytest.raises(InvalidValueError, match=r"lambda.*top level of a module"):
        Op("a", "do it", tools=[lambda x: x])


def test_a_closure_is_refused() -> None:
    def inner(x: int) -> int:
        return x

    with pytest.raises(InvalidValueError, match="inside another function") as refused:
        Op("a", "do it", tools=[inner])
    assert "Op.tools[0]" in str(refused.value)


def test_a_main_function_is_refused() -> None:
    def fn() -> None:
        return None

    fn.__module__ = "__main__"
    fn.__qualname__ = "fn"
    with pytest.raises(InvalidValueError, match="__main__"):
        importable_spec(fn)


def test_a_function_whose_name_leads_elsewhere_is_refused() -> None:
    def add(a: int, b: int) -> int:
        return a - b

    add.__module__ = "tool_fns"
    add.__qualname__ = "add"
    with pytest.raises(InvalidValueError, match="another object"):
        importable_spec(add)


def test_something_not_callable_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="neither a tool spec nor a function"):
        Op("a", "do it", tools=[3])  # type: ignore[list-item]
