"""Tests for immutable context capture and exact nested deltas (``_capture``)."""

from __future__ import annotations

import copy
import enum
import json
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steerflow.checkpoint import _capture
from steerflow.checkpoint._capture import (
    EMPTY,
    ContextError,
    FrozenObject,
    exact_equal,
    thaw,
    to_jsonable,
)
from steerflow.checkpoint._patch import apply_patch, validate_patch


def freeze(value: object) -> Any:
    """``_capture.freeze``, typed loosely so tests can index the result."""
    return _capture.freeze(value)


def capture(baseline: Any, live: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``_capture.capture``, typed loosely so tests can index the result."""
    return _capture.capture(baseline, live)


def _enc(value: object) -> str:
    """Type-exact, order-insensitive text of a JSON value (1, 1.0, true, -0.0 all differ)."""
    return json.dumps(value, sort_keys=True, allow_nan=False)


def _check(baseline: Any, live: Any) -> tuple[Any, list[dict[str, object]]]:
    """Capture, then verify the patch reproduces the new baseline exactly (including order)."""
    before = json.dumps(to_jsonable(baseline))
    new, patch = capture(baseline, live)
    validate_patch(patch)
    replayed = apply_patch(thaw(baseline), patch)
    assert json.dumps(replayed) == json.dumps(to_jsonable(new))
    assert _enc(thaw(new)) == _enc(live)
    assert json.dumps(to_jsonable(baseline)) == before, "baseline changed"
    if not patch:
        assert new is baseline
    return new, patch


# --------------------------------------------------------------------------- type exactness


@pytest.mark.parametrize(
    ("old", "new"),
    [(1, 1.0), (1, True), (1, "1"), (1.0, True), (0, False), (0.0, -0.0), (None, 0), ("", None)],
)
def test_type_exact_changes_are_replaced(old: object, new: object) -> None:
    for a, b in ((old, new), (new, old)):
        base = freeze({"v": a, "n": {"v": [a]}})
        _, patch = _check(base, {"v": b, "n": {"v": [b]}})
        assert patch == [
            {"op": "replace", "path": "/v", "value": b},
            {"op": "replace", "path": "/n/v/0", "value": b},
        ]
        assert type(patch[0]["value"]) is type(b)


@pytest.mark.parametrize(
    "value", [1, 1.0, True, False, "1", None, -0.0, 0.0, [1, True], {"a": 1.5}]
)
def test_equal_values_give_no_patch(value: object) -> None:
    base = freeze({"v": value})
    new, patch = capture(base, {"v": copy.deepcopy(value)})
    assert patch == [] and new is base


def test_exact_equal() -> None:
    assert exact_equal(freeze({"a": [1, 2.0]}), freeze({"a": [1, 2.0]}))
    assert not exact_equal(freeze({"a": [1]}), freeze({"a": [1.0]}))
    assert not exact_equal(freeze({"a": [1]}), freeze({"b": [1]}))
    assert not exact_equal(freeze(True), freeze(1))
    assert not exact_equal(freeze(0.0), freeze(-0.0))
    assert exact_equal(freeze({"a": 1, "b": 2}), freeze({"b": 2, "a": 1}))


# --------------------------------------------------------------------------- none, empty, null


def test_none_means_no_update() -> None:
    base = freeze({"a": 1})
    new, patch = capture(base, None)
    assert new is base and patch == []


def test_empty_removes_every_key() -> None:
    base = freeze({"a": 1})
    new, patch = _check(base, {})
    assert patch == [{"op": "remove", "path": "/a"}]
    assert thaw(new) == {}
    new, patch = _check(freeze({"a": 1, "b": {"c": 2}}), {})
    assert patch == [{"op": "replace", "path": "", "value": {}}]
    assert capture(EMPTY, {}) == (EMPTY, [])


def test_null_is_a_stored_value() -> None:
    new, patch = _check(EMPTY, {"a": None})
    assert patch == [{"op": "add", "path": "/a", "value": None}]
    assert thaw(new) == {"a": None}
    _, patch = _check(new, {})
    assert patch == [{"op": "remove", "path": "/a"}]


def test_bad_arguments() -> None:
    with pytest.raises(ContextError):
        capture({"a": 1}, {})
    with pytest.raises(ContextError):
        capture(freeze([1]), {})
    with pytest.raises(ContextError):
        capture(EMPTY, [1])


# --------------------------------------------------------------------------- normalization


def test_keys_normalize_like_json() -> None:
    raw = {True: 1, None: 3, 7: 4, 1.5: 5, 2.0: 6, -1e300: 7, "s": 8, 10**20: 9}
    frozen = freeze(raw)
    assert list(frozen) == list(json.loads(json.dumps(raw)))
    assert list(frozen) == ["true", "null", "7", "1.5", "2.0", "-1e+300", "s", str(10**20)]
    assert list(freeze({False: 1})) == ["false"]
    assert list(freeze({-0.0: 1})) == ["-0.0"]


class _Color(enum.IntEnum):
    RED = 1


class _Name(enum.StrEnum):
    A = "a"


class _Weird:
    calls = 0

    def __str__(self) -> str:
        _Weird.calls += 1
        return "weird"


def test_values_normalize_like_json_default_str() -> None:
    value = {"e": _Color.RED, "s": _Name.A, "t": (1, (2,)), "o": _Weird(), "set": {1}}
    frozen = freeze(value)
    assert thaw(frozen) == {"e": 1, "s": "a", "t": [1, [2]], "o": "weird", "set": "{1}"}
    assert type(frozen["e"]) is int and type(frozen["s"]) is str
    assert json.dumps(to_jsonable(frozen)) == json.dumps(value, default=str)


def test_non_json_objects_are_stringified_once_per_capture() -> None:
    _Weird.calls = 0
    base = freeze({"o": _Weird()})
    assert _Weird.calls == 1
    new, patch = capture(base, {"o": _Weird()})
    assert patch == [] and new is base and _Weird.calls == 2
    _, patch = capture(base, {"o": [_Weird()]})
    assert patch == [{"op": "replace", "path": "/o", "value": ["weird"]}] and _Weird.calls == 3


def test_unprintable_object_refused() -> None:
    class Bad:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(ContextError, match="could not be converted"):
        freeze({"a": Bad()})


@pytest.mark.parametrize(
    "raw",
    [{1: "a", "1": "b"}, {True: 1, "true": 2}, {None: 1, "null": 2}, {2.0: 1, "2.0": 2}],
)
def test_key_collisions_refused(raw: dict[Any, Any]) -> None:
    with pytest.raises(ContextError, match="collide"):
        freeze(raw)
    with pytest.raises(ContextError, match="collide"):
        freeze({"n": [raw]})
    with pytest.raises(ContextError, match="collide"):
        capture(EMPTY, {"n": raw})
    with pytest.raises(ContextError, match="collide"):
        capture(freeze({"n": {}}), {"n": raw})


def test_live_non_string_keys_compare_normalized() -> None:
    base = freeze({"n": {"1": "a", "null": [1]}})
    new, patch = capture(base, {"n": {1: "a", None: [1]}})
    assert patch == [] and new is base
    new, patch = capture(base, {"n": {1: "b", None: [1]}})
    assert patch == [{"op": "replace", "path": "/n/1", "value": "b"}]
    assert new["n"]["null"] is base["n"]["null"]
    assert _enc(apply_patch(thaw(base), patch)) == _enc(thaw(new))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_refused(bad: float) -> None:
    class F(float):
        pass

    for value in ({"a": bad}, {"a": [1, {"b": bad}]}, {bad: 1}, {"a": {bad: 1}}, {"a": F(bad)}):
        with pytest.raises(ContextError, match="non-finite"):
            freeze(value)
        with pytest.raises(ContextError, match="non-finite"):
            capture(freeze({"a": [1, {"b": 0.5}]}), value)


def test_bad_keys_cycles_and_depth_refused() -> None:
    with pytest.raises(ContextError, match="not JSON"):
        freeze({(1, 2): 1})
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ContextError, match="cycle"):
        freeze(loop)
    with pytest.raises(ContextError, match="cycle"):
        capture(EMPTY, loop)
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ContextError, match="deep"):
        freeze(deep)
    shared = [1]
    assert thaw(freeze({"a": shared, "b": shared})) == {"a": [1], "b": [1]}  # not a cycle


# --------------------------------------------------------------------------- immutability


def test_frozen_object_is_immutable() -> None:
    frozen: Any = freeze({"a": {"b": [1]}})
    assert isinstance(frozen, FrozenObject)
    for mutate in (
        lambda: frozen.__setitem__("x", 1),
        lambda: frozen.__delitem__("a"),
        lambda: frozen.update({"x": 1}),
        lambda: frozen.pop("a"),
        lambda: frozen.popitem(),
        lambda: frozen.setdefault("x", 1),
        lambda: frozen.clear(),
        lambda: frozen.__ior__({"x": 1}),
        lambda: FrozenObject.__init__(frozen, {"x": 1}),
        lambda: FrozenObject({"x": 1}),
    ):
        with pytest.raises(TypeError):
            mutate()
    assert thaw(frozen) == {"a": {"b": [1]}}
    inner: Any = frozen["a"]
    assert isinstance(inner["b"], tuple)
    assert copy.copy(frozen) is frozen and copy.deepcopy(frozen) is frozen
    assert pickle.loads(pickle.dumps(frozen)) == frozen
    assert hash(frozen) == hash(freeze({"a": {"b": [1]}}))
    assert {frozen: 1}[freeze({"a": {"b": (1,)}})] == 1


def test_live_mutation_after_capture_does_not_change_frozen() -> None:
    live: dict[str, Any] = {"nested": {"entries": ["a"], "m": {"k": [1]}}}
    base = freeze(live)
    live["nested"]["entries"].append("b")
    new, _ = capture(base, live)
    snapshot_base, snapshot_new = json.dumps(base), json.dumps(new)
    live["nested"]["entries"].append("c")
    live["nested"]["m"]["k"][0] = 99
    live["nested"]["z"] = {}
    assert json.dumps(base) == snapshot_base and json.dumps(new) == snapshot_new
    thawed: Any = thaw(new)
    thawed["nested"]["entries"].clear()
    assert json.dumps(new) == snapshot_new


def test_to_jsonable_is_free_and_encodes_like_thaw() -> None:
    frozen = freeze({"a": ["é", "\x00", {"": None}], "/~": 1.5e300, "n": -0.0})
    assert id(to_jsonable(frozen)) == id(frozen)  # the same object: no copy at all
    options: list[dict[str, Any]] = [
        {},
        {"ensure_ascii": True, "separators": (",", ":"), "allow_nan": False},
    ]
    for kwargs in options:
        assert json.dumps(to_jsonable(frozen), **kwargs) == json.dumps(thaw(frozen), **kwargs)


# --------------------------------------------------------------------------- shapes and sharing


def _big(n: int) -> dict[str, Any]:
    return {
        "nested": {"entries": [f"e{i}" for i in range(n)], "meta": {"m": [1, 2]}},
        "objs": {f"k{i}": {"i": i} for i in range(n)},
        "other": {"x": [{"deep": True}]},
    }


def test_append_is_one_add_and_shares_everything_else() -> None:
    live = _big(1000)
    base = freeze(live)
    live["nested"]["entries"].append("x")
    new, patch = _check(base, live)
    assert patch == [{"op": "add", "path": "/nested/entries/-", "value": "x"}]
    assert new["other"] is base["other"] and new["objs"] is base["objs"]
    assert new["nested"]["meta"] is base["nested"]["meta"]
    old_entries, new_entries = base["nested"]["entries"], new["nested"]["entries"]
    assert len(new_entries) == 1001
    assert all(a is b for a, b in zip(old_entries, new_entries, strict=False))


def test_absent_member_insertion_is_one_add() -> None:
    live = _big(1000)
    base = freeze(live)
    live["objs"]["new/~key"] = {"v": [1]}
    new, patch = _check(base, live)
    assert patch == [{"op": "add", "path": "/objs/new~1~0key", "value": {"v": [1]}}]
    assert new["nested"] is base["nested"]
    assert all(new["objs"][k] is v for k, v in base["objs"].items())
    # Equal-but-distinct live dicts still map to the shared frozen subtrees.
    live2 = copy.deepcopy(live)
    new2, patch2 = capture(new, live2)
    assert patch2 == [] and new2 is new


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], [{"op": "add", "path": "/l/-", "value": 4}]),
        ([1, 2, 3], [1, 9, 2, 3], [{"op": "add", "path": "/l/1", "value": 9}]),
        ([1, 2, 3], [0, 1, 2, 3], [{"op": "add", "path": "/l/0", "value": 0}]),
        ([1, 2, 3], [1, 3], [{"op": "remove", "path": "/l/1"}]),
        (
            [1, 2, 3, 4],
            [1, 4],
            [{"op": "remove", "path": "/l/2"}, {"op": "remove", "path": "/l/1"}],
        ),
        ([1, 2, 3], [1, 2], [{"op": "remove", "path": "/l/2"}]),
        ([1, 2, 3], [1, 7, 3], [{"op": "replace", "path": "/l/1", "value": 7}]),
        ([1, 2, 3], [4, 5, 6], [{"op": "replace", "path": "/l", "value": [4, 5, 6]}]),
        ([1, 2], [], [{"op": "replace", "path": "/l", "value": []}]),
        ([], [1], [{"op": "add", "path": "/l/-", "value": 1}]),
        ([{"a": 1}, 2], [{"a": 2}, 2], [{"op": "replace", "path": "/l/0/a", "value": 2}]),
        ([1, 2], {"0": 1}, [{"op": "replace", "path": "/l", "value": {"0": 1}}]),
    ],
)
def test_array_deltas(before: Any, after: Any, expected: list[dict[str, Any]]) -> None:
    base = freeze({"l": before, "keep": [0]})
    new, patch = _check(base, {"l": after, "keep": [0]})
    assert patch == expected
    assert new["keep"] is base["keep"]


def test_object_key_paths_are_escaped() -> None:
    base = freeze({"": {"a/b": 1, "m~n": 2, "-": 3}})
    _, patch = _check(base, {"": {"a/b": 10, "m~n": 2, "-": 3, "~1": 4}})
    assert patch == [
        {"op": "replace", "path": "//a~1b", "value": 10},
        {"op": "add", "path": "//~01", "value": 4},
    ]


def test_new_keys_keep_patch_order() -> None:
    base = freeze({"b": 1, "a": 2})
    new, patch = _check(base, {"z": 0, "a": 2, "c": 3})
    assert list(new) == ["a", "z", "c"]
    assert [op["op"] for op in patch] == ["remove", "add", "add"]


def test_journal_line_bound_for_spec_example() -> None:
    base = freeze({"nested": {"entries": ["a"] * 50}})
    _, patch = capture(base, {"nested": {"entries": ["a"] * 50 + ["x"]}})
    entry = {"agent_id": "op-0", "status": "completed", "response": "ok"}
    record = {
        "version": 3,
        "generation": "0123456789abcdef0123456789abcdef",
        "seq": 1,
        "kind": "op",
        "entry": entry,
        "flow_context": {"patch": patch},
    }
    kw: dict[str, Any] = {"ensure_ascii": True, "separators": (",", ":"), "allow_nan": False}
    line = (json.dumps(record, **kw) + "\n").encode("utf-8")
    assert line == (
        b'{"version":3,"generation":"0123456789abcdef0123456789abcdef","seq":1,"kind":"op",'
        b'"entry":{"agent_id":"op-0","status":"completed","response":"ok"},'
        b'"flow_context":{"patch":[{"op":"add","path":"/nested/entries/-","value":"x"}]}}\n'
    )
    e, u, p = (len(json.dumps(v, **kw)) for v in (entry, "x", "/nested/entries/-"))
    assert len(line) <= e + u + p + 256


# --------------------------------------------------------------------------- property


_text = st.text(alphabet="ab~/-0é", max_size=3)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 1.0, 2.5]),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_context = st.dictionaries(_text, _json, max_size=4)


def _containers(node: Any, out: list[Any]) -> list[Any]:
    if isinstance(node, dict | list):
        out.append(node)
        for child in node.values() if isinstance(node, dict) else node:
            _containers(child, out)
    return out


def _edit(data: st.DataObject, live: dict[str, Any]) -> None:
    target = data.draw(st.sampled_from(_containers(live, [])))
    if isinstance(target, dict):
        action = data.draw(st.sampled_from(["set", "delete", "clear"]))
        if action == "set":
            target[data.draw(_text)] = data.draw(_json)
        elif action == "delete" and target:
            del target[data.draw(st.sampled_from(sorted(target)))]
        elif action == "clear":
            target.clear()
        return
    action = data.draw(st.sampled_from(["append", "insert", "pop", "set", "extend", "clear"]))
    idx = data.draw(st.integers(0, max(len(target) - 1, 0)))
    if action == "append":
        target.append(data.draw(_json))
    elif action == "insert":
        target.insert(idx, data.draw(_json))
    elif action == "pop" and target:
        target.pop(idx)
    elif action == "set" and target:
        target[idx] = data.draw(_json)
    elif action == "extend":
        target.extend(data.draw(st.lists(_json, max_size=3)))
    elif action == "clear":
        target.clear()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=_context, data=st.data())
def test_capture_replays_exactly(initial: dict[str, Any], data: st.DataObject) -> None:
    live = copy.deepcopy(initial)
    baseline = freeze(initial)
    history = [(baseline, json.dumps(baseline))]
    for _ in range(data.draw(st.integers(1, 6))):
        for _ in range(data.draw(st.integers(0, 3))):
            _edit(data, live)
        new, patch = _check(baseline, live)
        assert _enc(apply_patch(thaw(baseline), patch)) == _enc(live)
        history.append((new, json.dumps(new)))
        baseline = new
    for frozen, text in history:
        assert json.dumps(frozen) == text, "an earlier frozen version changed"


@pytest.mark.parametrize("key", ["é", "\n\x00", "a/b~c", "", "\u2603\U0001f600"])
def test_journal_line_bound_with_escaped_keys(key: str) -> None:
    kw: dict[str, Any] = {"ensure_ascii": True, "separators": (",", ":"), "allow_nan": False}
    base = freeze({"nested": {f"m{i}": i for i in range(200)}})
    item = "v\u00e9\x01" * 10
    _, patch = capture(base, {"nested": {**{f"m{i}": i for i in range(200)}, key: item}})
    assert len(patch) == 1 and patch[0]["op"] == "add"
    entry = {"agent_id": "op-\u00e9", "status": "failed", "response": "\x7f"}
    record = {
        "version": 3,
        "generation": "f" * 32,
        "seq": 2**63 - 1,
        "kind": "spawn",
        "entry": entry,
        "flow_context": {"patch": patch},
    }
    line = (json.dumps(record, **kw) + "\n").encode("utf-8")
    assert line.isascii()
    e, u, p = (len(json.dumps(v, **kw)) for v in (entry, item, patch[0]["path"]))
    assert len(line) <= e + u + p + 256
    assert json.loads(line)["flow_context"]["patch"][0]["value"] == item
