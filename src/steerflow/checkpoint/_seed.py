"""Entries a writer starts with, published in its first snapshot or base.

A resumed run replays outcomes its source recorded.  If it journaled them one by one
after an empty first publication, a kill in between would leave the newest run of the
chain with a checkpoint that lacks acknowledged work, and resuming *that* run would
pay for the work again.  So the writer takes them up front: they are part of the
initial state, and its first publication (the version 2 snapshot, or the version 3
base) holds all of them as one visibility unit (decision 43).

Entries are checked by the rules of ``record`` / ``record_spawned`` and sealed like a
recorded entry; a ``result_digest`` given with one must match what sealing computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._digest import JSON, normalize
from ._state import Item, Ticket, seal

__all__ = ["seed_entries"]

_PLANNED = frozenset({"completed", "failed"})
_SPAWNED = frozenset({"completed", "failed", "pending"})
_SPAWN_FIELDS = ("operation", "assignee", "instruction", "parent_id", "spawn_id", "context")


def seed_entries(
    ops: Mapping[str, Mapping[str, object]] | None,
    spawned: Sequence[Mapping[str, object]] | None,
) -> tuple[dict[str, dict[str, JSON]], list[dict[str, JSON]]]:
    """Checked, normalized and sealed copies of the initial ``ops`` and ``spawned``.

    Raises:
        ValueError: an entry breaks a rule ``record``/``record_spawned`` would enforce,
            or carries a ``result_digest`` that does not match it.
    """
    out_ops: dict[str, dict[str, JSON]] = {}
    for key, entry in (ops or {}).items():
        where = f"initial ops entry {key!r}"
        if not isinstance(key, str) or not key or not isinstance(entry, Mapping):
            raise ValueError(f"{where}: needs a non-empty agent id and a mapping")
        if entry.get("agent_id", key) != key:
            raise ValueError(f"{where}: its agent_id is {entry.get('agent_id')!r}")
        if entry.get("status") not in _PLANNED or "response" not in entry:
            raise ValueError(f"{where}: needs status completed or failed and a response")
        out_ops[key] = _sealed("op", key, {**entry, "agent_id": key}, where)
    out_spawned: list[dict[str, JSON]] = []
    seen: set[str] = set()
    for index, entry in enumerate(spawned or ()):
        node_id = entry.get("node_id") if isinstance(entry, Mapping) else None
        where = f"initial spawned entry {index} ({node_id!r})"
        if not isinstance(entry, Mapping) or not isinstance(node_id, str) or not node_id:
            raise ValueError(f"{where}: needs a mapping with a non-empty node_id")
        if node_id in seen:
            raise ValueError(f"{where}: node_id repeats")
        seen.add(node_id)
        status = entry.get("status")
        if status not in _SPAWNED or "response" not in entry:
            raise ValueError(f"{where}: needs status completed, failed or pending and a response")
        if status == "pending" and (entry["response"] is not None or entry.get("spawned_ids")):
            raise ValueError(f"{where}: a pending entry has no response and no spawned_ids")
        raw = {**dict.fromkeys(_SPAWN_FIELDS), **entry}
        out_spawned.append(_sealed("spawn", node_id, raw, where))
    return out_ops, out_spawned


def _sealed(kind: str, key: str, raw: Mapping[str, object], where: str) -> dict[str, JSON]:
    try:
        entry = normalize({k: v for k, v in raw.items() if k != "result_digest"})
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    assert isinstance(entry, dict)
    # Sealed exactly as a recorded entry, so a replayed entry's digest is the one a
    # fresh record of the same outcome would get.
    seal([Ticket(Item("op" if kind == "op" else "spawn", key, entry, None, None))])
    given = raw.get("result_digest")
    if given is not None and given != entry["result_digest"]:
        raise ValueError(f"{where}: result_digest does not match the entry")
    return entry
