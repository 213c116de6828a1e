"""The wire form of an ``output_schema`` (decision 283): object roots, names, strict mode."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from steerflow.executor._output import decode, output_json
from steerflow.plan._schema import output_schema_of, schema_problem
from steerflow.providers import ProviderResponse
from steerflow.providers._structured import wire_schema


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class Basket(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item]


def test_an_object_schema_is_sent_as_is_and_a_closed_one_is_strict() -> None:
    schema = Basket.model_json_schema()
    wire = wire_schema(schema)
    assert not wire.wrapped and wire.schema == schema and wire.name == "Basket"
    assert wire.strict  # closed objects, every property required, $defs included
    assert wire.unwrap({"items": []}) == {"items": []}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}},  # open
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        },  # b optional
        {
            "type": "object",
            "properties": {"inner": {"type": "object", "properties": {}}},
            "required": ["inner"],
            "additionalProperties": False,
        },  # a nested open object
    ],
)
def test_a_schema_strict_mode_would_refuse_is_sent_non_strict(schema: dict[str, Any]) -> None:
    assert not wire_schema(schema).strict


def test_a_non_object_root_is_wrapped_with_its_defs_kept_at_the_root() -> None:
    schema = {
        "title": "my list!",
        "type": "array",
        "items": {"$ref": "#/$defs/Item"},
        "$defs": {"Item": Item.model_json_schema()},
    }
    wire = wire_schema(schema)
    assert wire.wrapped and wire.name == "my_list"
    assert wire.schema["properties"]["value"] == {
        "title": "my list!",
        "type": "array",
        "items": {"$ref": "#/$defs/Item"},
    }
    assert wire.schema["$defs"] == schema["$defs"] and wire.schema["required"] == ["value"]
    assert wire.unwrap({"value": [{"name": "x"}]}) == [{"name": "x"}]
    assert wire.unwrap([{"name": "x"}]) == [{"name": "x"}]  # a server that did not wrap


def test_replies_decode_from_text_a_fence_or_the_providers_value() -> None:
    assert decode(ProviderResponse(text=' {"a": 1} ')) == ({"a": 1}, None)
    assert decode(ProviderResponse(text='```json\n{"a": 1}\n```')) == ({"a": 1}, None)
    assert decode(ProviderResponse(text="ignored", output=[1])) == ([1], None)
    value, problem = decode(ProviderResponse(text="NaN"))
    assert value is None and problem is not None and "not JSON" in problem
    value, problem = decode(ProviderResponse(text="Here you go: {}"))
    assert problem is not None and "'Here you go: {}'" in problem
    assert output_json({"é": [1, 2]}) == '{"é":[1,2]}'


def test_schemas_are_checked_in_their_own_dialect() -> None:
    assert schema_problem({"type": "object"}) is None
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    assert schema_problem(draft7) is None
    problem = schema_problem({"type": "object", "properties": {"a": {"minimum": "zero"}}})
    assert problem is not None and "'properties/a/minimum'" in problem
    assert output_schema_of({"type": "string"}) == {"type": "string"}
    with pytest.raises(TypeError, match="Basket is not a JSON Schema mapping"):
        output_schema_of(Basket(items=[]))
