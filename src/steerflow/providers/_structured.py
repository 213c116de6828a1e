"""Structured output on the wire: the schema a vendor is sent, and what comes back.

Both SDK vendors want an object at the root of a structured reply (OpenAI's
``response_format.json_schema``, Anthropic's forced tool ``input_schema``). A schema
whose root is not an object is sent wrapped as ``{"value": SCHEMA}`` and the reply
unwrapped, its ``$defs`` kept at the root so ``$ref``s still resolve (decision 286).
OpenAI's strict mode is asked for only when the schema qualifies: every object closed
(``additionalProperties: false``) and every property required; otherwise non-strict.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["WireSchema", "wire_schema"]

_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_DEFS = ("$defs", "definitions")


class WireSchema:
    """A node's ``output_schema`` as one vendor request carries it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            inner = {k: v for k, v in schema.items() if k not in _DEFS}
            wire: dict[str, Any] = {
                "type": "object",
                "properties": {"value": inner},
                "required": ["value"],
                "additionalProperties": False,
            }
            wire.update({k: schema[k] for k in _DEFS if k in schema})
        else:
            wire = dict(schema)
        #: The object-rooted schema sent.
        self.schema = wire
        title = schema.get("title")
        name = _NAME.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
        #: A name the vendors accept (``^[A-Za-z0-9_-]{1,64}$``): the title's, else ``output``.
        self.name = name or "output"
        #: Whether OpenAI's strict mode can take it.
        self.strict = _strict_ok(wire)

    def unwrap(self, value: object) -> object:
        """The reply's value as the node's schema describes it."""
        if self.wrapped and isinstance(value, dict) and set(value) == {"value"}:
            return value["value"]
        return value


def wire_schema(schema: dict[str, Any]) -> WireSchema:
    """The wire form of ``schema`` (see the module docstring)."""
    return WireSchema(schema)


def _strict_ok(node: object) -> bool:
    """OpenAI strict mode's rules: closed objects whose properties are all required."""
    if isinstance(node, list):
        return all(_strict_ok(item) for item in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object" or "properties" in node:
        props = node.get("properties") or {}
        if node.get("additionalProperties") is not False:
            return False
        if set(node.get("required") or ()) != set(props):
            return False
    return all(_strict_ok(value) for key, value in node.items() if key != "enum")
