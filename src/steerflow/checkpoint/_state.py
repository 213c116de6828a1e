"""The logical checkpoint state shared by both formats, and one admitted transition.

An :class:`Item` is built synchronously on the event loop when ``record`` or
``record_spawned`` is called: its entry is a private normalized copy and its context is
an immutable capture, so a worker thread may read it while the caller keeps mutating
its own objects.  :class:`State` is the *persisted* fold of items; only the writer's
persistence worker touches it, one batch at a time, under the writer lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal

from ._digest import JSON, entry_digest
from ._intents import closed_by, intent_digest
from ._io import Span, read_span
from ._steps import StepLog, step_digest

__all__ = [
    "Item",
    "Kind",
    "State",
    "Ticket",
    "dumps_compact",
    "group_lines",
    "seal",
]

#: ``op`` and ``spawn`` are outcomes; ``intent`` a call recorded before it left (decision 217).
Kind = Literal["op", "spawn", "intent", "step"]

#: A kept entry encoding: its bytes, or its length in the published base (its offset
#: there is in the parallel offsets list; :attr:`State.base_fd`, decision 65).
_Kept = bytes | int

#: What :meth:`State.pieces` assembled: the change count it saw, each member's length
#: (ops, spawned), where each member landed (ops, spawned), and whether it was patched
#: from the adopted base (only the entries changed since are then adopted one by one).
_Layout = tuple[int, list[int], list[int], list[int], list[int], bool]


#: ``json.dumps`` with these options builds an encoder per call; the writer encodes
#: several values per record, so one is kept (``encode`` keeps no state between calls).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dumps_compact(value: JSON) -> bytes:
    """Compact ASCII JSON, refusing NaN and infinities (the on-disk encoding)."""
    return _COMPACT.encode(value).encode("ascii")


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


_DIGESTS = {"intent": intent_digest, "step": step_digest}


def seal(batch: list[Ticket]) -> None:
    """Add ``result_digest`` to each entry (on the worker: hashing can release the GIL)."""
    for ticket in batch:
        item = ticket.item
        if item is not None and "result_digest" not in item.entry:
            digest = _DIGESTS.get(item.kind, entry_digest)
            item.entry["result_digest"] = digest(item.entry)


@dataclass
class Ticket:
    """A caller's place in the persistence order; ``item`` None means "flush only"."""

    item: Item | None
    done: bool = False
    error: BaseException | None = None
    waiter: asyncio.Future[None] | None = None  # resolved on the loop once settled


