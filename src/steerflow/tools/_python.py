"""Python functions as tools: ``python:MODULE:FUNCTION`` specs and callables from code.

What the model sees comes from the function itself: its name, the first paragraph of its
docstring, and a JSON Schema of its parameters built by pydantic from the signature and
type hints (a Google-style ``Args:`` section gives each parameter's description). The
model's arguments are validated by the same pydantic model before the call, so a wrong
type or a missing argument comes back to the model as an error output naming it, and the
function is only ever called with what its hints promise (decision 260).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import pydantic
import pydantic_core

from steerflow.errors import PlanValidationError, UsageError
from steerflow.plan._tool_ref import importable_spec
from steerflow.providers._base import ToolSpec
from steerflow.providers.function import import_callable, in_daemon_thread
from steerflow.tools._toolset import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolOutput

__all__ = ["PythonTool", "importable_spec", "load_python_tool", "python_tool"]

_SECTION = re.compile(r"(Args|Arguments|Parameters)\s*:\s*")
_ENTRY = re.compile(r"\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)")


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and the ``Args:`` descriptions by parameter."""
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.fullmatch(line.strip()):
            break
        first.append(line.strip())
    return " ".join(first), _args_section(lines)


def _args_section(lines: list[str]) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Args:`` section (continuations joined)."""
    found: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if _SECTION.fullmatch(line.strip())), None)
    if start is None:
        return found
    base = len(lines[start]) - len(lines[start].lstrip())
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent <= base:
            break  # the next section
        if not line.strip():
            continue
        entry_indent = indent if entry_indent is None else entry_indent
        match = _ENTRY.fullmatch(line.strip()) if indent == entry_indent else None
        if match is not None:
            current = match.group(1)
            found[current] = match.group(3).strip()
        elif current is not None:
            found[current] = f"{found[current]} {line.strip()}".strip()
    return found


def _arguments_model(
    fn: Callable[..., Any], name: str, docs: Mapping[str, str]
) -> tuple[type[pydantic.BaseModel], list[inspect.Parameter]]:
    """A pydantic model of ``fn``'s parameters, and the parameters in call order.

    Fields are named ``p0, p1, ...`` with the parameter's name as alias: a parameter
    called ``json`` or ``_private`` must not collide with pydantic's own names.
    """
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, ValueError) as exc:
        raise UsageError(f"tool {name!r}: cannot read its signature ({exc})") from None
    fields: dict[str, Any] = {}
    params = list(signature.parameters.values())
    for at, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UsageError(
                f"tool {name!r}: parameter {param.name!r} is *args or **kwargs; a tool's "
                "arguments must each be named, so the model can be told about them"
            )
        hint = Any if param.annotation is param.empty else param.annotation
        default = ... if param.default is param.empty else param.default
        field = pydantic.Field(default, alias=param.name, description=docs.get(param.name))
        fields[f"p{at}"] = (hint, field)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    try:
        model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
        raise UsageError(f"tool {name!r}: its type hints give no schema ({exc})") from None
    return model, params


def _schema(model: type[pydantic.BaseModel], name: str) -> dict[str, Any]:
    """The model's JSON Schema without pydantic's generated titles (noise to a model)."""
    try:
        schema = model.model_json_schema()
    except pydantic.PydanticInvalidForJsonSchema as exc:
        raise UsageError(f"tool {name!r}: a parameter's type has no JSON Schema ({exc})") from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return schema


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _invalid(name: str, exc: pydantic.ValidationError) -> str:
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or '(arguments)'}: {error['msg']}"
        for error in exc.errors()
    ]
    return f"invalid arguments for tool {name!r}: " + "; ".join(problems)


def _text(value: Any) -> str:
    """A str as it is; anything else as JSON (what pydantic cannot encode, by ``str``)."""
    if isinstance(value, str):
        return value
    return pydantic_core.to_json(value, fallback=str).decode()


class PythonTool(Tool):
    """A Python function (plain or ``async``) called with validated arguments."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        source: str,
        idempotent: bool = False,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        name = str(getattr(fn, "__name__", type(fn).__name__))
        description, docs = _docstring(fn)
        self._model, self._params = _arguments_model(fn, name, docs)
        self.spec = ToolSpec(name, description, _schema(self._model, name))
        self.fn, self.source = fn, source
        self.idempotent, self.timeout_s = idempotent, timeout_s
        # an instance with ``async def __call__`` is awaited too
        call = fn.__call__ if not inspect.isroutine(fn) else None  # type: ignore[operator]
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)

    async def call(self, args: Mapping[str, Any]) -> ToolOutput:
        """Validate, call under ``timeout_s``; every failure is an error output."""
        try:
            bound = self._model.model_validate(dict(args))
        except pydantic.ValidationError as exc:
            return ToolOutput(_invalid(self.spec.name, exc), is_error=True)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for at, param in enumerate(self._params):
            value = getattr(bound, f"p{at}")
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(value)
            else:
                keywords[param.name] = value
        timeout = asyncio.timeout(self.timeout_s)
        try:
            async with timeout:
                if self._is_async:
                    value = await self.fn(*positional, **keywords)
                else:
                    # a daemon pool thread, as function nodes' (decision 241): a tool that timed
                    # out and still blocks never holds the process's exit
                    value = await in_daemon_thread(
                        functools.partial(self.fn, *positional, **keywords)
                    )
            return ToolOutput(_text(value))
        except (Exception, SystemExit) as exc:
            if timeout.expired():
                return ToolOutput(f"timed out after {self.timeout_s:g} s", is_error=True)
            return ToolOutput(_describe(exc), is_error=True)


def _callable_source(fn: Callable[..., Any]) -> str:
    try:
        return importable_spec(fn)
    except UsageError:
        module = getattr(fn, "__module__", None) or "?"
        return f"callable:{module}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def python_tool(
    fn: Callable[..., Any],
    *,
    source: str | None = None,
    idempotent: bool = False,
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
) -> Tool:
    """A tool calling ``fn``; its signature, hints and docstring are what the model sees.

    ``source`` defaults to ``python:MODULE:QUALNAME`` when ``fn`` can be imported back
    by that name, else ``callable:MODULE:QUALNAME``.

    Raises:
        UsageError: ``fn`` takes ``*args``/``**kwargs``, or its hints give no schema.
    """
    return PythonTool(
        fn,
        source=source if source is not None else _callable_source(fn),
        idempotent=idempotent,
        timeout_s=timeout_s,
    )


def load_python_tool(
    module: str,
    function: str,
    *,
    idempotent: bool = False,
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
) -> Tool:
    """The tool of ``python:MODULE:FUNCTION`` (``FUNCTION`` may be dotted).

    Raises:
        PlanValidationError: the module cannot be imported (or raised while importing),
            it has no such function, it is not callable, or it cannot be a tool; one line
            naming the spec.
    """
    spec = f"python:{module}:{function}"
    try:
        # the same import, with the same errors, as a function node's (decision 240)
        target = import_callable(spec, "tool spec")
    except UsageError as exc:
        raise PlanValidationError(str(exc)) from None
    try:
        return python_tool(target, source=spec, idempotent=idempotent, timeout_s=timeout_s)
    except UsageError as exc:
        raise PlanValidationError(f"tool spec {spec!r}: {exc}") from None
