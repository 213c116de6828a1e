"""The strict JSON Patch subset that version-3 journal records carry.

A journal record's ``flow_context.patch`` is a list of RFC 6902 operation objects, but only a
narrow, unambiguous part of RFC 6902 is accepted (design record ADR-0069, Amendment 2, §1):

* exactly three operation shapes, with no extra members::

      {"op": "add", "path": <pointer>, "value": <JSON>}
      {"op": "remove", "path": <pointer>}
      {"op": "replace", "path": <pointer>, "value": <JSON>}

  ``move``, ``copy``, ``test``, unknown operations and unknown members are refused;
* ``add`` only creates: it never overwrites an existing object member (RFC 6902 would);
* array indices are canonical decimal (``0`` or a non-zero digit followed by digits) and an
  ``add`` index may be at most the array length; ``-`` appends, and only as the last token of an
  ``add`` whose parent is an array (inside an object ``-`` is an ordinary member name);
* every container on the way to the target must exist and be of the right kind; ``remove`` and
  ``replace`` need an existing target;
* the root (``""``) may only be replaced, and only by an object; root ``add`` and ``remove`` are
  refused, because a flow context root always exists and is always an object;
* values are normalized JSON: ``None``, ``bool``, ``int``, finite ``float``, ``str`` (exact
  types), lists (tuples are accepted as arrays) and dicts with ``str`` keys.

:func:`apply_patch` works on a private candidate: every container on a touched path is copied
once (copy-on-write) and inserted values are deep-copied into plain ``dict``/``list``, so the input
document and the patch are never mutated and untouched subtrees are shared with the input. A later
operation sees the effect of earlier ones. Either every operation applies or
:class:`PatchError` is raised and nothing observable changed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

__all__ = [
    "PatchError",
    "apply_patch",
    "encode_pointer",
    "parse_pointer",
    "validate_patch",
]

_INDEX_RE = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE_RE = re.compile(r"~(?![01])")
_VALUE_OPS = frozenset({"add", "replace"})
_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "add": frozenset({"op", "path", "value"}),
    "replace": frozenset({"op", "path", "value"}),
    "remove": frozenset({"op", "path"}),
}


class PatchError(ValueError):
    """A patch that is malformed or cannot be applied under the subset's rules.

    Attributes:
        index: Position of the offending operation in the patch, when known.
        pointer: The JSON Pointer involved, when known.
        reason: The bare reason, without the position prefix.
    """

    def __init__(self, reason: str, *, index: int | None = None, pointer: str | None = None):
        self.index = index
        self.pointer = pointer
        self.reason = reason
        where: list[str] = []
        if index is not None:
            where.append(f"op {index}")
        if pointer is not None:
            where.append(f"path {pointer!r}")
        super().__init__(f"{', '.join(where)}: {reason}" if where else reason)


def parse_pointer(ptr: str) -> list[str]:
    """Split an RFC 6901 JSON Pointer into its decoded reference tokens.

    ``""`` is the root and yields ``[]``; any other pointer must start with ``/``. ``~1`` decodes
    to ``/`` and ``~0`` to ``~``, each exactly once (``~01`` is the token ``~1``). A ``~`` not
    followed by ``0`` or ``1`` is refused.

    Args:
        ptr: The pointer text.

    Returns:
        The decoded tokens, outermost first.

    Raises:
        PatchError: If ``ptr`` is not a string or is not a well-formed pointer.
    """
    if not isinstance(ptr, str):
        raise PatchError(f"pointer must be a string, not {type(ptr).__name__}")
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError("pointer must be empty or start with '/'", pointer=ptr)
    if _BAD_ESCAPE_RE.search(ptr):
        raise PatchError("pointer has a '~' that is not '~0' or '~1'", pointer=ptr)
    return [tok.replace("~1", "/").replace("~0", "~") for tok in ptr[1:].split("/")]


def encode_pointer(tokens: Sequence[str]) -> str:
    """Build the JSON Pointer whose decoded tokens are ``tokens``.

    Args:
        tokens: Reference tokens, outermost first; ``[]`` is the root.

    Returns:
        The pointer, with ``~`` written as ``~0`` and ``/`` as ``~1``.

    Raises:
        PatchError: If a token is not a string.
    """
    parts: list[str] = []
    for tok in tokens:
        if not isinstance(tok, str):
            raise PatchError(f"pointer token must be a string, not {type(tok).__name__}")
        parts.append("/" + tok.replace("~", "~0").replace("/", "~1"))
    return "".join(parts)


def _check_value(value: object, depth: int = 0) -> None:
    """Raise ``ValueError`` unless ``value`` is normalized JSON."""
    if depth > 900:
        raise ValueError("value nests too deeply")
    tp = type(value)
    if value is None or tp is bool or tp is int or tp is str:
        return
    if tp is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise ValueError(f"value contains a non-finite number ({value!r})")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str:
                raise ValueError(f"object key {key!r} is not a string")
            _check_value(item, depth + 1)
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_value(item, depth + 1)
        return
    raise ValueError(f"value of type {tp.__name__} is not normalized JSON")


def validate_patch(patch: object) -> list[dict[str, object]]:
    """Check that ``patch`` only uses the subset's exact operation objects.

    This validates shape, pointers and values; whether each operation fits the document is only
    known when it is applied (:func:`apply_patch`).

    Args:
        patch: The decoded ``patch`` member of a journal record.

    Returns:
        A new list of new operation dicts (values are shared, not copied).

    Raises:
        PatchError: Naming the first offending operation's index and pointer.
    """
    if not isinstance(patch, list | tuple):
        raise PatchError(f"patch must be an array, not {type(patch).__name__}")
    out: list[dict[str, object]] = []
    for index, op in enumerate(patch):
        if not isinstance(op, Mapping):
            raise PatchError(f"operation must be an object, not {type(op).__name__}", index=index)
        raw_path = op.get("path")
        pointer = raw_path if isinstance(raw_path, str) else None
        name = op.get("op")
        if not isinstance(name, str) or name not in _ALLOWED_KEYS:
            raise PatchError(f"operation {name!r} is not allowed", index=index, pointer=pointer)
        keys = set(op.keys())
        allowed = _ALLOWED_KEYS[name]
        if keys != allowed:
            extra = sorted(map(repr, keys - allowed))
            missing = sorted(map(repr, allowed - keys))
            detail = "; ".join(
                part
                for part in (
                    f"unexpected member(s) {', '.join(extra)}" if extra else "",
                    f"missing member(s) {', '.join(missing)}" if missing else "",
                )
                if part
            )
            raise PatchError(f"{name} operation {detail}", index=index, pointer=pointer)
        if pointer is None:
            raise PatchError(f"path must be a string, not {type(raw_path).__name__}", index=index)
        try:
            parse_pointer(pointer)
        except PatchError as exc:
            raise PatchError(exc.reason, index=index, pointer=pointer) from None
        clean: dict[str, object] = {"op": name, "path": pointer}
        if name in _VALUE_OPS:
            value = op["value"]
            try:
                _check_value(value)
            except (ValueError, RecursionError) as exc:
                raise PatchError(str(exc), index=index, pointer=pointer) from None
            clean["value"] = value
        out.append(clean)
    return out


def _plain_copy(value: object) -> object:
    """Deep-copy an already validated value into plain ``dict``/``list`` containers."""
    if isinstance(value, dict):
        return {key: _plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_copy(item) for item in value]
    return value


def _array_index(token: str, length: int, *, allow_end: bool) -> int:
    """Decode a canonical array index, refusing ones out of range."""
    if not _INDEX_RE.fullmatch(token):
        raise ValueError(f"array index {token!r} is not a canonical non-negative integer")
    idx = int(token)
    limit = length if allow_end else length - 1
    if idx > limit:
        raise ValueError(f"array index {idx} is out of range for an array of length {length}")
    return idx


class _Candidate:
    """The private, copy-on-write document a patch is applied to."""

    def __init__(self, doc: object) -> None:
        self.root = doc
        # Containers this candidate created; they are private and safe to mutate. The list
        # keeps them alive so their ids cannot be recycled while the set is in use.
        self._owned: list[object] = []
        self._owned_ids: set[int] = set()

    def _own(self, container: object) -> object:
        if id(container) in self._owned_ids:
            return container
        if isinstance(container, dict):
            copy: object = dict(container)
        elif isinstance(container, list | tuple):
            copy = list(container)
        else:  # pragma: no cover - callers only pass containers
            raise TypeError("not a container")
        self._owned.append(copy)
        self._owned_ids.add(id(copy))
        return copy

    def parent_of(self, tokens: list[str]) -> dict[str, object] | list[object]:
        """Return a private copy of the container holding the target, copying the spine."""
        if not isinstance(self.root, dict | list | tuple):
            raise ValueError("the document root is not a container")
        node = self._own(self.root)
        self.root = node
        for depth, token in enumerate(tokens[:-1]):
            if isinstance(node, dict):
                if token not in node:
                    raise ValueError(f"member {token!r} at depth {depth} does not exist")
                child = node[token]
            else:
                assert isinstance(node, list)
                child = node[_array_index(token, len(node), allow_end=False)]
            if not isinstance(child, dict | list | tuple):
                raise ValueError(
                    f"token {token!r} at depth {depth} names a {type(child).__name__}, "
                    "not an object or array"
                )
            owned = self._own(child)
            if owned is not child:
                if isinstance(node, dict):
                    node[token] = owned
                else:
                    node[int(token)] = owned
            node = owned
        assert isinstance(node, dict | list)
        return node


def _apply_one(cand: _Candidate, name: str, tokens: list[str], value: object) -> None:
    if not tokens:
        if name != "replace":
            raise ValueError(f"root {name} is not allowed; only replace of the root")
        if not isinstance(value, dict):
            raise ValueError("the root may only be replaced by an object")
        cand.root = _plain_copy(value)
        return
    parent = cand.parent_of(tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        exists = last in parent
        if name == "add":
            if exists:
                raise ValueError(f"add would replace existing member {last!r}")
            parent[last] = _plain_copy(value)
        elif not exists:
            raise ValueError(f"member {last!r} does not exist")
        elif name == "remove":
            del parent[last]
        else:
            parent[last] = _plain_copy(value)
        return
    if name == "add":
        if last == "-":
            parent.append(_plain_copy(value))
        else:
            parent.insert(_array_index(last, len(parent), allow_end=True), _plain_copy(value))
        return
    if last == "-":
        raise ValueError(f"'-' is only valid as the final token of an add, not of a {name}")
    idx = _array_index(last, len(parent), allow_end=False)
    if name == "remove":
        del parent[idx]
    else:
        parent[idx] = _plain_copy(value)


def apply_patch(doc: object, patch: Sequence[Mapping[str, object]]) -> object:
    """Apply a subset patch to ``doc`` and return the new document.

    The input document is never mutated: containers along touched paths are copied once per call
    and untouched subtrees are shared with ``doc``. Inserted values are deep-copied into plain
    ``dict``/``list`` containers. Operations apply in order, each seeing the previous ones.

    Args:
        doc: The current document (for a flow context, a ``dict``).
        patch: The operations; validated with :func:`validate_patch` before anything applies.

    Returns:
        The patched document (``doc`` itself when the patch is empty).

    Raises:
        PatchError: If the patch is malformed or any operation does not fit; the message names
            the operation's index and pointer. Nothing is applied in that case.
    """
    ops = validate_patch(patch)
    cand = _Candidate(doc)
    for index, op in enumerate(ops):
        pointer = op["path"]
        assert isinstance(pointer, str)
        name = op["op"]
        assert isinstance(name, str)
        try:
            _apply_one(cand, name, parse_pointer(pointer), op.get("value"))
        except (ValueError, RecursionError) as exc:
            raise PatchError(str(exc), index=index, pointer=pointer) from None
    return cand.root
