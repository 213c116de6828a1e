"""``python:`` tools (tools._python, tools._specs, tools._build): the schema the model sees
comes from the function; arguments are checked first; every failure is the tool's error
output, never the node's (issue 39 items 1 and 5)."""

from __future__ import annotations

import threading

import pytest

import tool_fns
from steerflow.errors import PlanValidationError, UsageError
from steerflow.tools import ToolOptions
from steerflow.tools._build import build_toolset
from steerflow.tools._python import load_python_tool, python_tool
from steerflow.tools._specs import McpSource, PythonSource, parse_tool_spec


def search(query: str, limit: int = 5, *, exact: bool = False) -> list[str]:
    """Search the notes.

    Longer text the model does not need.

    Args:
        query: What to look for.
        limit: At most this many hits,
            counted after de-duplication.
        exact: Match the whole phrase.
    """
    return [f"{query}:{i}" for i in range(limit)] if not exact else [query]


def where_am_i() -> str:
    """The thread this ran on."""
    return threading.current_thread().name


async def async_add(a: int, b: int) -> int:
    """Add, asynchronously."""
    return a + b


def blocks(seconds: float) -> str:
    """Block the thread it runs on (an Event nobody sets) for ``seconds``."""
    threading.Event().wait(seconds)
    return "woke"


def broken() -> str:
    """Always raises."""
    raise KeyError("missing")


def test_the_schema_comes_from_signature_hints_and_docstring() -> None:
    tool = python_tool(search)
    assert tool.spec.name == "search" and tool.spec.description == "Search the notes."
    params = tool.spec.parameters
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "What to look for."}
    assert params["properties"]["limit"]["default"] == 5
    assert params["properties"]["limit"]["description"] == (
        "At most this many hits, counted after de-duplication."
    )
    assert params["properties"]["exact"]["type"] == "boolean"
    assert params.get("additionalProperties") is False


async def test_arguments_are_checked_and_a_bad_one_is_the_tools_error() -> None:
    tool = python_tool(search)
    ok = await tool.call({"query": "x", "limit": 2})
    assert (ok.content, ok.is_error) == ('["x:0","x:1"]', False)
    bad = await tool.call({"query": "x", "limit": "many"})
    assert bad.is_error and "limit" in bad.content and "search" in bad.content
    missing = await tool.call({})
    assert missing.is_error and "query" in missing.content
    extra = await tool.call({"query": "x", "nope": 1})
    assert extra.is_error and "nope" in extra.content


async def test_a_plain_function_runs_off_the_loop_and_an_async_one_on_it() -> None:
    ran_on = await python_tool(where_am_i).call({})
    assert ran_on.content != threading.current_thread().name
    assert (await python_tool(async_add).call({"a": 2, "b": 3})).content == "5"


async def test_a_timeout_and_an_exception_are_error_outputs() -> None:
    slow = python_tool(blocks, timeout_s=0.05)
    out = await slow.call({"seconds": 5})
    assert (out.content, out.is_error) == ("timed out after 0.05 s", True)
    failed = await python_tool(broken).call({})
    assert failed.is_error and failed.content == "KeyError: 'missing'"


def test_specs_are_parsed_and_a_malformed_one_names_the_forms() -> None:
    assert parse_tool_spec("python:pkg.mod:Cls.fn") == PythonSource(
        "python:pkg.mod:Cls.fn", "pkg.mod", "Cls.fn"
    )
    assert parse_tool_spec("mcp:files/read") == McpSource("mcp:files/read", "files", "read")
    for bad in ("shell:ls", "python:mod", "python:1mod:f", "mcp:a/b/c", "mcp:"):
        with pytest.raises(PlanValidationError, match="python:MODULE:FUNCTION, mcp:SERVER"):
            parse_tool_spec(bad)


def test_a_spec_that_cannot_be_loaded_is_refused_naming_it() -> None:
    with pytest.raises(PlanValidationError, match="has no function 'nope'"):
        load_python_tool("tool_fns", "nope")
    with pytest.raises(PlanValidationError, match="cannot import module 'no_such_mod'"):
        load_python_tool("no_such_mod", "f")
    with pytest.raises(UsageError, match=r"\*args or \*\*kwargs"):
        python_tool(lambda *a: a)


async def test_a_toolset_applies_options_and_refuses_two_tools_of_one_name() -> None:
    options = {"post": ToolOptions(idempotent=True, timeout_s=3)}
    toolset = await build_toolset(["python:tool_fns:post"], callables=[tool_fns.add],
                                  options=options)  # fmt: skip
    post = toolset.tools["post"]
    assert (post.idempotent, post.timeout_s, post.source) == (True, 3, "python:tool_fns:post")
    assert toolset.tools["add"].source == "python:tool_fns:add"
    unknown = await toolset.call("nope", {})
    assert unknown.is_error and "the tools are: add, post" in unknown.content
    with pytest.raises(PlanValidationError, match="two tools are named 'add'"):
        await build_toolset(["python:tool_fns:add"], callables=[tool_fns.add])
