"""Typed checkpoint entries and the one validator both versions use (D4, Amendment 2 §6).

A planned entry (``ops[agent_id]``) and a spawned entry (``spawned[]``) are checked by
:func:`check_entry` wherever they are read: in a version 3 base, in every journal record,
and in a version 2 snapshot.  Readers then work with :class:`PlannedEntry` and
:class:`SpawnedEntry` instead of navigating dicts; each keeps the stored mapping as ``raw``
because the settle check digests the entry exactly as stored.

Version 2 leniency
    Version 2 snapshots were read loosely before this validator existed, and a resume
    answers a bad v2 entry with its own refusal (``resume-refused``) rather than a
    checkpoint-recovery refusal.  :func:`typed_state` with ``lenient=True`` therefore
    keeps what the old reader accepted: an ``ops`` entry may omit ``agent_id`` (its key
    names it) and ``response`` (read as ``null``); an entry the validator still refuses
    is set aside in :attr:`CheckpointState.rejected` with the validator's reason, for the
    caller to refuse.  Strict reading (``lenient=False``, and always for version 3)
    refuses instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ._intents import InFlightCall, in_flight_call

__all__ = [
    "CheckpointState",
    "EntryError",
    "EntryKind",
    "PlannedEntry",
    "PlannedStatus",
    "RejectedEntry",
    "SpawnedEntry",
    "SpawnedStatus",
    "check_entry",
    "entry_ref",
    "planned_entry",
    "spawned_entry",
    "typed_state",
    "unguarded_splice",
]

EntryKind = Literal["op", "spawn"]
PlannedStatus = Literal["completed", "failed"]
SpawnedStatus = Literal["completed", "failed", "pending"]

_OPTIONAL_TEXT = (
    "operation",
    "assignee",
    "instruction",
    "parent_id",
    "spawn_id",
    "escalated_from",
    "model",
)
# Only id-shaped strings are echoed into a report or message: never a value.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class EntryError(ValueError):
    """An entry fails the format rules; ``detail`` says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        #: The ids of the entry at fault, once the reader knows them.
        self.ref: dict[str, Any] | None = None


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def entry_ref(kind: object, entry: object, key: object = None) -> dict[str, Any] | None:
    """The ids naming an entry (``key``: its ``ops`` key), or None if none is readable."""
    fields = entry if isinstance(entry, dict) else {}
    if kind == "op":
        agent_id = _id(fields.get("agent_id")) or _id(key)
        return None if agent_id is None else {"kind": "op", "agent_id": agent_id}
    if kind == "spawn":
        node_id, spawn_id = _id(fields.get("node_id")), _id(fields.get("spawn_id"))
        if node_id is None and spawn_id is None:
            return None
        return {"kind": "spawn", "node_id": node_id, "spawn_id": spawn_id}
    return None


def check_entry(kind: EntryKind, entry: object) -> None:
    """Validate one planned (``op``) or spawned (``spawn``) entry; raise :class:`EntryError`."""
    if not isinstance(entry, dict):
        raise EntryError("entry is not an object")
    key = "agent_id" if kind == "op" else "node_id"
    if not isinstance(entry.get(key), str) or not entry[key]:
        raise EntryError(f"{key} missing or not a string")
    if "response" not in entry:
        raise EntryError("response missing")
    status = entry.get("status")
    allowed = ("completed", "failed") if kind == "op" else ("completed", "failed", "pending")
    if status not in allowed:
        shown = repr(status) if status is None or _id(status) else "(not a status)"
        nor = "" if kind == "op" else ", nor pending"
        raise EntryError(f"unsupported status {shown}: not completed or failed{nor}")
    if status == "pending" and entry["response"] is not None:
        raise EntryError("a pending entry carries a response")
    digest = entry.get("result_digest")
    if digest is not None and not isinstance(digest, str):
        raise EntryError("result_digest is not a string")
    if "spawned_ids" in entry:
        ids = entry["spawned_ids"]
        if (
            not isinstance(ids, list)
            or not all(isinstance(i, str) and i for i in ids)
            or len(set(ids)) != len(ids)
        ):
            raise EntryError("spawned_ids is not a list of distinct node ids")
    if kind == "spawn":
        for name in _OPTIONAL_TEXT:
            if entry.get(name) is not None and not isinstance(entry[name], str):
                raise EntryError(f"{name} is not a string or null")


def _ids(raw: Mapping[str, Any], name: str) -> tuple[str, ...] | None:
    value = raw.get(name)
    return None if value is None else tuple(value)


@dataclass(frozen=True)
class PlannedEntry:
    """``ops[agent_id]``: a planned node's recorded outcome."""

    agent_id: str
    status: PlannedStatus
    response: object
    result_digest: str | None
    #: The node ids of the spawns it accepted; None when the member is absent (older files).
    spawned_ids: tuple[str, ...] | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class SpawnedEntry:
    """``spawned[]``: a spawned node's outcome, or its ``pending`` intent."""

    node_id: str
    status: SpawnedStatus
    response: object
    operation: str | None
    assignee: str | None
    instruction: str | None
    parent_id: str | None
    spawn_id: str | None
    #: As stored: the leg keys it waits for, or None (the emitter alone).  Its shape is a
    #: resume rule (D5), not a format rule, so it is not checked here.
    depends_on: object
    result_digest: str | None
    spawned_ids: tuple[str, ...] | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    #: An escalation retry's splice witness: the node id of the logical operation it
    #: retries (its ``parent_id`` is the attempt it replaces), and the model it runs at.
    escalated_from: str | None = None
    model: str | None = None

    @property
    def name(self) -> str:
        """How messages name it: its spawn id, else its node id."""
        return f"spawned node {self.spawn_id or self.node_id!r}"


