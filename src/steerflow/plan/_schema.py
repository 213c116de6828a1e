"""Typed outputs' schemas (issue 40 item 2): checked as JSON Schema, made from a class.

A plan file's ``output_schema`` is a JSON Schema; an ``Op``'s may also be a pydantic
model class, a dataclass or a TypedDict, kept on the op and turned into its JSON Schema
here (``pydantic.TypeAdapter``), so the plan, the checkpoint and a resume only ever see
the schema (decision 282). ``jsonschema`` is imported only when a schema is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["output_schema_of", "schema_problem"]


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (its own ``$schema`` dialect, else 2020-12).

    Returns:
        None when it is valid; else the checker's message, cut at 300 characters.
    """
    import jsonschema
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        at = f" at {where!r}" if where else ""
        return f"not a valid JSON Schema{at}: {exc.message}"[:300]
    return None


def output_schema_of(value: object) -> dict[str, Any]:
    """The JSON Schema ``Op(output_schema=value)`` stands for.

    Args:
        value: A JSON Schema mapping, a pydantic model class, a dataclass or a TypedDict.

    Raises:
        TypeError: ``value`` is none of those (the caller names the parameter).
    """
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, type):
        from pydantic import BaseModel, PydanticUserError, TypeAdapter
        from typing_extensions import is_typeddict  # knows typing's and its own

        if issubclass(value, BaseModel):
            return value.model_json_schema()
        if dataclasses.is_dataclass(value) or is_typeddict(value):
            try:
                schema: dict[str, Any] = TypeAdapter(value).json_schema()
            except PydanticUserError as exc:  # typing.TypedDict before Python 3.12
                raise TypeError(f"{value.__name__}: {str(exc).splitlines()[0]}") from None
            return schema
    shown = value.__name__ if isinstance(value, type) else type(value).__name__
    raise TypeError(
        f"{shown} is not a JSON Schema mapping, a pydantic model class, a dataclass or a TypedDict"
    )
