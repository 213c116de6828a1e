"""Rerun from a node (issue 40 item 6): the cut of a checkpoint that a ``--from`` fork replays.

``steerflow resume RUN --from NODE [--instruction TEXT]`` is a fork whose source is the
checkpoint with NODE and everything downstream of it taken out, as if they had never
run. :func:`rerun_cut` makes that cut; the ordinary D5 rules (:func:`plan_replay`) then
apply to it unchanged, so what replays and what runs follows from them:

- NODE, every planned node that depends on it (transitively) and the synthesis (it
  reads every worker) lose their recorded outcome: they run again, paid;
- a spawned node whose emitter runs again is dropped: the emitter asks for it again if
  it still wants it (its escalation retries likewise: the attempt they replaced runs
  again); a spawned node that waits for one of them but whose emitter replays is kept
  as pending intent: it runs again after them;
- everything else is as the source recorded it: a completed node replays (free), a
  failed one needs ``--retry-failed`` exactly as for ``resume --fork``, a pending one
  runs.

An edited instruction replaces NODE's in the plan (the synthesis': in the recorded
``config``) and is recorded in the ``config`` member :data:`EDITED_KEY`, node by node:
``{"original", "instruction", "run_id"}`` (the text it replaced, the text it runs with,
the run it was edited from). That record is carried down the chain with the config; the
node's entry carries it too, covered by its ``result_digest``, and every resume checks
that the three agree (:func:`check_edits`).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from steerflow.checkpoint import CheckpointState, SpawnedEntry
from steerflow.errors import FlowResumeError, UsageError
from steerflow.plan import SYNTHESIS_KEY
from steerflow.resume._digests import check_digests

__all__ = [
    "EDITED_KEY",
    "EDITED_MEMBER",
    "RerunFrom",
    "check_edits",
    "rerun_cut",
    "synthesis_of",
]

#: The checkpoint ``config`` member recording edited instructions, by node.
EDITED_KEY = "edited_instructions"
#: The entry member (covered by its digest) recording the edit its node ran with.
EDITED_MEMBER = "instruction_edited"


@dataclass(frozen=True)
class RerunFrom:
    """A ``--from`` fork: where it starts, what it pays for, what it edited."""

    node: str
    #: Every node the fork runs (and so pays for), in the order of the graph: NODE,
    #: what is downstream of it, and whatever a ``--fork`` resume would run anyway.
    rerun: tuple[str, ...] = ()
    #: ``{"original", "instruction", "run_id"}`` when ``--instruction`` edited NODE.
    edited: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``rerun_from`` member of ``resume --json`` (and ``--dry-run --json``)."""
        return {"node": self.node, "rerun": list(self.rerun), "instruction_edited": self.edited}

    def line(self) -> str:
        """``rerun from b: 3 nodes will run again and be paid for: b, c, synthesis``."""
        count = len(self.rerun)
        noun = "node" if count == 1 else "nodes"
        edited = " (with the edited instruction)" if self.edited else ""
        return (
            f"rerun from {self.node}{edited}: {count} {noun} will run again and be paid "
            f"for: {', '.join(self.rerun) or 'none'}"
        )


def rerun_cut(
    state: CheckpointState,
    node: str,
    *,
    instruction: str | None = None,
    run_id: str | None = None,
) -> tuple[CheckpointState, RerunFrom]:
    """``state`` without NODE and what is downstream of it (see the module docstring).

    ``instruction`` replaces NODE's; ``run_id`` names the source run in the record.

    Raises:
        UsageError: ``node`` names no node of the plan (the message lists them, closest
            first), a spawned node, or ``instruction`` is empty.
        FlowResumeError: an entry of the source does not match its digest (checked
            before anything is cut away, so what a fork drops was faithful too).
    """
    check_digests(state)
    check_edits(state)
    plan = [item for item in state.plan if isinstance(item, dict)]
    synthesis = synthesis_of(state)
    _check_node(state, plan, node, synthesis=synthesis is not None)
    again = _downstream(state.plan, node)
    if synthesis is not None:
        again.add(SYNTHESIS_KEY)
    dropped, pended = _spawned_cut(state, plan, frozenset(again))
    config = copy.deepcopy(state.config)
    edited = None
    if instruction is not None:
        plan_items, edited = _edit(state, node, instruction, config, run_id)
    else:
        plan_items = list(state.plan)
    spawned = [
        _pending(e) if e.node_id in pended else e for e in state.spawned if e.node_id not in dropped
    ]
    doc = dict(state.as_dict())
    doc["plan"] = plan_items
    doc["config"] = config
    doc["ops"] = {k: v for k, v in doc.get("ops", {}).items() if k not in again}
    doc["spawned"] = [dict(e.raw) for e in spawned]
    gone = {("op", k) for k in again} | {("spawn", n) for n in dropped | pended}
    cut = replace(
        state,
        plan=plan_items,
        config=config,
        ops={k: v for k, v in state.ops.items() if k not in again},
        spawned=tuple(spawned),
        doc=doc,
        # A node that runs again starts its tool loop afresh: its old steps are gone.
        steps=tuple(s for s in state.steps if (s.get("record"), s.get("key")) not in gone),
    )
    return cut, RerunFrom(node=node, edited=edited)


