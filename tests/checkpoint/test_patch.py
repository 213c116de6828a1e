"""Unit tests for the strict JSON Patch subset (``steerflow.checkpoint._patch``)."""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from steerflow.checkpoint._patch import (
    PatchError,
    apply_patch,
    encode_pointer,
    parse_pointer,
    validate_patch,
)

# --------------------------------------------------------------------------- pointers


@pytest.mark.parametrize(
    ("pointer", "tokens"),
    [
        ("", []),
        ("/", [""]),
        ("//", ["", ""]),
        ("/a", ["a"]),
        ("/a/b", ["a", "b"]),
        ("/a~1b", ["a/b"]),
        ("/m~0n", ["m~n"]),
        ("/~01", ["~1"]),  # decoded once: not "/"
        ("/~10", ["/0"]),
        ("/~0~1", ["~/"]),
        ("/-", ["-"]),
        ("/00", ["00"]),  # a valid token; only array addressing rejects it
        ("/ ", [" "]),
        ("/é/\u2603", ["é", "\u2603"]),
    ],
)
def test_parse_pointer(pointer: str, tokens: list[str]) -> None:
    assert parse_pointer(pointer) == tokens
    assert encode_pointer(tokens) == pointer


@pytest.mark.parametrize("pointer", ["a", "a/b", "~0", "/~", "/a~", "/~2", "/~a", "/~~1", "/a/~/b"])
def test_parse_pointer_refuses(pointer: str) -> None:
    with pytest.raises(PatchError) as info:
        parse_pointer(pointer)
    assert repr(pointer) in str(info.value)


def test_parse_pointer_refuses_non_string() -> None:
    with pytest.raises(PatchError, match="pointer must be a string, not NoneType"):
        parse_pointer(None)  # type: ignore[arg-type]


def test_encode_pointer_round_trips_awkward_keys() -> None:
    for tokens in (["~1"], ["/"], ["~"], ["", "-", "~0~1/"], ["a/b", "c~d"]):
        assert parse_pointer(encode_pointer(tokens)) == tokens
    assert encode_pointer(["~1"]) == "/~01"
    with pytest.raises(PatchError, match="pointer token must be a string, not int"):
        encode_pointer([1])  # type: ignore[list-item]


# --------------------------------------------------------------------------- validate_patch


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"op": "add"}, "patch must be an array"),
        ("[]", "patch must be an array"),
        ([1], "op 0: operation must be an object"),
        ([{"op": "move", "from": "/a", "path": "/b"}], "'move' is not allowed"),
        ([{"op": "copy", "from": "/a", "path": "/b"}], "'copy' is not allowed"),
        ([{"op": "test", "path": "/a", "value": 1}], "'test' is not allowed"),
        ([{"op": "spam", "path": "/a", "value": 1}], "'spam' is not allowed"),
        ([{"op": "ADD", "path": "/a", "value": 1}], "'ADD' is not allowed"),
        ([{"path": "/a", "value": 1}], "None is not allowed"),
        ([{"op": "add", "path": "/a", "value": 1, "x": 1}], "unexpected member(s) 'x'"),
        ([{"op": "remove", "path": "/a", "value": 1}], "unexpected member(s) 'value'"),
        ([{"op": "add", "path": "/a"}], "missing member(s) 'value'"),
        ([{"op": "replace", "path": "/a"}], "missing member(s) 'value'"),
        ([{"op": "add", "value": 1}], "missing member(s) 'path'"),
        ([{"op": "add", "path": None, "value": 1}], "path must be a string"),
        ([{"op": "add", "path": "a", "value": 1}], "must be empty or start with '/'"),
        ([{"op": "add", "path": "/~2", "value": 1}], "'~' that is not"),
        ([{"op": "add", "path": "/a", "value": float("nan")}], "non-finite"),
        ([{"op": "add", "path": "/a", "value": [float("inf")]}], "non-finite"),
        ([{"op": "add", "path": "/a", "value": {1: 2}}], "key 1 is not a string"),
        ([{"op": "add", "path": "/a", "value": {"s": {1, 2}}}], "type set"),
        ([{"op": "add", "path": "/a", "value": b"x"}], "type bytes"),
    ],
)
def test_validate_patch_refuses(patch: object, fragment: str) -> None:
    with pytest.raises(PatchError) as info:
        validate_patch(patch)
    assert fragment in str(info.value)


