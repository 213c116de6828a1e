"""Immutable, normalized flow-context capture and exact nested deltas.

This is the synchronous capture boundary of the design record (ADR-0069, Amendment 2, §4). A
flow context is normalized *once* into an immutable value (:data:`Frozen`), and every later
completion compares the live, mutable context against the previous frozen baseline to produce

* the next baseline, which shares every unchanged subtree with the previous one by identity, and
* the smallest practical patch in the strict subset of :mod:`steerflow.checkpoint._patch`.

Representation. Objects are :class:`FrozenObject` (a ``dict`` subclass whose mutating methods
raise), arrays are ``tuple``, and scalars are exact ``str``, ``int``, finite ``float``, ``bool``
and ``None``. Because ``json.dumps`` encodes ``dict`` subclasses and tuples natively, a frozen
value is already JSON-encodable (:func:`to_jsonable` is O(1)).

Normalization mirrors how a snapshot is encoded with ``json.dumps(..., default=str)``:

* object keys become strings the way ``json`` writes them (``True`` -> ``"true"``, ``None`` ->
  ``"null"``, ``1`` -> ``"1"``, ``1.5`` -> ``"1.5"``); two distinct input keys that normalize to
  the same string are refused, and so are keys of any other type;
* lists and tuples become arrays; any other non-JSON object becomes ``str(obj)``, computed once;
* ``NaN`` and infinities, as values or keys, are refused; so are cycles.

Comparison is type-exact: ``1``, ``1.0``, ``True`` and ``"1"`` all differ (so do ``0.0`` and
``-0.0``, which encode differently). Python ``==`` is never trusted for "unchanged", except that a
live element that *is* a frozen (hence immutable) object is equal to it.

Cost. Discovery walks the live context: O(size of the live context) per capture. Copying is
bounded by the changed paths: only containers on a changed path are rebuilt. Rebuilding a
container copies its element *references* (a C-level pointer copy), never its unchanged children,
so appending to a 100,000-entry array allocates one new 100,001-slot tuple plus the new item and
the ancestor spine; nothing below is copied, re-normalized or re-encoded.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn, TypeAlias, Union

from steerflow.checkpoint._patch import encode_pointer

__all__ = [
    "EMPTY",
    "ContextError",
    "Frozen",
    "FrozenObject",
    "capture",
    "exact_equal",
    "freeze",
    "thaw",
    "to_jsonable",
]

Frozen: TypeAlias = Union["FrozenObject", tuple["Frozen", ...], str, int, float, bool, None]
"""A normalized JSON value that is never mutated."""

_MISSING = object()
_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, type(None)})
# Deterministic, and well inside what the interpreter's stack allows from any caller: each
# level costs _freeze two frames, so a limit near the recursion limit (the former 900) was
# never reached, and where a deep context failed depended on how deep the caller's stack
# already was (a run could store a context its resume could not).
MAX_DEPTH = 256


class ContextError(ValueError):
    """A flow context that cannot be normalized (non-finite number, key collision, ...)."""


def _immutable(*_args: object, **_kwargs: object) -> NoReturn:
    raise TypeError("FrozenObject is immutable")


def _rebuild(items: list[tuple[str, Frozen]]) -> FrozenObject:
    return FrozenObject._make(items)


class FrozenObject(dict[str, Frozen]):
    """An immutable JSON object: a ``dict`` whose mutating methods raise ``TypeError``.

    Only :func:`freeze` and :func:`capture` build instances (calling the class raises). Equality
    and hashing follow ``dict`` (loose Python equality); use :func:`exact_equal` to compare the
    normalized JSON meaning. Copying returns the same object.
    """

    __slots__ = ("_hash",)
    _hash: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        _immutable()

    @classmethod
    def _make(cls, items: Iterable[tuple[str, Frozen]] | Mapping[str, Frozen]) -> FrozenObject:
        obj = dict.__new__(cls)
        dict.update(obj, items)
        return obj

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            self._hash = hash(frozenset(self.items()))
            return self._hash

    def __repr__(self) -> str:
        return f"FrozenObject({dict.__repr__(self)})"

    def __copy__(self) -> FrozenObject:
        return self

    def __deepcopy__(self, memo: object) -> FrozenObject:
        return self

    def __reduce__(self) -> tuple[object, tuple[list[tuple[str, Frozen]]]]:
        return _rebuild, (list(self.items()),)


EMPTY: FrozenObject = FrozenObject._make(())
"""The frozen empty object ``{}``."""


# --------------------------------------------------------------------------- normalization


def _key(key: object, where: str) -> str:
    """Normalize an object key the way ``json.dumps`` writes it."""
    if isinstance(key, str):
        return key if type(key) is str else str.__str__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise ContextError(f"non-finite number used as an object key at {where!r}")
        return float.__repr__(key)
    raise ContextError(f"object key of type {type(key).__name__} at {where!r} is not JSON")


def _child(where: str, token: str) -> str:
    if "~" in token or "/" in token:
        return where + encode_pointer((token,))
    return f"{where}/{token}"


def _str_keyed(live: Mapping[object, object], where: str) -> Mapping[str, object]:
    """Return ``live`` if all keys are exact strings, else a key-normalized copy."""
    if not live or set(map(type, live)) == {str}:
        return live  # type: ignore[return-value]
    out: dict[str, object] = {}
    for key, value in live.items():
        norm = _key(key, where)
        if norm in out:
            raise ContextError(
                f"object keys collide after normalization at {where!r}: {norm!r} appears twice"
            )
        out[norm] = value
    return out


def _freeze(value: object, where: str, active: set[int]) -> Frozen:
    tp = type(value)
    if tp is str or tp is int or tp is bool or value is None:
        return value  # type: ignore[return-value]
    if tp is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise ContextError(f"non-finite number at {where!r}")
        return value  # type: ignore[return-value]
    if tp is FrozenObject:
        return value  # type: ignore[return-value]
    if isinstance(value, dict | list | tuple):
        if len(active) >= MAX_DEPTH:
            shown = where if len(where) <= 80 else where[:80] + "..."
            raise ContextError(f"context nests more than {MAX_DEPTH} levels deep at {shown!r}")
        if id(value) in active:
            raise ContextError(f"context contains a reference cycle at {where!r}")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                items = _str_keyed(value, where).items()
                return FrozenObject._make(
                    [(k, _freeze(v, _child(where, k), active)) for k, v in items]
                )
            return tuple([_freeze(v, f"{where}/{i}", active) for i, v in enumerate(value)])
        finally:
            active.discard(id(value))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return _freeze(float.__float__(value), where, active)
    try:
        text = str(value)
    except Exception as exc:
        raise ContextError(
            f"value of type {tp.__name__} at {where!r} could not be converted to a string"
        ) from exc
    return str.__str__(text)


def freeze(value: object) -> Frozen:
    """Normalize ``value`` into an immutable :data:`Frozen` JSON value.

    Args:
        value: Any Python value (usually a flow context ``dict``).

    Returns:
        The normalized value; containers are new objects (an existing :class:`FrozenObject` is
        returned as is), strings and numbers are shared.

    Raises:
        ContextError: On a non-finite number, a key collision, a non-JSON key, a cycle, or a
            value whose ``str()`` fails.
    """
    try:
        return _freeze(value, "", set())
    except RecursionError:
        raise ContextError("context nests too deeply") from None


def context_problem(value: object) -> str | None:
    """Why ``value`` could not be stored as a flow context, or None when it could."""
    try:
        freeze(value)
    except ContextError as exc:
        return str(exc)
    return None


def thaw(f: Frozen) -> object:
    """Return a plain, mutable deep copy (``dict``/``list``) of a frozen value."""
    if isinstance(f, dict):
        return {k: thaw(v) for k, v in f.items()}
    if isinstance(f, tuple):
        return [thaw(v) for v in f]
    return f


def to_jsonable(f: Frozen) -> object:
    """Return something ``json.dumps`` encodes exactly like :func:`thaw` ``(f)``.

    This is ``f`` itself: :class:`FrozenObject` is a ``dict`` and arrays are tuples, both of
    which the ``json`` module encodes natively, so the cost is O(1) and nothing is copied.
    """
    return f


def _float_same(a: float, b: float) -> bool:
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def exact_equal(a: Frozen, b: Frozen) -> bool:
    """Compare two frozen values by normalized JSON meaning (type-exact, order-insensitive)."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is float:
        return _float_same(a, b)  # type: ignore[arg-type]
    if ta is FrozenObject:
        assert isinstance(a, dict) and isinstance(b, dict)
        return len(a) == len(b) and all(k in b and exact_equal(v, b[k]) for k, v in a.items())
    if ta is tuple:
        assert isinstance(a, tuple) and isinstance(b, tuple)
        return len(a) == len(b) and all(map(exact_equal, a, b))
    return a == b