def planned_entry(raw: object) -> PlannedEntry:
    """Validate and type one planned entry (raise :class:`EntryError`)."""
    check_entry("op", raw)
    entry = cast(dict[str, Any], raw)
    return PlannedEntry(
        agent_id=entry["agent_id"],
        status=entry["status"],
        response=entry["response"],
        result_digest=entry.get("result_digest"),
        spawned_ids=_ids(entry, "spawned_ids"),
        raw=entry,
    )


def spawned_entry(raw: object) -> SpawnedEntry:
    """Validate and type one spawned entry (raise :class:`EntryError`)."""
    check_entry("spawn", raw)
    entry = cast(dict[str, Any], raw)
    return SpawnedEntry(
        node_id=entry["node_id"],
        status=entry["status"],
        response=entry["response"],
        operation=entry.get("operation"),
        assignee=entry.get("assignee"),
        instruction=entry.get("instruction"),
        parent_id=entry.get("parent_id"),
        spawn_id=entry.get("spawn_id"),
        depends_on=entry.get("depends_on"),
        result_digest=entry.get("result_digest"),
        spawned_ids=_ids(entry, "spawned_ids"),
        raw=entry,
        escalated_from=entry.get("escalated_from"),
        model=entry.get("model"),
    )


def unguarded_splice(plan: object, spawned: object) -> object | None:
    """The first spawned entry carrying a splice witness the plan does not guard, or None.

    A splice witness (``escalated_from``) is only meaningful against planned node ids
    (``plan[].node_id``) in the same snapshot (Amendment 3 item 5); without them it
    would be read as an ordinary edge.
    """
    if not isinstance(spawned, list):
        return None
    witnessed = [e for e in spawned if isinstance(e, dict) and e.get("escalated_from") is not None]
    if not witnessed:
        return None
    items = plan if isinstance(plan, list) else []
    if items and all(isinstance(i, dict) and isinstance(i.get("node_id"), str) for i in items):
        return None
    return witnessed[0]


@dataclass(frozen=True)
class RejectedEntry:
    """A version 2 entry a lenient read set aside: which one, and why."""

    kind: EntryKind
    ref: dict[str, Any] | None
    detail: str


@dataclass(frozen=True)
class CheckpointState:
    """The logical checkpoint: typed entries over the D4 dict it was read from.

    :meth:`as_dict` is that dict (CONTRACT §9's ``state``), unchanged.
    """

    version: int
    generation: str | None
    session_id: str
    prompt: str
    plan: list[Any]
    flow_context: dict[str, Any]
    ops: dict[str, PlannedEntry]
    spawned: tuple[SpawnedEntry, ...]
    config: dict[str, Any]
    max_spawn: int | None
    rejected: tuple[RejectedEntry, ...] = ()
    doc: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: Call intents no outcome closed (version 3 only; already checked by the loader):
    #: calls that left the process and may have been paid (decision 217).
    in_flight: tuple[InFlightCall, ...] = ()
    #: The steps of tool nodes' loops, node by node, each node's in order (version 3
    #: only; already checked by the loader: decision 254).
    steps: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The logical checkpoint in the D4 shape, as :func:`load_checkpoint` returns it."""
        return self.doc

    def spawned_by_node(self) -> dict[str, SpawnedEntry]:
        """Spawned entries by node id."""
        return {entry.node_id: entry for entry in self.spawned}


def _lenient_op(key: str, raw: object) -> object:
    if not isinstance(raw, dict):
        return raw
    return {"agent_id": key, "response": None, **raw}


def typed_state(doc: dict[str, Any], *, lenient: bool) -> CheckpointState:
    """Type a loaded D4 document whose containers are already checked.

    Raises:
        EntryError: an entry fails :func:`check_entry` and ``lenient`` is False; its
            ``ref`` attribute names the entry.
    """
    ops: dict[str, PlannedEntry] = {}
    spawned: list[SpawnedEntry] = []
    rejected: list[RejectedEntry] = []
    for key, raw in doc["ops"].items():
        try:
            ops[key] = planned_entry(_lenient_op(key, raw) if lenient else raw)
        except EntryError as bad:
            ref = entry_ref("op", {}, key)
            if not lenient:
                raise _named(bad, ref) from None
            rejected.append(RejectedEntry("op", ref, bad.detail))
    seen: set[str] = set()
    for index, raw in enumerate(doc["spawned"]):
        try:
            entry = spawned_entry(raw)
            if not lenient and entry.node_id in seen:
                raise EntryError("a spawned node_id repeats")
            seen.add(entry.node_id)
            spawned.append(entry)
        except EntryError as bad:
            ref = entry_ref("spawn", raw) or {"kind": "spawn", "index": index}
            if not lenient:
                raise _named(bad, ref) from None
            rejected.append(RejectedEntry("spawn", ref, bad.detail))
    max_spawn = doc.get("max_spawn")
    return CheckpointState(
        version=doc["version"],
        generation=doc.get("generation"),
        session_id=doc["session_id"],
        prompt=doc["prompt"],
        plan=doc["plan"],
        flow_context=doc["flow_context"],
        ops=ops,
        spawned=tuple(spawned),
        config=doc["config"],
        max_spawn=max_spawn if isinstance(max_spawn, int) else None,
        rejected=tuple(rejected),
        doc=doc,
        # Only a version 3 or 4 loader checks (and writes) intents.
        in_flight=tuple(
            in_flight_call(raw) for raw in (doc.get("in_flight", ()) if doc["version"] >= 3 else ())
        ),
        steps=tuple(doc.get("steps", ())) if doc["version"] >= 3 else (),
    )


def _named(bad: EntryError, ref: dict[str, Any] | None) -> EntryError:
    bad.ref = ref
    return bad
