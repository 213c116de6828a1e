"""D5 and the Amendment 1 settle check: what a faithful resume replays, or a refusal.

:func:`plan_replay` checks a loaded checkpoint against every resume rule before any graph
exists and returns a pure :class:`ReplayPlan` (no executor types); ``orchestrate`` only
applies it to a graph.  One bad entry refuses the whole resume, naming the node.

Rules, in the order they are checked:

1. planned entries: recorded in the plan; ``completed`` passes the settle check (its
   ``result_digest``); ``failed`` needs ``--retry-failed``;
2. spawn intent (``pending``) under an emitter whose own outcome was never recorded is
   dropped (Amendment 3): the emitter runs again and requests it again;
3. spawned entries: the format validator's verdict on a leniently read v2 entry; a unique
   node id; an ``operation`` to rebuild from; a valid, unused ``spawn_id`` (required with
   an ``assignee``); a parent that is terminal or another spawned entry; ``failed`` needs
   ``--retry-failed``; ``completed`` passes the settle check; dependencies that exist;
4. witnesses: every child an emitter's ``spawned_ids`` lists has an entry;
5. the spawned entries form no cycle (they are returned in topological order);
6. artifacts (Amendment 1 rows 2, 7, 9): every completed node that recorded artifacts is
   checked against the contract its run persisted (``contract``, read by the caller from
   the state DB and checked against the checkpoint's copy) and its files are compared
   byte for byte under that contract's root; a mismatch refuses the resume
   (``ArtifactsUnsettledError``) unless ``rerun_unsettled``, which runs those nodes and
   everything downstream of them again instead;
7. degraded context: a node that will run and inherits a replayed conversation whose
   branch file is lost needs ``--allow-degraded-context``.

Escalation chains (Amendment 3 item 4): a spawned entry with ``escalated_from`` is a
retry spliced after its ``parent_id`` (the attempt it replaces). Its chain must be
rebuildable (:func:`_check_chains`) or the resume is refused naming the entry; a failed
attempt a recorded retry replaced is replayed as failed (it needs no
``--retry-failed`` and never runs again), and pending retry intent whose anchor never
recorded its outcome is dropped like other unanchored intent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from steerflow.artifacts import ArtifactContract, ArtifactRecord, Unsettled
from steerflow.checkpoint import (
    CheckpointState,
    PlannedEntry,
    SpawnedEntry,
    load_branch,
)
from steerflow.errors import FlowResumeError, PlanValidationError
from steerflow.plan import (
    SYNTHESIS_KEY,
    PlanEntry,
    PlanFile,
    is_agent_id,
    plan_from_checkpoint,
)
from steerflow.providers import Message
from steerflow.resume._digests import check_digests
from steerflow.resume._from import RerunFrom, check_edits, synthesis_of
from steerflow.resume._settle import settle_replay

__all__ = ["ReplayPlan", "ReplaySpawn", "paid_nodes", "plan_replay"]

_TERMINAL = ("completed", "failed")


@dataclass(frozen=True)
class ReplaySpawn:
    """A spawned node to rebuild: replayed if ``completed``, else run again."""

    node_id: str
    spawn_id: str
    status: str
    response: object
    instruction: str
    assignee: str | None
    parent_id: str | None
    #: The leg key of the emitter ``parent_id`` names, if it is a node of the plan or a
    #: recorded spawn.
    parent_key: str | None
    depends_on: tuple[str, ...]
    spawned_ids: tuple[str, ...]
    #: An escalation retry: the leg key of the logical operation it retries, its
    #: attempt number and the model it runs at.
    escalated_from_key: str | None = None
    escalation: int = 0
    model: str | None = None
    #: A failed attempt a recorded retry replaced: replayed as failed, never run again.
    superseded: bool = False


@dataclass(frozen=True)
class ReplayPlan:
    """Everything a resumed graph needs from the source checkpoint, checked."""

    plan: PlanFile
    #: Planned leg key -> recorded response, for every completed planned node.
    completed: dict[str, object]
    #: Planned leg key -> node ids its spawns had (completed planned nodes only).
    witnesses: dict[str, tuple[str, ...]]
    #: Failed planned nodes that run again (``--retry-failed``).
    rerun: tuple[str, ...]
    #: Spawned nodes in dependency order.
    spawned: tuple[ReplaySpawn, ...]
    #: Restored conversations by leg key (replayed nodes whose branch file was readable).
    branches: dict[str, list[Message]]
    #: Nodes that run with an empty branch instead of a lost inherited one.
    degraded: tuple[str, ...]
    notes: tuple[str, ...]
    #: The contract the source run persisted (checked), or None for a run without one.
    contract: ArtifactContract | None = None
    #: Recorded artifacts of each replayed leg that recorded any (all settled).
    artifacts: dict[str, tuple[ArtifactRecord, ...]] = field(default_factory=dict)
    #: Recorded artifacts that no longer match (only with ``rerun_unsettled``).
    unsettled: tuple[Unsettled, ...] = ()
    #: Completed nodes that run again under ``--rerun-unsettled``: the unsettled ones and
    #: everything downstream of them.
    rerun_unsettled: tuple[str, ...] = ()
    #: Planned leg key -> recorded (failed) response of each planned attempt an
    #: escalation retry replaced.
    superseded: dict[str, object] = field(default_factory=dict)
    #: Leg key -> the ``usage`` its replayed entry recorded (what that call cost once).
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Node -> ``{original, instruction, run_id}``: instructions a ``--from`` fork of the
    #: chain edited (checked against the plan and the entries' covered copies).
    edited: dict[str, dict[str, str]] = field(default_factory=dict)
    #: ``resume --from NODE``: where the fork starts and what it pays for.
    rerun_from: RerunFrom | None = None
    #: Leg key -> the ``output`` its replayed completed entry recorded (a typed node's).
    outputs: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class _Ids:
    """Lookups the spawned rules share."""

    plan_ids: dict[str, str]  # planned node id -> leg key
    planned_keys: frozenset[str]
    node_ids: frozenset[str]  # recorded spawned node ids (after dropping intent)
    spawn_ids: frozenset[str | None]


def plan_replay(
    state: CheckpointState,
    run_dir: Path,
    *,
    retry_failed: bool = False,
    allow_degraded_context: bool = False,
    contract: ArtifactContract | None = None,
    rerun_unsettled: bool = False,
    spawn_id_of: Callable[[str], str | None] | None = None,
) -> ReplayPlan:
    """Check ``state`` (the checkpoint in ``run_dir``) and describe its faithful replay.

    ``contract`` is the artifact contract the source run persisted (see
    :func:`steerflow.artifacts.source_contract`); None means it has none, so any node
    that recorded artifacts refuses the resume.  Recorded files are read here (whole),
    before the caller writes anything.  ``spawn_id_of`` names a spawned node by the
    spawn id its run published for a node id (the state DB's node rows); it is asked
    only for a refusal about a child whose entry is lost (none: the node id alone).

    Raises:
        FlowResumeError: a D5 rule refuses the resume; the message names the node.
        ArtifactContractError: a node recorded artifacts the contract cannot vouch for.
        ArtifactsUnsettledError: recorded artifacts no longer match and not
            ``rerun_unsettled``; the message names node, path, expected and found.
    """
    plan = _rebuild_plan(state, run_dir)
    check_digests(state)
    edited = check_edits(state)
    checked = _check_recorded(state, plan, retry_failed=retry_failed, spawn_id_of=spawn_id_of)
    completed, rerun, spawned = checked.completed, checked.rerun, checked.spawned
    notes, superseded, planned_keys = checked.notes, checked.superseded, checked.planned_keys
    replayed = [*completed, *(s.spawn_id for s in spawned if s.status == "completed")]
    settled = settle_replay(
        state,
        plan,
        contract,
        replayed,
        {s.spawn_id: s.depends_on for s in spawned},
        rerun=rerun_unsettled,
    )
    if settled.rerun:
        again = frozenset(settled.rerun)
        completed = {k: v for k, v in completed.items() if k not in again}
        # A rebuilt spawn that runs again is pending intent, exactly as if never run.
        spawned = [replace(s, status="pending") if s.spawn_id in again else s for s in spawned]
        replayed = [k for k in replayed if k not in again]
    completed = _replayable_synthesis(state, completed, rerun, spawned, settled.rerun)
    notes += settled.notes
    branches = {
        key: branch for key in replayed if (branch := load_branch(run_dir, key)) is not None
    }
    degraded = _degraded(plan.plan, completed, spawned, branches, planned_keys)
    if degraded and not allow_degraded_context:
        raise FlowResumeError(
            "these nodes inherit a conversation that the checkpoint cannot restore: "
            + ", ".join(degraded)
            + ". Pass --allow-degraded-context to run them with an empty branch"
        )
    return ReplayPlan(
        plan=plan,
        completed=completed,
        witnesses={key: state.ops[key].spawned_ids or () for key in completed},
        rerun=tuple(rerun),
        spawned=tuple(spawned),
        branches=branches,
        degraded=tuple(degraded),
        notes=tuple(notes),
        contract=contract,
        artifacts=settled.artifacts,
        unsettled=settled.unsettled,
        rerun_unsettled=settled.rerun,
        superseded=superseded,
        usage=_recorded_usage(state, [*completed, *superseded], spawned),
        edited=edited,
        outputs=_recorded_outputs(state, list(completed), spawned),
    )


@dataclass(frozen=True)
class _Checked:
    """What the D5 rules accepted from a checkpoint, before the settle check."""

    completed: dict[str, object]
    rerun: list[str]
    spawned: list[ReplaySpawn]
    notes: list[str]
    superseded: dict[str, object]
    planned_keys: frozenset[str]


def _check_recorded(
    state: CheckpointState,
    plan: PlanFile,
    *,
    retry_failed: bool,
    spawn_id_of: Callable[[str], str | None] | None = None,
) -> _Checked:
    """The planned and spawned rules of :func:`plan_replay`, in its order (D5).

    Raises:
        FlowResumeError: a rule refuses the resume; the message names the node.
    """
    plan_ids = {
        item["node_id"]: item["agent_id"]
        for item in state.plan
        if isinstance(item, dict) and isinstance(item.get("node_id"), str)
    }
    planned_keys = frozenset(e.agent_id for e in plan.plan)
    kept, notes = _drop_unanchored_intent(state.spawned, plan_ids, state.ops)
    chains = _check_chains(kept, plan_ids, state)
    replaced = frozenset(e.parent_id for e in kept if e.node_id in chains and e.parent_id)
    planned_ids = {key: node_id for node_id, key in plan_ids.items()}
    superseded = {
        key: entry.response
        for key, entry in state.ops.items()
        if entry.status == "failed" and planned_ids.get(key) in replaced
    }
    completed, rerun = _check_planned(
        state, planned_keys, retry_failed=retry_failed, superseded=frozenset(superseded)
    )
    _refuse_rejected_spawns(state)
    ids = _Ids(
        plan_ids,
        planned_keys,
        frozenset(e.node_id for e in kept),
        frozenset(e.spawn_id for e in kept),
    )
    spawned = _check_spawned(
        kept, ids, state, retry_failed=retry_failed, chains=chains, replaced=replaced
    )
    _check_witnesses(state.ops, kept, state.spawned, plan_ids, spawn_id_of)
    return _Checked(completed, rerun, spawned, notes, superseded, planned_keys)


def _recorded_usage(
    state: CheckpointState, planned: list[str], spawned: list[ReplaySpawn]
) -> dict[str, dict[str, Any]]:
    """The recorded ``usage`` of every entry the resume replays (and so keeps)."""
    raw = {key: entry.raw for key, entry in state.ops.items()}
    raw |= {entry.spawn_id or entry.node_id: entry.raw for entry in state.spawned}
    keys = [*planned, *(s.spawn_id for s in spawned if s.status == "completed" or s.superseded)]
    return {key: used for key in keys if isinstance(used := raw.get(key, {}).get("usage"), dict)}


def _recorded_outputs(
    state: CheckpointState, planned: list[str], spawned: list[ReplaySpawn]
) -> dict[str, object]:
    """The recorded ``output`` of every completed entry the resume replays."""
    raw = {key: entry.raw for key, entry in state.ops.items()}
    raw |= {entry.spawn_id or entry.node_id: entry.raw for entry in state.spawned}
    keys = [*planned, *(s.spawn_id for s in spawned if s.status == "completed")]
    return {key: raw[key]["output"] for key in keys if "output" in raw.get(key, {})}


def _is_synthesis(state: CheckpointState, key: str) -> bool:
    """True for the entry of the synthesis the checkpoint's ``config`` requests."""
    requested = state.config.get("synthesis")
    return (
        key == SYNTHESIS_KEY
        and isinstance(requested, Mapping)
        and isinstance(requested.get("instruction"), str)
    )


def _replayable_synthesis(
    state: CheckpointState,
    completed: dict[str, object],
    rerun: Sequence[str],
    spawned: Sequence[ReplaySpawn],
    unsettled: Sequence[str],
) -> dict[str, object]:
    """``completed`` without a recorded synthesis whose inputs will change.

    The synthesis received every worker's result: replaying it is faithful only when no
    worker runs again (``--retry-failed``, ``--rerun-unsettled``, rebuilt pending or failed
    spawns). Otherwise it runs again after them, over the new results.
    """
    if not _is_synthesis(state, SYNTHESIS_KEY) or SYNTHESIS_KEY not in completed:
        return completed
    again = [k for k in rerun if k != SYNTHESIS_KEY] + list(unsettled)
    again += [
        s.spawn_id
        for s in spawned
        if s.status != "completed" and not getattr(s, "superseded", False)
    ]
    if not again:
        return completed
    return {k: v for k, v in completed.items() if k != SYNTHESIS_KEY}


def _rebuild_plan(state: CheckpointState, run_dir: Path) -> PlanFile:
    if not state.plan:
        raise FlowResumeError(
            f"checkpoint of run {run_dir.name} has an empty plan: nothing to replay"
        )
    source = f"checkpoint {str(run_dir / 'checkpoint.json')!r}"
    try:
        return plan_from_checkpoint(state.plan, source=source)
    except PlanValidationError as exc:
        raise FlowResumeError(f"the checkpoint's plan cannot be rebuilt: {exc}") from None


def _check_planned(
    state: CheckpointState,
    planned_keys: frozenset[str],
    *,
    retry_failed: bool,
    superseded: frozenset[str] = frozenset(),
) -> tuple[dict[str, object], list[str]]:
    """Completed planned nodes (settle-checked) and failed ones to run again."""
    rejected = {r.ref["agent_id"]: r.detail for r in state.rejected if r.kind == "op" and r.ref}
    completed: dict[str, object] = {}
    rerun: list[str] = []
    for key in state.as_dict()["ops"]:
        entry = state.ops.get(key)
        if key not in planned_keys and not _is_synthesis(state, key):
            raise FlowResumeError(f"checkpoint records node {key!r}, which is not in its plan")
        if entry is None:
            raise FlowResumeError(f"node {key!r}: {rejected.get(key, 'malformed entry')}")
        if entry.status == "completed":
            completed[key] = entry.response
        elif key in superseded:
            pass  # replayed as recorded
        elif not retry_failed:
            raise FlowResumeError(
                f"node {key!r} failed in the recorded run; resuming would skip it and "
                "everything after it. Re-run it with --retry-failed (this repeats its "
                "side effects)"
            )
        else:
            rerun.append(key)
    return completed, rerun


def _drop_unanchored_intent(
    spawned: tuple[SpawnedEntry, ...],
    plan_ids: Mapping[str, str],
    ops: Mapping[str, PlannedEntry],
) -> tuple[list[SpawnedEntry], list[str]]:
    """Drop ``pending`` spawned entries whose emitter's own outcome was never recorded.

    Spawn intent is recorded before the emitter's outcome, so a kill in between leaves
    pending children under an emitter that will run again and emit them again. They were
    never invoked, so dropping them loses no work; keeping them would duplicate the spawn.
    """
    dropped: set[str] = set()
    notes: list[str] = []
    pending = {e.node_id for e in spawned if e.status == "pending"}
    changed = True
    while changed:
        changed = False
        for entry in spawned:
            if entry.status != "pending" or entry.node_id in dropped:
                continue
            parent = entry.parent_id
            parent_key = plan_ids.get(parent) if parent is not None else None
            # An escalation retry is emitted by its anchor's failure: an anchor still
            # pending never recorded one, and will escalate again if it fails.
            retry_of_pending = entry.escalated_from is not None and parent in pending
            if (
                (parent_key is not None and parent_key not in ops)
                or parent in dropped
                or retry_of_pending
            ):
                dropped.add(entry.node_id)
                changed = True
                notes.append(
                    f"spawn intent {entry.spawn_id!r} dropped: its emitter's outcome was "
                    "not recorded, so the emitter runs again and will request it again"
                )
    return [e for e in spawned if e.node_id not in dropped], notes


def _refuse_rejected_spawns(state: CheckpointState) -> None:
    """A leniently read v2 spawned entry that fails the format validator."""
    for rejected in state.rejected:
        if rejected.kind == "spawn":
            ref = rejected.ref or {}
            name = ref.get("spawn_id") or ref.get("node_id")
            where = f"spawned node {name!r}" if name else f"spawned[{ref.get('index')}]"
            raise FlowResumeError(f"{where}: {rejected.detail}")


def _check_spawned(
    entries: list[SpawnedEntry],
    ids: _Ids,
    state: CheckpointState,
    *,
    retry_failed: bool,
    chains: Mapping[str, _Chain] | None = None,
    replaced: frozenset[str] = frozenset(),
) -> list[ReplaySpawn]:
    """Check every spawned entry before rebuilding any; one bad entry refuses the resume."""
    out: list[ReplaySpawn] = []
    seen_nodes: set[str] = set()
    seen_keys: set[str] = set()
    for entry in entries:
        if entry.node_id in seen_nodes:
            raise FlowResumeError(f"{entry.name}: node id {entry.node_id!r} is recorded twice")
        seen_nodes.add(entry.node_id)
        spawn_id = _check_identity(entry, ids, seen_keys)
        seen_keys.add(spawn_id)
        _check_parent(entry, ids, state.ops)
        superseded = entry.status == "failed" and entry.node_id in replaced
        if entry.status == "failed" and not retry_failed and not superseded:
            raise FlowResumeError(
                f"{entry.name} failed in the recorded run; resuming would skip it and "
                "everything after it. Re-run it with --retry-failed (this repeats its "
                "side effects)"
            )
        chain = (chains or {}).get(entry.node_id)
        out.append(
            ReplaySpawn(
                node_id=entry.node_id,
                spawn_id=spawn_id,
                status=entry.status,
                response=entry.response,
                instruction=str(entry.instruction or entry.operation),
                assignee=entry.assignee,
                parent_id=entry.parent_id,
                parent_key=_key_of(entry.parent_id, ids.plan_ids, state.spawned),
                depends_on=_dependencies(entry, ids, entries),
                spawned_ids=entry.spawned_ids or (),
                escalated_from_key=chain.root_key if chain else None,
                escalation=chain.step if chain else 0,
                model=chain.model if chain else None,
                superseded=superseded,
            )
        )
    return _topological(out)


@dataclass(frozen=True)
class _Chain:
    """A recorded escalation retry, checked: its root's leg key, attempt N, model."""

    root_key: str
    step: int
    model: str


_ESCALATION_KEY = re.compile(r"\.esc([1-9][0-9]*)\Z")


def _check_chains(
    entries: list[SpawnedEntry], plan_ids: Mapping[str, str], state: CheckpointState
) -> dict[str, _Chain]:
    """Every recorded escalation retry, by node id, once its whole chain is rebuildable.

    Its logical operation (``escalated_from``) must be a first attempt with a recorded
    failure; its anchor (``parent_id``) that operation or an earlier retry of the same
    chain, recorded failed, replaced by no other retry; its spawn id
    ``<agent_id>.esc<N>`` one step after its anchor; and its model known (recorded, or
    the ladder its role recorded). Anything else refuses the resume naming the entry.
    """
    by_node = {e.node_id: e for e in entries}
    retries = [e for e in entries if e.escalated_from is not None]
    chains: dict[str, _Chain] = {}
    anchors: dict[str, str] = {}

    def refuse(entry: SpawnedEntry, why: str) -> FlowResumeError:
        return FlowResumeError(f"{entry.name}: its escalation chain cannot be rebuilt: {why}")

    _refuse_attempts_without_witness(entries)

    def step_of(entry: SpawnedEntry, root_key: str) -> int:
        match = _ESCALATION_KEY.search(entry.spawn_id or "")
        if match is None or entry.spawn_id != f"{root_key}.esc{match.group(1)}":
            raise refuse(entry, f"spawn_id {entry.spawn_id!r} is not {root_key}.esc<N>")
        return int(match.group(1))

    for entry in retries:
        root_id = str(entry.escalated_from)
        root_key = plan_ids.get(root_id)
        if root_key is not None:
            root_op = state.ops.get(root_key)
            root_failed = root_op is not None and root_op.status == "failed"
        else:
            root = by_node.get(root_id)
            root_key = root.spawn_id if root is not None else None
            root_failed = (
                root is not None and root.status == "failed" and root.escalated_from is None
            )
        if root_key is None or not root_failed:
            raise refuse(
                entry,
                f"its logical operation {root_id!r} has no recorded failed first attempt",
            )
        step = step_of(entry, root_key)
        attempt = _recorded_attempt(entry)
        if attempt is not None and attempt != step:
            raise refuse(entry, f"it records attempt {attempt} but its spawn_id is attempt {step}")
        anchor = entry.parent_id
        if anchor == root_id:
            anchor_step = 0
        else:
            earlier = by_node.get(anchor or "")
            if earlier is None or earlier.escalated_from != root_id:
                raise refuse(
                    entry, f"its anchor {anchor!r} is neither {root_key!r} nor a retry of it"
                )
            if earlier.status != "failed":
                raise refuse(entry, f"its anchor {earlier.spawn_id!r} has no recorded failure")
            anchor_step = step_of(earlier, root_key)
        if step != anchor_step + 1:
            raise refuse(entry, f"attempt {step} cannot follow attempt {anchor_step}")
        if anchor in anchors:
            raise refuse(entry, f"its anchor is already replaced by {anchors[anchor]!r}")
        anchors[str(anchor)] = str(entry.spawn_id)
        model = entry.model or _ladder_model(state.config, entry.assignee, step)
        if model is None:
            raise refuse(entry, f"no model recorded for attempt {step}")
        chains[entry.node_id] = _Chain(root_key, step, model)
    return chains


def _refuse_attempts_without_witness(entries: list[SpawnedEntry]) -> None:
    """An entry with an attempt number is a retry: it must name the operation it retries.

    Without the witness it would replay as an ordinary spawn under a failed parent, which
    would then need --retry-failed and be paid for again.
    """
    for entry in entries:
        attempt = _recorded_attempt(entry)
        if attempt is not None and entry.escalated_from is None:
            raise FlowResumeError(
                f"{entry.name}: its escalation chain cannot be rebuilt: it records escalation "
                f"attempt {attempt} but not the operation it retries (escalated_from is missing)"
            )


def _recorded_attempt(entry: SpawnedEntry) -> int | None:
    """The entry's ``escalation`` member (a retry's attempt number), if it has one.

    Raises:
        FlowResumeError: the member is not a positive integer.
    """
    if "escalation" not in entry.raw:
        return None  # entries from before the member: the spawn id alone says it
    attempt = entry.raw["escalation"]
    if type(attempt) is not int or attempt < 1:
        raise FlowResumeError(
            f"{entry.name}: its escalation chain cannot be rebuilt: escalation "
            f"{str(attempt)[:40]!r} is not an attempt number"
        )
    return attempt


def _ladder_model(config: Mapping[str, Any], assignee: str | None, step: int) -> str | None:
    """Attempt ``step``'s model from the role ladder the run recorded (older entries)."""
    roles = config.get("roles")
    role = roles.get(assignee or "") if isinstance(roles, dict) else None
    ladder = role.get("escalation") if isinstance(role, dict) else None
    if isinstance(ladder, list) and 0 < step <= len(ladder) and isinstance(ladder[step - 1], str):
        return str(ladder[step - 1])
    return None


def _check_identity(entry: SpawnedEntry, ids: _Ids, seen_keys: set[str]) -> str:
    """What the entry is rebuilt from and as: its operation and its unused leg key."""
    if not entry.operation:
        raise FlowResumeError(f"{entry.name}: no 'operation' recorded, nothing to rebuild it from")
    spawn_id = entry.spawn_id
    if entry.assignee is not None and not spawn_id:
        raise FlowResumeError(f"{entry.name}: has an assignee but no spawn_id")
    if spawn_id is None or not is_agent_id(spawn_id):
        raise FlowResumeError(f"{entry.name}: spawn_id {spawn_id!r} is not a valid leg key")
    if spawn_id in ids.planned_keys or spawn_id in seen_keys:
        raise FlowResumeError(
            f"{entry.name}: spawn_id {spawn_id!r} is already used by another node, so the "
            "recorded topology cannot be rebuilt"
        )
    return spawn_id


def _check_parent(entry: SpawnedEntry, ids: _Ids, ops: Mapping[str, PlannedEntry]) -> None:
    parent = entry.parent_id
    if parent is None:
        return
    parent_key = ids.plan_ids.get(parent)
    planned = ops.get(parent_key) if parent_key is not None else None
    if planned is None and parent not in ids.node_ids:
        raise FlowResumeError(
            f"{entry.name}: parent {parent!r} is neither terminal in the checkpoint nor "
            "another spawned entry"
        )


def _dependencies(entry: SpawnedEntry, ids: _Ids, entries: list[SpawnedEntry]) -> tuple[str, ...]:
    deps = entry.depends_on
    if deps is None:
        parent = entry.parent_id
        deps = [ids.plan_ids.get(parent) or _spawn_of(entries, parent)] if parent else []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise FlowResumeError(f"{entry.name}: depends_on is not a list of ids")
    for dep in deps:
        if dep not in ids.plan_ids.values() and dep not in ids.spawn_ids:
            raise FlowResumeError(f"{entry.name}: depends on unknown node {dep!r}")
    return tuple(deps)


def _spawn_of(entries: Iterable[SpawnedEntry], node_id: str | None) -> str:
    for entry in entries:
        if entry.node_id == node_id:
            return str(entry.spawn_id)
    return ""


def _key_of(
    parent_id: str | None, plan_ids: Mapping[str, str], spawned: Iterable[SpawnedEntry]
) -> str | None:
    if parent_id is None:
        return None
    return plan_ids.get(parent_id) or _spawn_of(spawned, parent_id) or None


def _check_witnesses(
    ops: Mapping[str, PlannedEntry],
    spawned: list[SpawnedEntry],
    every: Iterable[SpawnedEntry] = (),
    plan_ids: Mapping[str, str] | None = None,
    spawn_id_of: Callable[[str], str | None] | None = None,
) -> None:
    """Every child an emitter's entry lists must have an entry of its own.

    An emitter records its accepted spawns' node ids (``spawned_ids``); a listed child
    with no entry was lost (a deleted spawned entry or pending intent), and replaying
    the emitter would finish the flow without ever running it.  Entries without the
    member (older checkpoints) are not checked.  The refusal names the child by its
    spawn id: ``spawn_id_of`` (what the run published) for a lost entry; a child whose
    entry ``every`` still holds but that was dropped as another node's unanchored intent
    names a parent that is not its emitter's (a changed ``parent_id``), and says so.
    """
    recorded = {e.node_id for e in spawned}
    kept_back = {e.node_id: e for e in every}
    emitters: list[tuple[str, PlannedEntry | SpawnedEntry]] = [
        (f"node {key!r}", e) for key, e in ops.items()
    ]
    emitters += [(e.name, e) for e in spawned]
    for where, entry in emitters:
        for child in entry.spawned_ids or ():
            if child in recorded:
                continue
            lists = f"{where} lists it among its spawns (spawned_ids)"
            dropped = kept_back.get(child)
            if dropped is not None:
                raise FlowResumeError(
                    f"{dropped.name} (node_id {child!r}): its entry exists but names parent "
                    f"{_parent_name(dropped.parent_id, plan_ids or {}, kept_back)}, whose "
                    "outcome is not recorded, so it reads as that node's spawn intent and is "
                    f"dropped; yet {lists}: its parent_id was changed after it was recorded, "
                    "and resuming would never run it"
                )
            name = spawn_id_of(child) if spawn_id_of is not None else None
            who = (
                f"spawned node {name!r} (node_id {child!r})"
                if name
                else f"a spawned node of unknown spawn_id (node_id {child!r})"
            )
            raise FlowResumeError(
                f"{who} has no entry in the checkpoint (its spawned entry or pending intent "
                f"is missing), yet {lists}; resuming would finish the flow without ever "
                "running it"
            )


def _parent_name(
    parent: str | None, plan_ids: Mapping[str, str], spawned: Mapping[str, SpawnedEntry]
) -> str:
    """``'<node id>' (node 'b')``: a dropped entry's parent, a planned or spawned node."""
    key = plan_ids.get(parent or "")
    entry = spawned.get(parent or "")
    what = f"node {key!r}" if key is not None else entry.name if entry else "unknown"
    return f"{parent!r} ({what})"


def _topological(entries: list[ReplaySpawn]) -> list[ReplaySpawn]:
    by_key = {e.spawn_id: e for e in entries}
    ordered: list[ReplaySpawn] = []
    seen: set[str] = set()

    def visit(entry: ReplaySpawn, path: tuple[str, ...]) -> None:
        if entry.spawn_id in seen:
            return
        if entry.spawn_id in path:
            raise FlowResumeError(f"spawned entries form a cycle at {entry.spawn_id!r}")
        for dep in entry.depends_on:
            if dep in by_key:
                visit(by_key[dep], (*path, entry.spawn_id))
        seen.add(entry.spawn_id)
        ordered.append(entry)

    for entry in entries:
        visit(entry, ())
    return ordered


def _degraded(
    plan_entries: list[PlanEntry],
    completed: Mapping[str, object],
    spawned: list[ReplaySpawn],
    branches: Mapping[str, list[Message]],
    planned_keys: frozenset[str],
) -> list[str]:
    """Nodes that will run and would inherit a replayed node's conversation that is lost."""
    out = []
    for entry in plan_entries:
        if entry.agent_id in completed or not entry.inherit_context or not entry.dependencies:
            continue
        source = entry.dependencies[0].id
        if source in completed and source not in branches:
            out.append(entry.agent_id)
    spawned_done = {s.spawn_id for s in spawned if s.status == "completed"}
    for s in spawned:
        if s.status == "completed" or not s.depends_on:
            continue
        emitter = s.depends_on[0]
        replayed = emitter in completed or emitter in spawned_done
        if (
            replayed
            and emitter not in branches
            and (emitter in planned_keys or emitter in spawned_done)
        ):
            out.append(s.spawn_id)
    return out


def paid_nodes(replay: ReplayPlan, state: CheckpointState) -> tuple[str, ...]:
    """Every node a resume of ``replay`` (checked from ``state``) runs, so pays for.

    Planned nodes in plan order, the synthesis, then spawned ones: what ``resume
    --dry-run`` lists as not ``completed``. Spawns that nodes running again will ask
    for are not known yet and are not listed.
    """
    done = set(replay.completed) | set(replay.superseded)
    keys = [e.agent_id for e in replay.plan.plan if e.agent_id not in done]
    if synthesis_of(state) is not None and SYNTHESIS_KEY not in done:
        keys.append(SYNTHESIS_KEY)
    keys += [s.spawn_id for s in replay.spawned if s.status != "completed" and not s.superseded]
    return tuple(keys)
