"""One recorded entry read back from a version 4 checkpoint (issue 43 item 2, decision 393).

A batch's run held every response until it ended, ~4 KiB a node; a version 4 writer can
find any entry it recorded (the encodings since its last manifest, or a range of one of
its pinned segments), so a run keeps a large response in its checkpoint once the record
is durable and reads it back when a dependent, a view or its result asks.

After the writer closes, its pins are gone: :class:`ClosedEntries` keeps where each entry
lies (segment name, identity, range) and the last encodings, and reads a range through a
fresh descriptor, refusing a file that is not the one written (identity) and an entry
whose digest does not match what it says.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from steerflow.errors import PersistenceError

from . import _io
from ._digest import JSON, entry_digest
from ._io import Identity
from ._state import dumps_compact

__all__ = ["ClosedEntries", "EntryId", "Location", "entry_of_member"]

EntryId = tuple[str, str]  # ("op", agent_id) or ("spawn", node_id)
#: A member of a segment: the segment's name, its identity, offset and length.
Location = tuple[str, Identity, int, int]


def entry_of_member(ident: EntryId, member: bytes) -> dict[str, JSON]:
    """The entry a segment member holds (``"key":{...}`` for an op, ``{...}`` for a spawn).

    A journal published as a segment (decision 395) holds an op's entry bare, ``{...}``.

    Raises:
        PersistenceError: The bytes are not that identity's entry.
    """
    kind, key = ident
    if kind == "op" and not member.startswith(b"{"):
        prefix = dumps_compact(key) + b":"
        if not member.startswith(prefix):
            raise PersistenceError(f"the checkpoint range read for node {key!r} is another's")
        member = member[len(prefix) :]
    return entry_of_encoding(ident, member)


def entry_of_encoding(ident: EntryId, encoded: bytes) -> dict[str, JSON]:
    """One entry's compact JSON decoded and checked to be ``ident``'s."""
    kind, key = ident
    try:
        entry = json.loads(encoded)
    except ValueError as exc:
        detail = f"the checkpoint entry of node {key!r} does not decode: {exc}"
        raise PersistenceError(detail) from None
    name = "agent_id" if kind == "op" else "node_id"
    if not isinstance(entry, dict) or entry.get(name) != key:
        raise PersistenceError(f"the checkpoint range read for node {key!r} is another's")
    return entry


@dataclass
class ClosedEntries:
    """Where a closed version 4 writer left each entry (see the module docstring)."""

    run_dir: str
    locations: dict[EntryId, Location] = field(default_factory=dict, repr=False)
    #: Entries upserted since the last manifest (in the journal on disk), as encoded.
    encoded: dict[EntryId, bytes] = field(default_factory=dict, repr=False)

    def read(self, ident: EntryId) -> dict[str, JSON]:
        """``ident``'s last recorded entry.

        Raises:
            PersistenceError: It was never recorded, or its file is gone, replaced or
                altered (the message names the file).
        """
        encoded = self.encoded.get(ident)
        if encoded is not None:
            return entry_of_encoding(ident, encoded)
        where = self.locations.get(ident)
        if where is None:
            raise PersistenceError(f"node {ident[1]!r} has no entry in the checkpoint")
        name, identity, offset, length = where
        key = ident[1]
        path = os.path.join(self.run_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise PersistenceError(f"cannot read node {key!r} back from {path}: {exc}") from None
        try:
            if _io.identity(fd) != identity:
                raise PersistenceError(f"{path} is no longer the segment this run wrote")
            member = os.pread(fd, length, offset)
        except OSError as exc:
            raise PersistenceError(f"cannot read node {key!r} back from {path}: {exc}") from None
        finally:
            os.close(fd)
        entry = entry_of_member(ident, member)
        if entry.get("result_digest") != entry_digest(entry):
            raise PersistenceError(f"node {ident[1]!r} in {path} does not match its digest")
        return entry