def synthesis_of(state: CheckpointState) -> Mapping[str, Any] | None:
    requested = state.config.get("synthesis")
    if isinstance(requested, Mapping) and isinstance(requested.get("instruction"), str):
        return requested
    return None


def _check_node(
    state: CheckpointState, plan: list[dict[str, Any]], node: str, *, synthesis: bool
) -> None:
    """NODE is a planned node or the synthesis; anything else exits 2, naming the ids."""
    known = [str(item.get("agent_id")) for item in plan]
    if synthesis:
        known.append(SYNTHESIS_KEY)
    if node in known:
        return
    for entry in state.spawned:
        if node in (entry.spawn_id, entry.node_id):
            emitter = _emitter_key(state, plan, entry)
            raise UsageError(
                f"--from {node!r} is a spawned node: it exists only because "
                f"{emitter or 'its emitter'} asked for it, so it cannot be rerun on its own; "
                f"rerun from {emitter!r} instead (it asks for its spawns again)"
                if emitter
                else f"--from {node!r} is a spawned node, which cannot be rerun on its own"
            )
    close = difflib.get_close_matches(node, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"--from {node!r} is not a node of this run (its nodes: {', '.join(known)}){hint}"
    )


def _emitter_key(
    state: CheckpointState, plan: list[dict[str, Any]], entry: SpawnedEntry
) -> str | None:
    """The planned node a spawned entry descends from (through spawned emitters)."""
    by_node = state.spawned_by_node()
    planned = {item.get("node_id"): str(item.get("agent_id")) for item in plan}
    seen: set[str] = set()
    current: SpawnedEntry | None = entry
    while current is not None and current.parent_id and current.node_id not in seen:
        seen.add(current.node_id)
        if current.parent_id in planned:
            return planned[current.parent_id]
        current = by_node.get(current.parent_id)
    return None


def _downstream(plan: list[Any], node: str) -> set[str]:
    """NODE and every planned node that depends on it, transitively (by ``dep_indices``)."""
    # Indices count every plan item; one that is not an object is refused by plan_replay.
    items = [item if isinstance(item, dict) else {} for item in plan]
    keys = [str(item.get("agent_id")) for item in items]
    dependents: dict[str, list[str]] = {}
    for key, item in zip(keys, items, strict=True):
        for index in item.get("dep_indices") or ():
            if isinstance(index, int) and 0 <= index < len(keys):
                dependents.setdefault(keys[index], []).append(key)
    again = {node}
    queue = [node]
    while queue:
        for dependent in dependents.get(queue.pop(), ()):
            if dependent not in again:
                again.add(dependent)
                queue.append(dependent)
    return again


def _spawned_cut(
    state: CheckpointState, plan: list[dict[str, Any]], again: frozenset[str]
) -> tuple[set[str], set[str]]:
    """``(dropped, pended)`` node ids: spawns re-requested, and spawns that wait and rerun."""
    planned = {item.get("node_id"): str(item.get("agent_id")) for item in plan}
    key_of = {e.node_id: e.spawn_id or e.node_id for e in state.spawned}
    dropped: set[str] = set()
    pended: set[str] = set()
    changed = True
    while changed:
        changed = False
        rerunning = set(again) | {key_of[n] for n in dropped | pended}
        gone = {key_of[n] for n in dropped}
        for entry in state.spawned:
            if entry.node_id in dropped:
                continue
            parent = entry.parent_id
            deps = entry.depends_on if isinstance(entry.depends_on, list) else []
            if (
                (parent in planned and planned[parent] in again)
                or parent in dropped
                or parent in pended
                or any(d in gone for d in deps)
            ):
                dropped.add(entry.node_id)
                pended.discard(entry.node_id)
                changed = True
            elif entry.node_id not in pended and any(d in rerunning for d in deps):
                pended.add(entry.node_id)
                changed = True
    return dropped, pended