def test_error_names_index_and_pointer() -> None:
    patch = [
        {"op": "add", "path": "/ok", "value": 1},
        {"op": "add", "path": "/x~1y", "value": 1, "extra": True},
    ]
    with pytest.raises(PatchError) as info:
        validate_patch(patch)
    err = info.value
    assert err.index == 1
    assert err.pointer == "/x~1y"
    assert str(err).startswith("op 1, path '/x~1y': ")


def test_validate_patch_returns_clean_copies() -> None:
    value = {"k": [1, 2.5, None, True, "s"]}
    patch = [{"op": "add", "path": "/a", "value": value}, {"op": "remove", "path": "/b"}]
    out = validate_patch(patch)
    assert out == patch
    assert out[0] is not patch[0]
    assert out[0]["value"] is value
    assert validate_patch(()) == []


def test_validate_patch_accepts_tuples_and_frozen_like_dicts() -> None:
    class D(dict[str, Any]):
        pass

    value = (1, D(x=(2,)))
    out = validate_patch([{"op": "add", "path": "/a", "value": value}])
    # Values are checked, not copied: the immutable capture's tuples and mappings pass as-is.
    assert out == [{"op": "add", "path": "/a", "value": (1, {"x": (2,)})}]
    assert out[0]["value"] is value


# --------------------------------------------------------------------------- apply_patch


def _apply(doc: Any, patch: list[dict[str, Any]]) -> Any:
    before = copy.deepcopy(doc)
    try:
        return apply_patch(doc, patch)
    finally:
        assert doc == before and json.dumps(doc) == json.dumps(before), "input mutated"


def test_add_object_member_and_nested_array_append() -> None:
    doc = {"nested": {"entries": ["a"]}, "other": {"big": list(range(5))}}
    out = _apply(doc, [{"op": "add", "path": "/nested/entries/-", "value": "x"}])
    assert out == {"nested": {"entries": ["a", "x"]}, "other": {"big": [0, 1, 2, 3, 4]}}
    assert out["other"] is doc["other"], "untouched subtree must be shared, not copied"
    assert out["nested"] is not doc["nested"]


def test_add_never_replaces_existing_member() -> None:
    values: tuple[object, ...] = (None, 1, {})
    for value in values:
        with pytest.raises(PatchError, match="add would replace existing member 'a'"):
            _apply({"a": value}, [{"op": "add", "path": "/a", "value": 2}])


