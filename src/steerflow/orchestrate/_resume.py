"""Prepare a faithful resume from a checkpoint, or refuse (D5, Amendment 1 settle check).

Every check runs before any graph is built; a refusal names the node and never
touches the source run directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.checkpoint import entry_digest, load_checkpoint
from steerflow.errors import FlowResumeError, PlanValidationError, SteerflowError
from steerflow.executor import Edge, Graph, Operation
from steerflow.orchestrate._claim import preflight_claim
from steerflow.orchestrate._options import ResumeSeed
from steerflow.orchestrate._plan_codec import plan_from_checkpoint
from steerflow.plan import is_agent_id
from steerflow.providers import Message
from steerflow.resume import RunTarget, resolve_run_target

__all__ = ["BRANCHES_DIR", "load_branch", "prepare_resume"]

BRANCHES_DIR = "branches"
_TERMINAL = ("completed", "failed")


@dataclass
class _Spawned:
    node_id: str
    spawn_id: str
    status: str
    response: object
    instruction: str
    assignee: str | None
    parent_id: str | None
    depends_on: list[str]
    spawned_ids: list[str]


def load_branch(run_dir: Path, key: str) -> list[Message] | None:
    """A node's persisted conversation, or None if it was not persisted or is unreadable.

    Cases that still cannot be restored, and so count as degraded context when a node
    that will run inherits them: a branch file that is missing (the node finished but
    the process died before the file was written, or the file was deleted) or
    unreadable; and the private session state of agent workers (``claude-code/``,
    ``codex/``), which lives inside the worker, not in the branch we persist: only the
    prompt and the final reply are restored for those.
    """
    path = run_dir / BRANCHES_DIR / f"{key}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not isinstance(item, dict) or item.get("role") not in ("system", "user", "assistant"):
            return None
        out.append(Message(item["role"], str(item.get("content", ""))))
    return out


def _check_digest(where: str, entry: dict[str, Any]) -> None:
    digest = entry.get("result_digest")
    if digest is None:
        return  # older checkpoints carry no digest: nothing independent to check
    try:
        actual = entry_digest(entry)
    except ValueError as exc:  # e.g. NaN read from a hand-edited v2 file
        raise FlowResumeError(
            f"{where}: the stored response cannot be encoded canonically ({exc}), so it cannot "
            "be checked against its result_digest"
        ) from None
    if digest != actual:
        raise FlowResumeError(
            f"{where}: the stored response does not match its result_digest; the checkpoint "
            "was changed after the node completed, so replaying it would not be faithful"
        )


def _witnessed(where: str, entry: dict[str, Any]) -> list[str]:
    """The node ids an entry says its operation spawned (``[]`` without the member)."""
    ids = entry.get("spawned_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise FlowResumeError(f"{where}: spawned_ids is not a list of node ids")
    return list(ids)


def _check_witnesses(ops: dict[str, Any], spawned: object) -> None:
    """Every child an emitter's entry lists must have an entry of its own.

    An emitter records its accepted spawns' node ids (``spawned_ids``); a listed child
    with no entry was lost (a deleted spawned entry or pending intent), and replaying
    the emitter would finish the flow without ever running it.  Entries without the
    member (older checkpoints) are not checked.
    """
    entries = [e for e in spawned if isinstance(e, dict)] if isinstance(spawned, list) else []
    recorded = {e.get("node_id") for e in entries}
    emitters = [(f"node {key!r}", e) for key, e in ops.items() if isinstance(e, dict)]
    emitters += [(f"spawned node {e.get('spawn_id') or e.get('node_id')!r}", e) for e in entries]
    for where, entry in emitters:
        for child in _witnessed(where, entry):
            if child not in recorded:
                raise FlowResumeError(
                    f"{where} spawned node_id {child!r}, but the checkpoint has no entry for "
                    "that child (its spawned entry or pending intent is missing); resuming "
                    "would finish the flow without ever running it"
                )


def _spawned_entries(
    raw: object,
    plan_ids: dict[str, str],
    ops: dict[str, Any],
    *,
    retry_failed: bool,
    planned_keys: set[str] | frozenset[str] = frozenset(),
) -> list[_Spawned]:
    """Check every spawned entry before rebuilding any; one bad entry refuses the resume."""
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        raise FlowResumeError("checkpoint 'spawned' is not a list")
    entries: list[_Spawned] = []
    node_ids = {e.get("node_id") for e in raw if isinstance(e, dict)}
    spawn_ids = {e.get("spawn_id") for e in raw if isinstance(e, dict)}
    seen_nodes: set[str] = set()
    seen_keys: set[str] = set()
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("node_id"), str):
            raise FlowResumeError(f"spawned[{index}] has no node_id: cannot rebuild it")
        name = f"spawned node {entry.get('spawn_id') or entry['node_id']!r}"
        if entry["node_id"] in seen_nodes:
            raise FlowResumeError(f"{name}: node id {entry['node_id']!r} is recorded twice")
        seen_nodes.add(entry["node_id"])
        operation = entry.get("operation")
        if not isinstance(operation, str) or not operation:
            raise FlowResumeError(f"{name}: no 'operation' recorded, nothing to rebuild it from")
        status = entry.get("status")
        if status not in (*_TERMINAL, "pending"):
            raise FlowResumeError(f"{name}: status {status!r} is not completed or failed")
        if status == "pending" and entry.get("response") is not None:
            raise FlowResumeError(f"{name}: a pending entry must not carry a response")
        assignee = entry.get("assignee")
        spawn_id = entry.get("spawn_id")
        if assignee is not None and not spawn_id:
            raise FlowResumeError(f"{name}: has an assignee but no spawn_id")
        if not isinstance(spawn_id, str) or not is_agent_id(spawn_id):
            raise FlowResumeError(f"{name}: spawn_id {spawn_id!r} is not a valid leg key")
        if spawn_id in planned_keys or spawn_id in seen_keys:
            raise FlowResumeError(
                f"{name}: spawn_id {spawn_id!r} is already used by another node, so the "
                "recorded topology cannot be rebuilt"
            )
        seen_keys.add(spawn_id)
        parent = entry.get("parent_id")
        if parent is not None:
            parent_key = plan_ids.get(parent)
            parent_ok = (
                parent_key is not None and (ops.get(parent_key) or {}).get("status") in _TERMINAL
            ) or parent in node_ids
            if not parent_ok:
                raise FlowResumeError(
                    f"{name}: parent {parent!r} is neither terminal in the checkpoint nor "
                    "another spawned entry"
                )
        if status == "failed" and not retry_failed:
            raise FlowResumeError(
                f"{name} failed in the recorded run; resuming would skip it and everything "
                "after it. Re-run it with --retry-failed (this repeats its side effects)"
            )
        if status == "completed":
            _check_digest(name, entry)
        deps = entry.get("depends_on")
        if deps is None:
            deps = [plan_ids.get(parent) or _spawn_of(raw, parent)] if parent else []
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise FlowResumeError(f"{name}: depends_on is not a list of ids")
        for dep in deps:
            if dep not in plan_ids.values() and dep not in spawn_ids:
                raise FlowResumeError(f"{name}: depends on unknown node {dep!r}")
        entries.append(
            _Spawned(
                node_id=entry["node_id"],
                spawn_id=spawn_id,
                status=status,
                response=entry.get("response"),
                instruction=str(entry.get("instruction") or operation),
                assignee=assignee,
                parent_id=parent,
                depends_on=list(deps),
                spawned_ids=_witnessed(name, entry),
            )
        )
    return _topological(entries)


def _drop_unanchored_intent(
    raw: object, plan_ids: dict[str, str], ops: dict[str, Any]
) -> tuple[object, list[str]]:
    """Drop ``pending`` spawned entries whose emitter's own outcome was never recorded.

    Spawn intent is recorded before the emitter's outcome, so a kill in between leaves
    pending children under an emitter that will run again and emit them again. They were
    never invoked, so dropping them loses no work; keeping them would duplicate the spawn.
    """
    if not isinstance(raw, list):
        return raw, []
    dropped: set[str] = set()
    notes: list[str] = []
    changed = True
    while changed:
        changed = False
        for entry in raw:
            if not isinstance(entry, dict) or entry.get("status") != "pending":
                continue
            node_id, parent = entry.get("node_id"), entry.get("parent_id")
            if node_id in dropped or not isinstance(node_id, str):
                continue
            parent_key = plan_ids.get(parent) if isinstance(parent, str) else None
            if (parent_key is not None and parent_key not in ops) or parent in dropped:
                dropped.add(node_id)
                changed = True
                notes.append(
                    f"spawn intent {entry.get('spawn_id')!r} dropped: its emitter's outcome was "
                    "not recorded, so the emitter runs again and will request it again"
                )
    kept = [e for e in raw if not (isinstance(e, dict) and e.get("node_id") in dropped)]
    return kept, notes


def _spawn_of(raw: list[Any], node_id: str | None) -> str:
    for entry in raw:
        if isinstance(entry, dict) and entry.get("node_id") == node_id:
            return str(entry.get("spawn_id"))
    return ""


def _topological(entries: list[_Spawned]) -> list[_Spawned]:
    by_key = {e.spawn_id: e for e in entries}
    ordered: list[_Spawned] = []
    seen: set[str] = set()

    def visit(entry: _Spawned, path: tuple[str, ...]) -> None:
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


def prepare_resume(
    home: Path,
    target: str,
    *,
    retry_failed: bool = False,
    allow_degraded_context: bool = False,
    fork: bool = False,
) -> ResumeSeed:
    """Resolve ``target``, load and check its checkpoint, and describe the replay.

    Unless ``fork``, a source that another resume holds or already continued is
    refused first (``ResumeClaimedError``; docs/decisions.md, one resume per source).
    A refusal once the target is resolved carries the source's ids in ``source_ids``
    (``resume --json`` prints them).
    """
    run = resolve_run_target(home, target)
    known: dict[str, str | None] = {"session_id": run.session_id, "run_id": run.run_id}
    try:
        return _prepare(
            home,
            run,
            known,
            retry_failed=retry_failed,
            allow_degraded_context=allow_degraded_context,
            fork=fork,
        )
    except SteerflowError as exc:
        exc.source_ids = dict(known)
        raise


def _prepare(
    home: Path,
    run: RunTarget,
    known: dict[str, str | None],
    *,
    retry_failed: bool,
    allow_degraded_context: bool,
    fork: bool,
) -> ResumeSeed:
    preflight_claim(home, run.run_id, fork=fork)
    checkpoint = run.run_dir / "checkpoint.json"
    if not checkpoint.is_file():
        raise FlowResumeError(f"run {run.run_id} has no checkpoint.json ({str(checkpoint)!r})")
    state, report = load_checkpoint(checkpoint)
    session_id = state.get("session_id") or run.session_id
    if not isinstance(session_id, str) or not session_id:
        raise FlowResumeError(f"checkpoint of run {run.run_id} records no session_id")
    known["session_id"] = session_id
    raw_plan = state.get("plan")
    if not raw_plan:
        raise FlowResumeError(
            f"checkpoint of run {run.run_id} has an empty plan: nothing to replay"
        )
    try:
        plan = plan_from_checkpoint(raw_plan, source=f"checkpoint {str(checkpoint)!r}")
    except PlanValidationError as exc:
        raise FlowResumeError(f"the checkpoint's plan cannot be rebuilt: {exc}") from None
    plan_ids: dict[str, str] = {}
    for item in raw_plan:
        if isinstance(item, dict) and isinstance(item.get("node_id"), str):
            plan_ids[item["node_id"]] = item["agent_id"]
    ops = state.get("ops") or {}
    if not isinstance(ops, dict):
        raise FlowResumeError("checkpoint 'ops' is not an object")
    planned_keys = {e.agent_id for e in plan.plan}
    completed: dict[str, object] = {}
    rerun: list[str] = []
    for key, entry in ops.items():
        if key not in planned_keys or not isinstance(entry, dict):
            raise FlowResumeError(f"checkpoint records node {key!r}, which is not in its plan")
        status = entry.get("status")
        if status == "completed":
            _check_digest(f"node {key!r}", entry)
            completed[key] = entry.get("response")
        elif status == "failed":
            if not retry_failed:
                raise FlowResumeError(
                    f"node {key!r} failed in the recorded run; resuming would skip it and "
                    "everything after it. Re-run it with --retry-failed (this repeats its "
                    "side effects)"
                )
            rerun.append(key)
        else:
            raise FlowResumeError(f"node {key!r} has status {status!r}, not completed or failed")
    raw_spawned, notes = _drop_unanchored_intent(state.get("spawned"), plan_ids, ops)
    spawned = _spawned_entries(
        raw_spawned, plan_ids, ops, retry_failed=retry_failed, planned_keys=planned_keys
    )
    _check_witnesses(ops, raw_spawned)
    witnesses = {key: _witnessed(f"node {key!r}", ops[key]) for key in completed}
    branches = {
        key: branch
        for key in [*completed, *(s.spawn_id for s in spawned if s.status == "completed")]
        if (branch := load_branch(run.run_dir, key)) is not None
    }
    degraded = _degraded(plan.plan, completed, spawned, branches, planned_keys)
    if degraded and not allow_degraded_context:
        raise FlowResumeError(
            "these nodes inherit a conversation that the checkpoint cannot restore: "
            + ", ".join(degraded)
            + ". Pass --allow-degraded-context to run them with an empty branch"
        )
    config = state.get("config") or {}
    if not isinstance(config, dict):
        raise FlowResumeError("checkpoint 'config' is not an object")

    def apply(graph: Graph) -> None:
        for key, response in completed.items():
            op = graph.by_key[key]
            op.status, op.response, op.replayed = "completed", response, True
            op.branch = list(branches.get(key, []))
            op.spawned_ids = list(witnesses[key])
        for entry in spawned:
            child = Operation(
                key=entry.spawn_id,
                instruction=entry.instruction,
                kind="spawned",
                assignee=entry.assignee,
                edges=[Edge(source=graph.by_key[d].node_id) for d in entry.depends_on],
                # The recorded node id is kept, so the emitter's spawned_ids still name
                # this child in the resumed run's checkpoint.
                node_id=entry.node_id,
            )
            if entry.parent_id is not None:
                parent_key = plan_ids.get(entry.parent_id) or _spawn_of(
                    state.get("spawned") or [], entry.parent_id
                )
                parent = graph.by_key.get(parent_key)
                child.parent_id = parent.node_id if parent else None
                if parent is not None and entry.status != "completed":
                    child.branch = list(branches.get(parent.key, []))
            if entry.status == "completed":
                child.status, child.response, child.replayed = "completed", entry.response, True
                child.branch = list(branches.get(entry.spawn_id, []))
                child.spawned_ids = list(entry.spawned_ids)
            graph.add(child)

    flow_context = state.get("flow_context") or {}
    max_spawn = state.get("max_spawn")
    return ResumeSeed(
        plan=plan,
        prompt=str(state.get("prompt") or ""),
        config=dict(config),
        resumed_from=session_id,
        source_run_id=run.run_id,
        apply=apply,
        flow_context=dict(flow_context) if isinstance(flow_context, dict) else {},
        max_spawn=max_spawn if isinstance(max_spawn, int) else None,
        degraded=degraded,
        checkpoint_recovery=report,
        notes=notes,
        fork=fork,
    )


def _degraded(
    plan_entries: list[Any],
    completed: dict[str, object],
    spawned: list[_Spawned],
    branches: dict[str, list[Message]],
    planned_keys: set[str],
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