@dataclass
class State:
    """Snapshot fields of D4 plus the folded outcomes and the captured context.

    Encoded-entry reuse: every folded entry keeps its compact JSON bytes (for planned
    entries prefixed by their key), in the same order as ``ops`` / ``spawned``, and the
    constant members (``session_id``, ``prompt``, ``plan``, ``config``, ``max_spawn``)
    are encoded once.  A snapshot or base is then the concatenation of those bytes
    around a fresh encoding of the context (reused while the context object is the
    same), so a compaction re-encodes nothing that did not change.  Once a v3 base
    holding them is published (:meth:`published`), the kept bytes are replaced by their
    ranges in that base and copied from it into the next one (decisions 65, 77).  ``entry_encodes``
    and ``encoded_bytes`` count the JSON encoding work, so tests can see the reuse.
    """

    meta: dict[str, JSON]  # session_id, prompt, plan, config, max_spawn (if not None)
    context: Any
    to_json: Callable[[Any], JSON]
    ops: dict[str, dict[str, JSON]] = field(default_factory=dict)
    spawned: list[dict[str, JSON]] = field(default_factory=list)
    spawn_index: dict[str, int] = field(default_factory=dict)
    #: Open call intents by call id, in the order they were recorded (decision 217):
    #: a base carries them as ``in_flight``; an outcome of their node closes them.
    intents: dict[str, dict[str, JSON]] = field(default_factory=dict)
    #: The steps of tool nodes' loops (decision 254): a base carries them as ``steps``.
    steps: StepLog = field(default_factory=StepLog)
    entry_encodes: int = 0
    encoded_bytes: int = 0
    # Parallel encodings (each member without its separating comma: planned entries as
    # ``"<key>":{...}``, spawned ones as ``{...}``); complete (same keys, same order) only
    # once ``_complete`` is set.
    _ops_enc: dict[str, _Kept] = field(default_factory=dict, repr=False)
    _spawned_enc: list[_Kept] = field(default_factory=list, repr=False)
    _complete: bool = field(default=False, repr=False)
    # A read-only descriptor of the base the kept ranges point into (owned here), and
    # where the last assembled document put each entry, valid while ``_changes`` is.
    base_fd: int | None = field(default=None, repr=False)
    _ops_at: list[int] = field(default_factory=list, repr=False)
    _spawned_at: list[int] = field(default_factory=list, repr=False)
    # While a base is adopted: each entry's length there and each planned key's position,
    # and what changed since (kept as bytes): a compaction then handles the changed
    # entries one by one and the unchanged runs between them as whole spans, so its
    # Python work does not grow with the number of entries.
    _ops_len: list[int] = field(default_factory=list, repr=False)
    _spawned_len: list[int] = field(default_factory=list, repr=False)
    _ops_pos: dict[str, int] = field(default_factory=dict, repr=False)
    _ops_dirty: dict[str, None] = field(default_factory=dict, repr=False)
    _spawned_dirty: set[int] = field(default_factory=set, repr=False)
    _layout: _Layout | None = field(default=None, repr=False)
    #: The byte length of the document the last :meth:`pieces` call assembled.
    assembled: int = field(default=0, repr=False)
    _changes: int = field(default=0, repr=False)
    _meta_enc: tuple[bytes, bytes] | None = field(default=None, repr=False)
    _ctx_enc: tuple[Any, bytes] | None = field(default=None, repr=False)

    def encode_entry(self, entry: dict[str, JSON]) -> bytes:
        """The compact JSON of one (sealed) entry, counted."""
        data = dumps_compact(entry)
        self.entry_encodes += 1
        self.encoded_bytes += len(data)
        return data

    def apply(self, item: Item, encoded: bytes | None = None) -> None:
        """Fold one item: upsert its entry and adopt its context.

        ``encoded`` is the entry's compact JSON when the caller already has it (the
        journal line embeds the same bytes); otherwise it is encoded here.
        """
        if item.kind == "intent":
            # Not an entry: no kept encoding and no layout change (a base puts the open
            # intents after every entry), so nothing adopted from the base moves.
            self.intents[item.key] = item.entry
            return
        if item.kind == "step":
            # Like an intent: kept after every entry, so nothing adopted moves. A model
            # step closes the write-ahead intent of the request it answers.
            self.steps.add(item.entry)
            if item.entry["type"] == "model":
                self.intents.pop(str(item.entry["call_id"]), None)
            return
        closes = closed_by(item.kind, item.entry) if self.intents else None
        if closes is not None:
            self._close(closes)
        enc = encoded if encoded is not None else self.encode_entry(item.entry)
        self._changes += 1
        adopted = self.base_fd is not None
        if item.kind == "op":
            self.ops[item.key] = item.entry
            if self._complete:
                self._ops_enc[item.key] = dumps_compact(item.key) + b":" + enc
                if adopted:
                    self._ops_dirty[item.key] = None
        else:
            at = self.spawn_index.get(item.key)
            if at is None:
                at = self.spawn_index[item.key] = len(self.spawned)
                self.spawned.append(item.entry)
                if self._complete:
                    self._spawned_enc.append(enc)
            else:
                self.spawned[at] = item.entry
                if self._complete:
                    self._spawned_enc[at] = enc
            if self._complete and adopted:
                self._spawned_dirty.add(at)
        self.context = item.context

    def _close(self, closes: tuple[str, str]) -> None:
        """Forget the open intents of the node an outcome was just recorded for."""
        record, key = closes
        done = [
            call_id
            for call_id, intent in self.intents.items()
            if intent["record"] == record and intent["key"] == key
        ]
        for call_id in done:
            del self.intents[call_id]

    def reset(
        self,
        ops: dict[str, dict[str, JSON]],
        spawned: list[dict[str, JSON]],
        context: Any,
        intents: list[dict[str, JSON]] | None = None,
        steps: list[dict[str, JSON]] | None = None,
    ) -> None:
        """Replace the folded outcomes, intents and context wholesale (reconciliation)."""
        self.intents = {str(i["call_id"]): i for i in intents or []}
        self.steps = StepLog.of(steps or [])
        self.ops = ops
        self.spawned = spawned
        self.spawn_index = {str(e["node_id"]): i for i, e in enumerate(spawned)}
        self.context = context
        self._ops_enc, self._spawned_enc, self._complete = {}, [], False
        self._forget_base()
        self._changes += 1
        self.release()

    def published(self, fd: int) -> None:
        """Adopt ``fd`` (read-only, now owned here): the base just written from :meth:`chunks`.

        Every kept entry becomes its byte range in that base, so the encodings are no
        longer held in memory (decision 65). Nothing is adopted (``fd`` is closed) when
        the state changed since that base was assembled.
        """
        layout, self._layout = self._layout, None
        if layout is None or layout[0] != self._changes:
            os.close(fd)
            return
        _, ops_len, spawned_len, self._ops_at, self._spawned_at, patched = layout
        if patched:  # only what changed since the previous base was held as bytes
            positions = self._ops_pos
            for key in self._ops_dirty:  # new keys come in ``ops`` order, after the rest
                at = positions.get(key)
                if at is None:
                    at = positions[key] = len(positions)
                self._ops_enc[key] = ops_len[at]
            for at in self._spawned_dirty:
                self._spawned_enc[at] = spawned_len[at]
        else:
            self._ops_enc = dict(zip(self._ops_enc, ops_len, strict=True))
            self._spawned_enc = list(spawned_len)
            self._ops_pos = dict(zip(self._ops_enc, range(len(ops_len)), strict=True))
        self._ops_len, self._spawned_len = ops_len, spawned_len
        self._ops_dirty, self._spawned_dirty = {}, set()
        old, self.base_fd = self.base_fd, fd
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old)

    def release(self) -> None:
        """Close the base descriptor; entries kept as its ranges are encoded again if needed."""
        fd, self.base_fd = self.base_fd, None
        if fd is None:
            return
        self._ops_enc, self._spawned_enc, self._complete = {}, [], False
        self._forget_base()
        with contextlib.suppress(OSError):
            os.close(fd)

    def _forget_base(self) -> None:
        self._ops_at, self._spawned_at = [], []
        self._ops_len, self._spawned_len, self._ops_pos = [], [], {}
        self._ops_dirty, self._spawned_dirty = {}, set()

    def document(self, head: dict[str, JSON]) -> dict[str, JSON]:
        """The snapshot as a plain JSON object, ``head`` members first."""
        doc: dict[str, JSON] = dict(head)
        doc["session_id"] = self.meta["session_id"]
        doc["prompt"] = self.meta["prompt"]
        doc["plan"] = self.meta["plan"]
        doc["flow_context"] = self.to_json(self.context)
        doc["ops"] = dict(self.ops)
        doc["spawned"] = list(self.spawned)
        if self.intents:
            doc["in_flight"] = list(self.intents.values())
        if self.steps:
            doc["steps"] = self.steps.entries()
        doc["config"] = self.meta["config"]
        if self.meta.get("max_spawn") is not None:
            doc["max_spawn"] = self.meta["max_spawn"]
        return doc

    def chunks(self, head: dict[str, JSON]) -> Iterator[bytes]:
        """Exactly ``dumps_compact(self.document(head))``, as bytes pieces in order.

        :meth:`pieces`, with every span of the published base read back in runs of at
        most 1 MiB as the pieces are consumed (never all at once).
        """
        for piece in self.pieces(head):
            if isinstance(piece, Span):
                yield from read_span(piece)
            else:
                yield piece

    def pieces(self, head: dict[str, JSON]) -> Iterator[bytes | Span]:
        """Exactly ``dumps_compact(self.document(head))``, as pieces in order.

        The pieces are the kept encodings themselves, meant for a vectored write;
        entries kept as ranges of the published base are :class:`~._io.Span` pieces of
        it (adjacent ones merged), which the write copies in the kernel. Where this
        document puts each entry is remembered for :meth:`published`.
        """
        if not self._complete:
            self._ops_enc = {
                key: dumps_compact(key) + b":" + self.encode_entry(entry)
                for key, entry in self.ops.items()
            }
            self._spawned_enc = [self.encode_entry(entry) for entry in self.spawned]
            self._complete = True
        if self._meta_enc is None:
            pre = {k: self.meta[k] for k in ("session_id", "prompt", "plan")}
            post = {"config": self.meta["config"]}
            if self.meta.get("max_spawn") is not None:
                post["max_spawn"] = self.meta["max_spawn"]
            self._meta_enc = (self._counted(pre)[1:-1], self._counted(post)[1:-1])
        if self._ctx_enc is None or self._ctx_enc[0] is not self.context:
            self._ctx_enc = (self.context, self._counted(self.to_json(self.context)))
        pre_b, post_b = self._meta_enc
        lead = [
            dumps_compact(head)[:-1] + b",",
            pre_b,  # the plan can be large: never copied into another buffer
            b',"flow_context":',
            self._ctx_enc[1],
            b',"ops":{',
        ]
        middle = b'},"spawned":['
        fd = self.base_fd
        ops_pieces: Iterable[bytes | Span]
        spawned_pieces: Iterable[bytes | Span]
        if fd is not None:
            ops_pieces, ops_len = self._patch_ops(fd)
            spawned_pieces, spawned_len = self._patch_spawned(fd)
        else:  # every kept entry is bytes
            ops = list(self._ops_enc.values())
            spawned = list(self._spawned_enc)
            ops_len = [e if isinstance(e, int) else len(e) for e in ops]
            spawned_len = [e if isinstance(e, int) else len(e) for e in spawned]
            ops_pieces = _members(ops, self._ops_at, fd)
            spawned_pieces = _members(spawned, self._spawned_at, fd)
        start = sum(map(len, lead))
        ops_at = _offsets(ops_len, start)
        end = ops_at[-1] + ops_len[-1] if ops_len else start
        spawned_at = _offsets(spawned_len, end + len(middle))
        self._layout = (self._changes, ops_len, spawned_len, ops_at, spawned_at, fd is not None)
        tail = [b"],", post_b, b"}"]
        if self.steps:
            tail[1:1] = [b'"steps":', self._counted(self.steps.entries()), b","]
        if self.intents:
            flying = self._counted(list(self.intents.values()))
            tail[1:1] = [b'"in_flight":', flying, b","]
        last = spawned_at[-1] + spawned_len[-1] if spawned_len else end + len(middle)
        self.assembled = last + sum(map(len, tail))
        return self._pieces(lead, ops_pieces, middle, spawned_pieces, tail)

    def _patch_ops(self, fd: int) -> tuple[list[bytes | Span], list[int]]:
        positions, kept = self._ops_pos, self._ops_enc
        changed: list[tuple[int, bytes]] = []
        fresh: list[bytes] = []
        for key in self._ops_dirty:
            enc = kept[key]
            assert isinstance(enc, bytes)
            at = positions.get(key)
            if at is None:
                fresh.append(enc)  # new keys follow every key of the base, in order
            else:
                changed.append((at, enc))
        changed.sort()
        return _runs(self._ops_len, self._ops_at, changed, fresh, fd)

    def _patch_spawned(self, fd: int) -> tuple[list[bytes | Span], list[int]]:
        count = len(self._spawned_len)
        changed: list[tuple[int, bytes]] = []
        fresh: list[bytes] = []
        for at in sorted(self._spawned_dirty):
            enc = self._spawned_enc[at]
            assert isinstance(enc, bytes)
            if at < count:
                changed.append((at, enc))
            else:
                fresh.append(enc)
        return _runs(self._spawned_len, self._spawned_at, changed, fresh, fd)

    @staticmethod
    def _pieces(
        lead: list[bytes],
        ops: Iterable[bytes | Span],
        middle: bytes,
        spawned: Iterable[bytes | Span],
        tail: list[bytes],
    ) -> Iterator[bytes | Span]:
        yield from lead
        yield from ops
        yield middle
        yield from spawned
        yield from tail

    def _counted(self, value: JSON) -> bytes:
        data = dumps_compact(value)
        self.encoded_bytes += len(data)
        return data