def test_dash_is_an_object_key_inside_objects() -> None:
    assert _apply({}, [{"op": "add", "path": "/-", "value": 1}]) == {"-": 1}
    assert _apply({"-": 1}, [{"op": "replace", "path": "/-", "value": 2}]) == {"-": 2}
    assert _apply({"-": 1}, [{"op": "remove", "path": "/-"}]) == {}
    assert _apply({"-": {"a": 1}}, [{"op": "remove", "path": "/-/a"}]) == {"-": {}}


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        (
            [{"op": "replace", "path": "/a/-", "value": 1}],
            "only valid as the final token of an add",
        ),
        ([{"op": "remove", "path": "/a/-"}], "only valid as the final token of an add"),
        ([{"op": "add", "path": "/a/-/x", "value": 1}], "'-' is not a canonical"),
    ],
)
def test_dash_in_arrays_only_appends(patch: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(PatchError) as info:
        _apply({"a": [{"x": 0}]}, patch)
    assert fragment in str(info.value)


def test_array_insert_bounds() -> None:
    doc = {"a": [1, 2]}
    assert _apply(doc, [{"op": "add", "path": "/a/0", "value": 0}]) == {"a": [0, 1, 2]}
    assert _apply(doc, [{"op": "add", "path": "/a/2", "value": 3}]) == {"a": [1, 2, 3]}
    assert _apply(doc, [{"op": "add", "path": "/a/-", "value": 3}]) == {"a": [1, 2, 3]}
    with pytest.raises(PatchError, match="out of range"):
        _apply(doc, [{"op": "add", "path": "/a/3", "value": 3}])
    with pytest.raises(PatchError, match="out of range"):
        _apply(doc, [{"op": "remove", "path": "/a/2"}])
    with pytest.raises(PatchError, match="out of range"):
        _apply({"a": []}, [{"op": "replace", "path": "/a/0", "value": 1}])


@pytest.mark.parametrize(
    "token", ["01", "00", "-1", "+1", " 1", "1 ", "1e0", "0x1", "١", "1.0", ""]
)
def test_non_canonical_indices_refused(token: str) -> None:
    doc = {"a": [[1], [2]]}
    for patch in (
        [{"op": "add", "path": f"/a/{token}", "value": 9}],
        [{"op": "remove", "path": f"/a/{token}"}],
        [{"op": "replace", "path": f"/a/{token}", "value": 9}],
        [{"op": "add", "path": f"/a/{token}/0", "value": 9}],
    ):
        with pytest.raises(PatchError, match="canonical"):
            _apply(doc, patch)


def test_numeric_tokens_are_keys_in_objects() -> None:
    assert _apply({}, [{"op": "add", "path": "/01", "value": 1}]) == {"01": 1}


def test_keys_with_slash_tilde_and_empty() -> None:
    doc: dict[str, Any] = {"": {"": 1}, "a/b": 2, "m~n": 3, "~1": 4}
    patch: list[dict[str, Any]] = [
        {"op": "replace", "path": "//", "value": 10},
        {"op": "replace", "path": "/a~1b", "value": 20},
        {"op": "remove", "path": "/m~0n"},
        {"op": "replace", "path": "/~01", "value": 40},
        {"op": "add", "path": "/~1", "value": 50},
    ]
    assert _apply(doc, patch) == {"": {"": 10}, "a/b": 20, "~1": 40, "/": 50}


def test_intermediate_paths_must_exist_with_the_right_type() -> None:
    doc: dict[str, Any] = {"s": "str", "n": None, "o": {}, "l": []}
    for path, reason in (
        ("/missing/x", "member 'missing' at depth 0 does not exist"),
        ("/s/x", "token 's' at depth 0 names a str, not an object or array"),
        ("/n/x", "token 'n' at depth 0 names a NoneType, not an object or array"),
        ("/o/missing/x", "member 'missing' at depth 1 does not exist"),
        ("/l/0/x", "array index 0 is out of range for an array of length 0"),
    ):
        with pytest.raises(PatchError, match=re.escape(f"op 0, path {path!r}: {reason}")):
            _apply(doc, [{"op": "add", "path": path, "value": 1}])


def test_remove_and_replace_need_an_existing_target() -> None:
    for op in ({"op": "remove", "path": "/x"}, {"op": "replace", "path": "/x", "value": 1}):
        with pytest.raises(PatchError, match="does not exist"):
            _apply({"a": 1}, [op])


def test_root_rules() -> None:
    doc = {"a": 1}
    assert _apply(doc, [{"op": "replace", "path": "", "value": {}}]) == {}
    assert _apply(doc, [{"op": "replace", "path": "", "value": {"b": [1]}}]) == {"b": [1]}
    values: tuple[object, ...] = ([], "x", None, 1)
    for value in values:
        with pytest.raises(PatchError, match="only be replaced by an object"):
            _apply(doc, [{"op": "replace", "path": "", "value": value}])
    with pytest.raises(PatchError, match="root add is not allowed"):
        _apply(doc, [{"op": "add", "path": "", "value": {}}])
    with pytest.raises(PatchError, match="root remove is not allowed"):
        _apply(doc, [{"op": "remove", "path": ""}])


def test_sequential_ops_see_earlier_ones() -> None:
    doc: dict[str, Any] = {"l": [1, 2, 3]}
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/o", "value": {}},
        {"op": "add", "path": "/o/k", "value": [1]},
        {"op": "add", "path": "/o/k/-", "value": 2},
        {"op": "remove", "path": "/l/0"},
        {"op": "remove", "path": "/l/0"},
        {"op": "replace", "path": "/l/0", "value": "x"},
        {"op": "add", "path": "/l/0", "value": "y"},
    ]
    assert _apply(doc, patch) == {"l": ["y", "x"], "o": {"k": [1, 2]}}