#: What a spawned entry that runs again no longer has: its outcome and what it produced.
_OUTCOME_MEMBERS = ("result_digest", "usage", "spawned_ids", "artifacts", EDITED_MEMBER)


def _pending(entry: SpawnedEntry) -> SpawnedEntry:
    """A spawned entry as the intent it was before it ran (it runs again)."""
    raw = {k: v for k, v in entry.raw.items() if k not in _OUTCOME_MEMBERS}
    raw |= {"status": "pending", "response": None}
    return replace(
        entry, status="pending", response=None, result_digest=None, spawned_ids=None, raw=raw
    )


def _edit(
    state: CheckpointState,
    node: str,
    instruction: str,
    config: dict[str, Any],
    run_id: str | None,
) -> tuple[list[Any], dict[str, str]]:
    """The plan with NODE's instruction replaced (``config`` edited in place)."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise UsageError("--instruction needs a non-empty TEXT")
    plan = list(state.plan)
    if node == SYNTHESIS_KEY:
        synthesis = config["synthesis"]
        original = str(synthesis["instruction"])
        synthesis["instruction"] = instruction
    else:
        index = next(
            i
            for i, item in enumerate(plan)
            if isinstance(item, dict) and item.get("agent_id") == node
        )
        original = str(plan[index].get("instruction"))
        plan[index] = {**plan[index], "instruction": instruction}
    edited = {"original": original, "instruction": instruction, "run_id": run_id or ""}
    recorded = config.get(EDITED_KEY)
    config[EDITED_KEY] = {**(recorded if isinstance(recorded, dict) else {}), node: edited}
    return plan, edited


def check_edits(state: CheckpointState) -> dict[str, dict[str, str]]:
    """The recorded edits, once each agrees with the plan and with its node's entry.

    Raises:
        FlowResumeError: a record is malformed, or the instruction the plan (or the
            synthesis config) holds, or the entry's covered copy, says otherwise.
    """
    recorded = state.config.get(EDITED_KEY, {})
    if not isinstance(recorded, dict):
        raise FlowResumeError(f"the checkpoint's config {EDITED_KEY!r} is not an object")
    instructions = {
        str(item.get("agent_id")): item.get("instruction")
        for item in state.plan
        if isinstance(item, dict)
    }
    synthesis = synthesis_of(state)
    if synthesis is not None:
        instructions[SYNTHESIS_KEY] = synthesis["instruction"]
    out: dict[str, dict[str, str]] = {}
    for key, edit in recorded.items():
        fields = ("original", "instruction", "run_id")
        if not isinstance(edit, dict) or not all(isinstance(edit.get(f), str) for f in fields):
            raise FlowResumeError(f"the recorded edit of node {key!r}'s instruction is malformed")
        if instructions.get(key) != edit["instruction"]:
            raise FlowResumeError(
                f"node {key!r}: the plan's instruction is not the edited one its run recorded "
                f"({EDITED_KEY}), so one of them was changed after it was recorded"
            )
        entry = state.ops.get(key)
        covered = entry.raw.get(EDITED_MEMBER) if entry is not None else None
        if covered is not None and covered != edit:
            raise FlowResumeError(
                f"node {key!r}: its entry's {EDITED_MEMBER} (covered by its result_digest) "
                f"does not match the config's {EDITED_KEY}, so the record was changed"
            )
        out[str(key)] = {f: str(edit[f]) for f in fields}
    for key, entry in state.ops.items():
        if EDITED_MEMBER in entry.raw and key not in out:
            raise FlowResumeError(
                f"node {key!r}: its entry records an edited instruction (covered by its "
                f"result_digest) that the config's {EDITED_KEY} no longer lists"
            )
    return out
