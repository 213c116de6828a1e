"""The logical checkpoint state shared by both formats, and one admitted transition.

An :class:`Item` is built synchronously on the event loop when ``record`` or
``record_spawned`` is called: its entry is a private normalized copy and its context is
an immutable capture, so a worker thread may read it while the caller keeps mutating
its own objects.  :class:`State` is the *persisted* fold of items; only the writer's
persistence worker touches it, one batch at a time, under the writer lock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ._digest import JSON, entry_digest

__all__ = [
    "Item",
    "Kind",
    "State",
    "Ticket",
    "dumps_compact",
    "encode_chunks",
    "group_lines",
    "seal",
]

Kind = Literal["op", "spawn"]


def dumps_compact(value: JSON) -> bytes:
    """Compact ASCII JSON, refusing NaN and infinities (the on-disk encoding)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.encode("ascii")


def _pieces(value: JSON, depth: int) -> Iterator[bytes]:
    if depth and isinstance(value, dict) and value:
        sep = b"{"
        for key, item in value.items():
            yield sep + dumps_compact(key) + b":"
            yield from _pieces(item, depth - 1)
            sep = b","
        yield b"}"
    elif depth and isinstance(value, (list, tuple)) and value:
        sep = b"["
        for item in value:
            yield sep
            yield from _pieces(item, depth - 1)
            sep = b","
        yield b"]"
    else:
        yield dumps_compact(value)


def encode_chunks(value: JSON, chunk: int = 1 << 20, depth: int = 4) -> Iterator[bytes]:
    """The same bytes as :func:`dumps_compact`, produced in pieces of about ``chunk``.

    The outer ``depth`` levels of containers are walked in Python and everything below
    is encoded by one ``json.dumps`` call per subtree, so a worker thread encoding a
    large snapshot never holds the GIL for one long call and the event loop keeps
    running.
    """
    group: list[bytes] = []
    size = 0
    for piece in _pieces(value, depth):
        group.append(piece)
        size += len(piece)
        if size >= chunk:
            yield b"".join(group)
            group, size = [], 0
    if group:
        yield b"".join(group)


def group_lines(lines: list[bytes], chunk: int = 1 << 20) -> Iterator[bytes]:
    """Join consecutive lines into writes of about ``chunk`` bytes."""
    group: list[bytes] = []
    size = 0
    for line in lines:
        group.append(line)
        size += len(line)
        if size >= chunk:
            yield b"".join(group)
            group, size = [], 0
    if group:
        yield b"".join(group)


@dataclass(frozen=True)
class Item:
    """One admitted outcome: its complete entry and the context after it.

    ``patch`` is None when the context did not change; ``context`` is the captured
    context *after* this item (an opaque immutable value owned by the format module).
    """

    kind: Kind
    key: str
    entry: dict[str, JSON]
    patch: list[dict[str, JSON]] | None
    context: Any


def seal(batch: list[Ticket]) -> None:
    """Add ``result_digest`` to each entry (on the worker: hashing can release the GIL)."""
    for ticket in batch:
        if ticket.item is not None and "result_digest" not in ticket.item.entry:
            ticket.item.entry["result_digest"] = entry_digest(ticket.item.entry)


@dataclass
class Ticket:
    """A caller's place in the persistence order; ``item`` None means "flush only"."""

    item: Item | None
    done: bool = False
    error: BaseException | None = None


@dataclass
class State:
    """Snapshot fields of D4 plus the folded outcomes and the captured context."""

    meta: dict[str, JSON]  # session_id, prompt, plan, config, max_spawn (if not None)
    context: Any
    to_json: Callable[[Any], JSON]
    ops: dict[str, dict[str, JSON]] = field(default_factory=dict)
    spawned: list[dict[str, JSON]] = field(default_factory=list)
    spawn_index: dict[str, int] = field(default_factory=dict)

    def apply(self, item: Item) -> None:
        """Fold one item: upsert its entry and adopt its context."""
        if item.kind == "op":
            self.ops[item.key] = item.entry
        else:
            at = self.spawn_index.get(item.key)
            if at is None:
                self.spawn_index[item.key] = len(self.spawned)
                self.spawned.append(item.entry)
            else:
                self.spawned[at] = item.entry
        self.context = item.context

    def document(self, head: dict[str, JSON]) -> dict[str, JSON]:
        """The snapshot as a plain JSON object, ``head`` members first."""
        doc: dict[str, JSON] = dict(head)
        doc["session_id"] = self.meta["session_id"]
        doc["prompt"] = self.meta["prompt"]
        doc["plan"] = self.meta["plan"]
        doc["flow_context"] = self.to_json(self.context)
        doc["ops"] = dict(self.ops)
        doc["spawned"] = list(self.spawned)
        doc["config"] = self.meta["config"]
        if self.meta.get("max_spawn") is not None:
            doc["max_spawn"] = self.meta["max_spawn"]
        return doc