def test_replace_root_then_continue() -> None:
    patch: list[dict[str, Any]] = [
        {"op": "replace", "path": "", "value": {"a": []}},
        {"op": "add", "path": "/a/-", "value": 1},
    ]
    assert _apply({"z": 0}, patch) == {"a": [1]}


def test_malformed_late_operation_applies_nothing() -> None:
    doc = {"a": {"b": [1]}, "c": 1}
    snapshot = json.dumps(doc)
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/a/b/-", "value": 2},
        {"op": "remove", "path": "/c"},
        {"op": "add", "path": "/a/b/9", "value": 3},
    ]
    with pytest.raises(PatchError) as info:
        apply_patch(doc, patch)
    assert info.value.index == 2 and info.value.pointer == "/a/b/9"
    assert json.dumps(doc) == snapshot
    # A shape error late in the patch is found before anything applies.
    patch[2] = {"op": "test", "path": "/c", "value": 1}
    with pytest.raises(PatchError, match="op 2"):
        apply_patch(doc, patch)
    assert json.dumps(doc) == snapshot


def test_values_are_copied_into_plain_containers() -> None:
    value: dict[str, Any] = {"k": (1, [2])}
    out = _apply({}, [{"op": "add", "path": "/v", "value": value}])
    assert out == {"v": {"k": [1, [2]]}}
    assert out["v"] is not value and out["v"]["k"][1] is not value["k"][1]
    value["k"][1].append(3)
    assert out["v"]["k"][1] == [2]


def test_touching_a_path_twice_copies_it_once() -> None:
    inner: list[int] = []
    doc = {"a": {"b": inner}}
    out = _apply(doc, [{"op": "add", "path": "/a/b/-", "value": i} for i in range(3)])
    assert out == {"a": {"b": [0, 1, 2]}}
    assert inner == []


def test_empty_patch_returns_the_document() -> None:
    doc = {"a": 1}
    assert apply_patch(doc, []) is doc


def test_array_root_documents_work() -> None:
    assert _apply([1], [{"op": "add", "path": "/-", "value": 2}]) == [1, 2]
    with pytest.raises(PatchError, match="not a container"):
        _apply("scalar", [{"op": "add", "path": "/a", "value": 1}])


# --------------------------------------------------------------------------- exact refusals
# The message, index and pointer are what an operator reads when a journal record is refused,
# so they are pinned whole, not by fragment.


@pytest.fixture
def deep_stack() -> Iterator[None]:
    # The nesting check itself recurses; leave room for 900 levels plus the test runner's frames
    # (and mutation-testing trampolines), so only the 900-level rule decides.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))
    yield
    sys.setrecursionlimit(old)