def _offsets(lengths: list[int], start: int) -> list[int]:
    """Where each member lands when written comma-separated from ``start``."""
    if not lengths:
        return []
    # in C: this runs over every entry at every compaction
    return list(accumulate(map((1).__add__, lengths[:-1]), initial=start))


def _runs(
    lengths: list[int],
    at: list[int],
    changed: list[tuple[int, bytes]],
    fresh: list[bytes],
    fd: int,
) -> tuple[list[bytes | Span], list[int]]:
    """A base-backed section's pieces, and every member's new length.

    Unchanged runs are spans, ``changed`` (sorted) and ``fresh`` (appended) entries
    bytes, comma-separated. In the base, consecutive members are separated by exactly
    one comma, the separator they need here too, so a run of unchanged members is one
    span.
    """
    out: list[bytes | Span] = []
    new_len = list(lengths)
    count = len(lengths)
    done = 0  # members before this one are placed
    for index, enc in changed:
        if index > done:
            out += (Span(fd, at[done], at[index - 1] + lengths[index - 1]), b",")
        out += (enc, b",")
        new_len[index] = len(enc)
        done = index + 1
    if done < count:
        out += (Span(fd, at[done], at[count - 1] + lengths[count - 1]), b",")
    for enc in fresh:
        out += (enc, b",")
        new_len.append(len(enc))
    if out:
        out.pop()
    return out, new_len


def _members(members: list[_Kept], at: list[int], fd: int | None) -> Iterator[bytes | Span]:
    """``members`` comma-separated; adjacent ranges of the base become one :class:`Span`.

    A member kept as its length is at ``at[index]`` in the base. In the base two
    members that follow each other are separated by exactly one comma, the separator
    they need here too, so a run of them is one copy.
    """
    span: list[int] | None = None  # [start, end) of base bytes not yet yielded
    for index, enc in enumerate(members):
        if isinstance(enc, int):
            begin = at[index]
            if span is not None and begin == span[1] + 1:
                span[1] = begin + enc
                continue
        if span is not None:
            assert fd is not None
            yield Span(fd, span[0], span[1])
            span = None
        if index:
            yield b","
        if isinstance(enc, int):
            span = [at[index], at[index] + enc]
        else:
            yield enc
    if span is not None:
        assert fd is not None
        yield Span(fd, span[0], span[1])