# --------------------------------------------------------------------------- comparison


def _same(old: Frozen, live: object) -> bool:
    """True only if ``live`` certainly normalizes to exactly ``old`` (no ops, no allocation).

    ``False`` means "not proven equal": values needing normalization (non-string keys, non-JSON
    objects, subclasses) are left to :func:`_diff`, which normalizes them once.
    """
    if live is old:
        return True  # a frozen value is immutable, so identity implies equality
    tl = type(live)
    if tl is str or tl is int or tl is bool or live is None:
        return type(old) is tl and old == live
    if tl is float:
        return type(old) is float and _float_same(old, live)  # type: ignore[arg-type]
    if tl is dict:
        if type(old) is not FrozenObject or len(old) != len(live):  # type: ignore[arg-type]
            return False
        assert isinstance(old, dict) and isinstance(live, dict)
        for key, value in live.items():
            if type(key) is not str or key not in old or not _same(old[key], value):
                return False
        return True
    if tl is list or tl is tuple:
        if type(old) is not tuple or len(old) != len(live):  # type: ignore[arg-type]
            return False
        assert isinstance(old, tuple) and isinstance(live, list | tuple)
        return all(map(_same, old, live))
    return False


class _Ops:
    """The patch under construction (values are emitted as plain JSON)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, object]] = []

    def add(self, path: str, value: Frozen) -> None:
        self.ops.append({"op": "add", "path": path, "value": thaw(value)})

    def remove(self, path: str) -> None:
        self.ops.append({"op": "remove", "path": path})

    def replace(self, path: str, value: Frozen) -> None:
        self.ops.append({"op": "replace", "path": path, "value": thaw(value)})

    def direct(self, start: int, path: str) -> bool:
        """Whether everything emitted since ``start`` is one op on exactly ``path``."""
        return len(self.ops) == start + 1 and self.ops[start]["path"] == path


def _diff(old: Frozen, live: object, where: str, out: _Ops) -> Frozen:
    """Return the frozen form of ``live``, sharing ``old`` wherever nothing changed."""
    if live is old:
        return old
    if isinstance(live, dict) and type(old) is FrozenObject:
        return _diff_object(old, live, where, out)
    if isinstance(live, list | tuple) and type(old) is tuple:
        return _diff_array(old, live, where, out)
    new = _freeze(live, where, set())  # O(1) for scalars; a mismatched container is new anyway
    if exact_equal(old, new):
        return old
    out.replace(where, new)
    return new


def _settle(
    out: _Ops, start: int, where: str, new: Frozen, size: int, fresh: int, direct: int
) -> None:
    """Collapse a container's ops into one replace when that carries no more values.

    ``fresh`` children of the new container were carried whole by ``direct`` add/replace/remove
    ops. If every child is fresh, a single replace of the container encodes the same values once
    with less overhead, so it is used whenever it saves an operation.
    """
    if fresh == size and direct >= 2 and len(out.ops) - start == direct:
        del out.ops[start:]
        out.replace(where, new)


def _diff_object(old: FrozenObject, live: Mapping[object, object], where: str, out: _Ops) -> Frozen:
    items = _str_keyed(live, where)
    start = len(out.ops)
    changed: dict[str, Frozen] = {}
    added: list[tuple[str, Frozen]] = []
    fresh = direct = matched = 0
    get = old.get
    for key, value in items.items():
        prev = get(key, _MISSING)
        if prev is _MISSING:
            added.append((key, _freeze(value, _child(where, key), set())))
            continue
        matched += 1
        if value is prev or (type(value) in _PLAIN and _same(prev, value)):  # type: ignore[arg-type]
            continue
        path = _child(where, key)
        mark = len(out.ops)
        new = _diff(prev, value, path, out)  # type: ignore[arg-type]
        if new is not prev:
            changed[key] = new
            if out.direct(mark, path) and out.ops[mark]["op"] == "replace":
                fresh += 1
                direct += 1
    removed = [k for k in old if k not in items] if matched < len(old) else []
    if not (changed or added or removed):
        return old
    for key in removed:
        out.remove(_child(where, key))
    for key, value in added:
        out.add(_child(where, key), value)
    # C-level copy of the member references, then in-place edits on the private new object;
    # the resulting order is exactly what applying the patch to ``old`` produces.
    result = FrozenObject._make(old)
    for key in removed:
        dict.__delitem__(result, key)
    for key, value in changed.items():
        dict.__setitem__(result, key, value)
    for key, value in added:
        dict.__setitem__(result, key, value)
    _settle(
        out,
        start,
        where,
        result,
        len(result),
        fresh + len(added),
        direct + len(added) + len(removed),
    )
    return result


def _diff_array(old: tuple[Frozen, ...], live: Sequence[object], where: str, out: _Ops) -> Frozen:
    n, m = len(old), len(live)
    common = min(n, m)
    # Leading run of unchanged elements. Identity with the frozen element (strings, numbers and
    # reused frozen objects) is checked in C first; the rest is compared exactly.
    same = list(map(operator.is_, live, old))
    head = 0
    while head < common:
        try:
            head = same.index(False, head)
        except ValueError:
            head = common
            break
        if not _same(old[head], live[head]):
            break
        head += 1
    # Trailing run of unchanged elements, not overlapping the leading run.
    tail = 0
    while tail < common - head and _same(old[n - 1 - tail], live[m - 1 - tail]):
        tail += 1
    if head == n == m:
        return old
    start = len(out.ops)
    a, b = n - head - tail, m - head - tail
    middle: list[Frozen] = []
    fresh = direct = 0
    for k in range(min(a, b)):
        i = head + k
        path = f"{where}/{i}"
        mark = len(out.ops)
        new = _diff(old[i], live[i], path, out)
        middle.append(new)
        if new is not old[i] and out.direct(mark, path) and out.ops[mark]["op"] == "replace":
            fresh += 1
            direct += 1
    if b > a:
        for k in range(a, b):
            new = _freeze(live[head + k], f"{where}/{head + k}", set())
            middle.append(new)
            out.add(f"{where}/-" if tail == 0 else f"{where}/{head + k}", new)
        fresh += b - a
        direct += b - a
    else:
        for i in range(head + a - 1, head + b - 1, -1):
            out.remove(f"{where}/{i}")
        direct += a - b
    result = old[:head] + tuple(middle) + old[n - tail :]
    _settle(out, start, where, result, m, fresh, direct)
    return result


def capture(
    baseline: Frozen, live: Mapping[str, object] | None
) -> tuple[Frozen, list[dict[str, object]]]:
    """Compare the live context with the frozen baseline and return the next baseline + patch.

    Args:
        baseline: The previous frozen context (a :class:`FrozenObject`, e.g. :data:`EMPTY`).
        live: The current, mutable context. ``None`` means "no update"; ``{}`` means every key
            was removed; a ``None`` *value* is a stored JSON null.

    Returns:
        ``(new, patch)``: ``new`` is the frozen next baseline (``baseline`` itself when nothing
        changed), sharing every unchanged subtree with ``baseline`` by identity. ``patch`` is in
        the strict subset and turns ``thaw(baseline)`` into ``thaw(new)`` (same key order).
        Patch values are fresh plain ``dict``/``list``/scalar values.

    Raises:
        ContextError: If ``baseline`` is not a frozen object, ``live`` is not a mapping, or the
            live context cannot be normalized; no partial result is returned.
    """
    if type(baseline) is not FrozenObject:
        raise ContextError("the baseline must be a frozen object (use freeze() or EMPTY)")
    if live is None:
        return baseline, []
    if not isinstance(live, Mapping):
        raise ContextError(f"the flow context must be a mapping, not {type(live).__name__}")
    out = _Ops()
    try:
        if isinstance(live, dict):
            new = _diff_object(baseline, live, "", out)
        else:
            new = _diff_object(baseline, dict(live.items()), "", out)
    except RecursionError:
        raise ContextError("context nests too deeply") from None
    return new, out.ops