def _nest_lists(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


def _nest_objects(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = {"k": value}
    return value


def _nest_tuples(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = (value,)
    return value


@pytest.mark.usefixtures("deep_stack")
@pytest.mark.parametrize("nest", [_nest_lists, _nest_objects, _nest_tuples])
def test_nesting_limit_is_900_levels(nest: Any) -> None:
    ok = [{"op": "add", "path": "/a", "value": nest(900)}]
    assert validate_patch(ok)[0]["value"] is ok[0]["value"]
    too_deep = [
        {"op": "add", "path": "/ok", "value": 1},
        {"op": "add", "path": "/a", "value": nest(901)},
    ]
    with pytest.raises(PatchError) as info:
        validate_patch(too_deep)
    assert str(info.value) == "op 1, path '/a': value nests too deeply"
    assert (info.value.index, info.value.pointer, info.value.reason) == (
        1,
        "/a",
        "value nests too deeply",
    )


@pytest.mark.parametrize(
    ("patch", "index", "pointer", "message"),
    [
        ({"op": "add"}, None, None, "patch must be an array, not dict"),
        (
            [{"op": "add", "path": "/a", "value": 1}, 1],
            1,
            None,
            "op 1: operation must be an object, not int",
        ),
        (
            [{"op": "move", "from": "/a", "path": "/b"}],
            0,
            "/b",
            "op 0, path '/b': operation 'move' is not allowed",
        ),
        (
            [{"op": "add", "path": "/a", "value": 1, "y": 1, "x": 1}],
            0,
            "/a",
            "op 0, path '/a': add operation unexpected member(s) 'x', 'y'",
        ),
        (
            [{"op": "add", "path": "/a", "x": 1}],
            0,
            "/a",
            "op 0, path '/a': add operation unexpected member(s) 'x'; missing member(s) 'value'",
        ),
        ([{"op": "add"}], 0, None, "op 0: add operation missing member(s) 'path', 'value'"),
        ([{"op": "add", "path": 5, "value": 1}], 0, None, "op 0: path must be a string, not int"),
        (
            [{"op": "remove", "path": "a"}],
            0,
            "a",
            "op 0, path 'a': pointer must be empty or start with '/'",
        ),
        (
            [{"op": "remove", "path": "/~2"}],
            0,
            "/~2",
            "op 0, path '/~2': pointer has a '~' that is not '~0' or '~1'",
        ),
        (
            [{"op": "remove", "path": "/a"}, {"op": "add", "path": "/a", "value": [float("nan")]}],
            1,
            "/a",
            "op 1, path '/a': value contains a non-finite number (nan)",
        ),
        (
            [{"op": "add", "path": "/a", "value": {"s": {1}}}],
            0,
            "/a",
            "op 0, path '/a': value of type set is not normalized JSON",
        ),
    ],
)
def test_validate_patch_refusal_is_exact(
    patch: object, index: int | None, pointer: str | None, message: str
) -> None:
    with pytest.raises(PatchError) as info:
        validate_patch(patch)
    assert (str(info.value), info.value.index, info.value.pointer) == (message, index, pointer)


@pytest.mark.parametrize(
    ("doc", "op", "message"),
    [
        (
            {"s": "str"},
            {"op": "add", "path": "/s/x", "value": 1},
            "token 's' at depth 0 names a str, not an object or array",
        ),
        (
            {"o": {}},
            {"op": "add", "path": "/o/m/x", "value": 1},
            "member 'm' at depth 1 does not exist",
        ),
        (
            {"l": []},
            {"op": "add", "path": "/l/0/x", "value": 1},
            "array index 0 is out of range for an array of length 0",
        ),
        (
            {"l": [1]},
            {"op": "remove", "path": "/l/-"},
            "'-' is only valid as the final token of an add, not of a remove",
        ),
        (
            {"l": [1]},
            {"op": "replace", "path": "/l/01", "value": 1},
            "array index '01' is not a canonical non-negative integer",
        ),
        (
            {},
            {"op": "replace", "path": "", "value": []},
            "the root may only be replaced by an object",
        ),
        ({}, {"op": "remove", "path": ""}, "root remove is not allowed; only replace of the root"),
        (
            {"a": 1},
            {"op": "add", "path": "/a", "value": 2},
            "add would replace existing member 'a'",
        ),
        ({"a": 1}, {"op": "remove", "path": "/b"}, "member 'b' does not exist"),
        ("scalar", {"op": "add", "path": "/a", "value": 1}, "the document root is not a container"),
    ],
)
def test_apply_patch_refusal_is_exact(doc: Any, op: dict[str, Any], message: str) -> None:
    patch = [{"op": "add", "path": "/first", "value": 0}] if isinstance(doc, dict) else []
    patch.append(op)
    with pytest.raises(PatchError) as info:
        apply_patch(doc, patch)
    index = len(patch) - 1
    assert str(info.value) == f"op {index}, path {op['path']!r}: {message}"
    assert (info.value.index, info.value.pointer, info.value.reason) == (index, op["path"], message)


def test_pointer_helpers_refusal_is_exact() -> None:
    with pytest.raises(PatchError) as info:
        parse_pointer(5)  # type: ignore[arg-type]
    assert (str(info.value), info.value.index, info.value.pointer) == (
        "pointer must be a string, not int",
        None,
        None,
    )
    with pytest.raises(PatchError) as info:
        parse_pointer("a/b")
    assert (str(info.value), info.value.pointer) == (
        "path 'a/b': pointer must be empty or start with '/'",
        "a/b",
    )
    with pytest.raises(PatchError) as info:
        encode_pointer(["a", 1])  # type: ignore[list-item]
    assert str(info.value) == "pointer token must be a string, not int"
