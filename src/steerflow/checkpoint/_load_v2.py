"""The version 2 reader: one complete snapshot in the D4 shape.

Legacy parsing semantics are kept for v2 input: a repeated member name below the top
level keeps its last value, as ``json.loads`` always did.  (A repeated top-level
``version`` is refused earlier, by the dispatcher.)  The snapshot's containers must
have their D4 types; the report is ``clean`` with every journal figure ``None``.
"""

from __future__ import annotations

from typing import Any

from ._entries import entry_ref, unguarded_splice
from ._read import SNAPSHOT_TYPES, Parsed
from ._report import Report

__all__ = ["load_v2"]


def load_v2(parsed: Parsed, report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate the snapshot's shape and return it with a clean report."""
    doc: dict[str, Any] = parsed.value
    for name, kind in SNAPSHOT_TYPES:
        if not isinstance(doc.get(name), kind):
            raise report.refuse("invalid-snapshot", detail=f"member {name!r} missing or mistyped")
    max_spawn = doc.get("max_spawn")
    if max_spawn is not None and (isinstance(max_spawn, bool) or not isinstance(max_spawn, int)):
        raise report.refuse("invalid-snapshot", detail="member 'max_spawn' mistyped")
    for key, entry in doc["ops"].items():
        if not isinstance(entry, dict) or entry.get("agent_id", key) != key:
            raise report.refuse(
                "invalid-snapshot",
                detail="an ops entry is malformed",
                entry=entry_ref("op", {}, key),
            )
    for index, entry in enumerate(doc["spawned"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("node_id"), str):
            raise report.refuse(
                "invalid-snapshot",
                detail="a spawned entry is malformed",
                entry=entry_ref("spawn", entry) or {"kind": "spawn", "index": index},
            )
    # Never read an unguarded splice as an ordinary edge (Amendment 3 item 5).
    bad = unguarded_splice(doc["plan"], doc["spawned"])
    if bad is not None:
        raise report.refuse(
            "unguarded-splice",
            detail="an escalation retry's splice witness (escalated_from) without the "
            "planned node ids (plan[].node_id) it refers to",
            entry=entry_ref("spawn", bad),
        )
    return doc, report.as_dict()
