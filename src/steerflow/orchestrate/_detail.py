"""Read what a run produced: one node in full, and the run's result.

The readers behind ``show RUN NODE`` and ``result RUN`` (and the Studio later). Outcomes
come from the checkpoint, read into typed entries with ``load_state`` (v2 leniently); facts
about each call (rendered instruction, model, times, usage) come from the state DB's
``session_nodes`` rows, which a run publishes while it runs, so a live run can be read
half-way. Nothing here writes.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerflow._usage import USAGE_MEMBERS, Usage
from steerflow.checkpoint import CheckpointState, PlannedEntry, SpawnedEntry, load_state
from steerflow.errors import AmbiguousIdError, CheckpointRecoveryError, UnknownIdError
from steerflow.orchestrate._agent_state import is_agent_state, read_turns
from steerflow.plan import SYNTHESIS_KEY
from steerflow.resume import resolve_run_target
from steerflow.state import NodeKind, NodeRow, NodeStatus, Phase, StateDB, db_exists

__all__ = [
    "NodeInfo",
    "RunRecord",
    "describe",
    "elapsed",
    "node_detail",
    "read_run",
    "response_text",
    "result_of",
    "result_text",
    "run_result",
    "run_summary",
]

#: How many ``resumed_from`` links are followed to find the run that really ran a
#: replayed node (a resume of a resume of ...); a loop in hand-edited data stops here.
_MAX_REPLAY_HOPS = 32
_TERMINAL = frozenset({"completed", "failed", "skipped"})
_ESCALATION = re.compile(r"\.esc(\d+)$")


@dataclass
class NodeInfo:
    """One node as the readers see it: its place in the graph, its outcome and its call."""

    key: str
    kind: NodeKind
    node_id: str | None = None
    assignee: str | None = None
    instruction: str | None = None  # as planned/requested, before rendering
    depends_on: list[str] = field(default_factory=list)
    parent: str | None = None
    entry: PlannedEntry | SpawnedEntry | None = None  # the checkpoint entry, when recorded
    #: dependency key -> ``{when, if_contains}`` for the edges that carry a condition.
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    row_status: NodeStatus | None = None
    call: dict[str, Any] = field(default_factory=dict)  # session_nodes.detail

    @property
    def status(self) -> str:
        """A recorded outcome wins over a published status the publisher has not caught up on."""
        recorded = self.entry.status if self.entry is not None else None
        if recorded in ("completed", "failed"):
            return str(recorded)
        return self.row_status or (str(recorded) if recorded else "pending")

    def extra(self, name: str) -> object:
        """A member the writer keeps verbatim (``artifacts``, ``escalated_from``), or None."""
        return None if self.entry is None else self.entry.raw.get(name)

    @property
    def response(self) -> object:
        """The recorded response of a completed node, else None."""
        done = self.entry is not None and self.entry.status == "completed"
        return self.entry.response if done and self.entry is not None else None

    @property
    def output(self) -> object:
        """The validated structured output of a completed typed node, else None."""
        done = self.entry is not None and self.entry.status == "completed"
        return self.extra("output") if done else None


@dataclass
class RunRecord:
    """A run as far as it can be read: checkpoint state (if it loads) and live rows."""

    run_id: str
    run_dir: Path
    session_id: str | None
    status: str | None
    phase: Phase | None
    metadata: dict[str, Any]
    state: CheckpointState | None
    report: dict[str, Any] | None
    load_error: CheckpointRecoveryError | None
    nodes: list[NodeInfo]
    origin_rows: dict[str, tuple[str, str | None, dict[str, Any]]] = field(default_factory=dict)

    def find(self, query: str) -> NodeInfo:
        """The node named ``query`` exactly, else the one whose id starts with it."""
        for node in self.nodes:
            if node.key == query:
                return node
        matches = [n for n in self.nodes if n.key.startswith(query)] if query else []
        if len(matches) == 1:
            return matches[0]
        if matches:
            names = ", ".join(n.key for n in matches[:10])
            raise AmbiguousIdError(
                f"ambiguous node prefix {query!r} in run {self.run_id}: matches "
                f"{len(matches)} nodes: {names}" + (", ..." if len(matches) > 10 else "")
            )
        known = ", ".join(n.key for n in self.nodes[:20]) or "none yet"
        raise UnknownIdError(
            f"run {self.run_id} has no node {query!r} (nodes: {known}"
            + (", ...)" if len(self.nodes) > 20 else ")")
        )


def read_run(home: Path, target: str, *, node: str | None = None) -> RunRecord:
    """Resolve ``target`` (as ``show`` does) and read its checkpoint and live node rows.

    With ``node`` (an id or prefix, as :meth:`RunRecord.find` takes it) every node's
    status is read but call facts (``NodeInfo.call``) only for that node and for spawned
    nodes (whose rows name their parents): on a 10,000-node run decoding every row's
    detail was most of the time ``show RUN NODE`` took.

    Raises:
        UnknownIdError, AmbiguousIdError: ``node`` names no node or several.
    """
    run = resolve_run_target(home, target)
    record = read_checkpoint_run(run.run_dir, session_id=run.session_id)
    if run.session_id is not None and db_exists(home):
        with StateDB.open(home, create=False) as db:
            _add_live(db, record, node)
    return record


def read_checkpoint_run(run_dir: Path, *, session_id: str | None = None) -> RunRecord:
    """A run as its checkpoint alone records it (no state DB read).

    A flow that finished while its state database could not be read prints its result
    from here: the checkpoint is the truth about what completed (issue 44).
    """
    state: CheckpointState | None = None
    report: dict[str, Any] | None = None
    error: CheckpointRecoveryError | None = None
    try:
        state, report = load_state(run_dir / "checkpoint.json", v2_lenient=True)
    except CheckpointRecoveryError as exc:
        error, report = exc, exc.report
    return RunRecord(
        run_id=run_dir.name,
        run_dir=run_dir,
        session_id=session_id,
        status=None,
        phase=None,
        metadata={},
        state=state,
        report=report,
        load_error=error,
        nodes=_checkpoint_nodes(state) if state is not None else [],
    )


def _conditions(
    plan: list[dict[str, Any]], indices: list[Any], stored: object
) -> dict[str, dict[str, Any]]:
    """Dependency key -> its ``dep_conditions`` member, for the conditional edges only."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(stored, list):
        return out
    for index, cond in zip(indices, stored, strict=False):
        if not (isinstance(index, int) and 0 <= index < len(plan) and isinstance(cond, dict)):
            continue
        when, contains = cond.get("when", "completed"), cond.get("if_contains")
        if when != "completed" or contains is not None:
            out[str(plan[index].get("agent_id"))] = {"when": when, "if_contains": contains}
    return out


def _checkpoint_nodes(state: CheckpointState) -> list[NodeInfo]:
    # Plan items are not entries: a viewer reads them as far as they are readable.
    plan = [i for i in state.plan if isinstance(i, dict)]
    keys_by_id: dict[str, str] = {}
    nodes: list[NodeInfo] = []
    for item in plan:
        key = str(item.get("agent_id"))
        if isinstance(item.get("node_id"), str):
            keys_by_id[item["node_id"]] = key
        indices = item.get("dep_indices") or []
        deps = [
            str(plan[i].get("agent_id"))
            for i in indices
            if isinstance(i, int) and 0 <= i < len(plan)
        ]
        conditions = _conditions(plan, indices, item.get("dep_conditions"))
        nodes.append(
            NodeInfo(
                key=key,
                kind="planned",
                node_id=item.get("node_id"),
                assignee=item.get("assignee"),
                instruction=item.get("instruction"),
                depends_on=deps,
                entry=state.ops.get(key),
                conditions=conditions,
            )
        )
    for entry in state.spawned:
        keys_by_id[entry.node_id] = entry.spawn_id or entry.node_id
    nodes += _spawned_nodes(state, keys_by_id)
    synthesis = state.config.get("synthesis")
    if isinstance(synthesis, dict) and isinstance(synthesis.get("instruction"), str):
        # Not in the plan: it depends on every worker's last attempt (CONTRACT §10).
        replaced = {n.parent for n in nodes if n.extra("escalated_from")}
        nodes.append(
            NodeInfo(
                key=SYNTHESIS_KEY,
                kind="planned",
                instruction=synthesis["instruction"],
                depends_on=[n.key for n in nodes if n.key not in replaced],
                entry=state.ops.get(SYNTHESIS_KEY),
            )
        )
    if is_agent_state(state):
        nodes += _agent_turn_nodes(state)
    return nodes


def _agent_turn_nodes(state: CheckpointState) -> list[NodeInfo]:
    """An agent run's turns (issue 19): each follows the one before, so the result is the last."""
    turns = read_turns(state).turns
    return [
        NodeInfo(key=t.key, kind="planned", assignee="agent", instruction=t.instruction,
                 depends_on=[turns[i - 1].key] if i else [], entry=t.entry)
        for i, t in enumerate(turns)
    ]  # fmt: skip


def _spawned_nodes(state: CheckpointState, keys_by_id: dict[str, str]) -> list[NodeInfo]:
    nodes: list[NodeInfo] = []
    for entry in state.spawned:
        parent = keys_by_id.get(entry.parent_id) if entry.parent_id else None
        recorded = entry.depends_on
        nodes.append(
            NodeInfo(
                key=entry.spawn_id or entry.node_id,
                kind="spawned",
                node_id=entry.node_id,
                assignee=entry.assignee,
                instruction=entry.instruction or entry.operation,
                # Older entries carry no depends_on: they depended on their emitter.
                depends_on=[str(d) for d in recorded]
                if isinstance(recorded, list)
                else ([parent] if parent else []),
                parent=parent,
                entry=entry,
            )
        )
    return nodes


def _add_live(db: StateDB, record: RunRecord, query: str | None = None) -> None:
    session_id = record.session_id
    assert session_id is not None
    session = db.get_session(session_id)
    if session is None:
        return
    record.status = db.effective_status(session)
    record.phase = session.phase
    record.metadata = dict(session.node_metadata)
    by_key = {n.key: n for n in record.nodes}
    if query is None:
        rows = db.list_nodes(session_id)
    else:
        # Spawned rows name their parents (the asked node's children); planned nodes are
        # all in the checkpoint's plan, so only a prefix, or a run whose checkpoint cannot
        # be read, needs the key of every row.
        for row in db.list_nodes(session_id, kind="spawned"):
            _merge_row(record, by_key, row)
        if query not in by_key:
            for row in db.list_nodes(session_id, detail=False):
                if row.node_key not in by_key:
                    _merge_row(record, by_key, row)
        rows = db.list_nodes(session_id, keys=[record.find(query).key])
    for row in rows:
        _merge_row(record, by_key, row)
    replayed = [n.key for n in record.nodes if n.call.get("replayed")]
    if replayed:
        record.origin_rows = _origins(db, record.metadata, replayed)


def _merge_row(record: RunRecord, by_key: dict[str, NodeInfo], row: NodeRow) -> None:
    """Fold one published row into the node it describes (adding a node only known live)."""
    node = by_key.get(row.node_key)
    if node is None:  # known live before the checkpoint records it
        node = NodeInfo(key=row.node_key, kind=row.kind, node_id=row.node_id)
        node.assignee = row.assignee
        record.nodes.append(node)
        by_key[node.key] = node
    node.row_status = row.status
    node.call = dict(row.detail or {})
    if node.parent is None and isinstance(node.call.get("parent"), str):
        node.parent = node.call["parent"]


def _origins(
    db: StateDB, metadata: dict[str, Any], keys: list[str]
) -> dict[str, tuple[str, str | None, dict[str, Any]]]:
    """For each replayed key: (session id, run id, call detail) of the run that ran it."""
    found: dict[str, tuple[str, str | None, dict[str, Any]]] = {}
    wanted = set(keys)
    source = metadata.get("resumed_from")
    for _ in range(_MAX_REPLAY_HOPS):
        if not wanted or not isinstance(source, str):
            break
        session = db.get_session(source)
        if session is None:
            break
        rows = {r.node_key: r for r in db.list_nodes(source, keys=sorted(wanted))}
        for key in list(wanted):
            row = rows.get(key)
            detail = dict(row.detail or {}) if row is not None else {}
            if row is not None and not detail.get("replayed"):
                found[key] = (source, session.run_id, detail)
                wanted.discard(key)
        source = session.node_metadata.get("resumed_from")
    return found


# -- one node ------------------------------------------------------------------------------


def _usage(call: dict[str, Any]) -> dict[str, Any] | None:
    if not any(call.get(n) is not None for n in USAGE_MEMBERS):
        return None
    return {n: call.get(n) for n in USAGE_MEMBERS}


def _duration(call: dict[str, Any]) -> float | None:
    start, end = call.get("started_at"), call.get("ended_at")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return round(max(0.0, end - start), 3)
    return None


def _artifacts(node: NodeInfo) -> list[Any]:
    recorded = node.extra("artifacts")
    if isinstance(recorded, list):
        return recorded
    listed = node.call.get("artifacts")
    return list(listed) if isinstance(listed, list) else []


def _error(node: NodeInfo) -> str | None:
    entry = node.entry
    if entry is not None and entry.status == "failed":
        response = entry.response
        if isinstance(response, dict) and "error" in response:
            return str(response["error"])
        return None if response is None else response_text(response)
    error = node.call.get("error")
    return str(error) if error is not None else None


def _escalation_attempt(node: NodeInfo) -> int | None:
    """N of an escalation retry (spawn id ``<agent_id>.esc<N>``, CONTRACT §10), else None."""
    match = _ESCALATION.search(node.key)
    if match is None or not node.extra("escalated_from"):
        return None
    return int(match.group(1))


def _note(node: NodeInfo, status: str, ran: bool) -> str | None:
    if status == "pending" and not ran:
        if node.call.get("cancelled"):
            stopped = node.call["cancelled"]
            return f"not finished: its call was stopped ({stopped}); it reruns on resume"
        return "has not run yet"
    if status == "paused":
        return "has not run yet: the run is paused"
    if status == "skipped":
        why = node.call.get("skipped") or "an edge condition was not met"
        return f"skipped: {why}, so it never ran"
    if status == "running":
        return "running: the response is not known yet"
    return None


def node_detail(home: Path, target: str, node: str) -> dict[str, Any]:
    """Everything known about one node of a run (``show TARGET NODE --json``).

    ``node`` is an ``agent_id`` or a spawned node's ``spawn_id``, or an unambiguous prefix.

    Raises:
        UnknownIdError, AmbiguousIdError: ``node`` names no node or several.
    """
    record = read_run(home, target, node=node)
    return describe(record, record.find(node))


def describe(record: RunRecord, info: NodeInfo) -> dict[str, Any]:
    """The ``show TARGET NODE`` object of one node of a read run."""
    status = info.status
    call = info.call
    replayed_from = None
    if call.get("replayed"):
        origin = record.origin_rows.get(info.key)
        if origin is not None:
            replayed_from = {"session_id": origin[0], "run_id": origin[1]}
            call = {**origin[2], "replayed": True}
        else:
            replayed_from = {
                "session_id": record.metadata.get("resumed_from"),
                "run_id": record.metadata.get("resumed_from_run"),
            }
    recorded = info.entry.status if info.entry is not None else None
    ran = "instruction" in call or recorded in ("completed", "failed")
    return {
        "run_id": record.run_id,
        "session_id": record.session_id,
        "id": info.key,
        "node_id": info.node_id,
        "kind": info.kind,
        "status": status,
        "assignee": info.assignee,
        "model": call.get("model"),
        "escalation_attempt": _escalation_attempt(info),
        "started_at": call.get("started_at"),
        "ended_at": call.get("ended_at"),
        "duration_s": _duration(call),
        "usage": _usage(call),
        "instruction": call.get("instruction"),
        "planned_instruction": info.instruction,
        "instruction_edited": edited_instruction(record, info.key),
        "response": info.response,
        "output": info.output,
        "error": _error(info) if status == "failed" else None,
        "artifacts": _artifacts(info),
        "parent": info.parent,
        "spawned": [n.key for n in record.nodes if n.parent == info.key],
        "depends_on": list(info.depends_on),
        "replayed": bool(call.get("replayed")),
        "replayed_from": replayed_from,
        "steers": call.get("steers") or [],
        "placement": call.get("placement"),
        "note": _note(info, status, ran),
        # Outcomes live in the checkpoint: when it cannot be read, say why instead of
        # presenting the missing response as "none".
        "checkpoint_error": str(record.load_error) if record.load_error else None,
        **_steps(record, info),
    }


def edited_instruction(record: RunRecord, key: str) -> dict[str, Any] | None:
    """``{original, instruction, run_id}`` when a ``resume --from`` fork edited ``key``."""
    from steerflow.resume._from import EDITED_KEY

    recorded = record.state.config.get(EDITED_KEY) if record.state is not None else None
    edit = recorded.get(key) if isinstance(recorded, dict) else None
    return dict(edit) if isinstance(edit, dict) else None


def _steps(record: RunRecord, info: NodeInfo) -> dict[str, Any]:
    """``steps`` of a node that ran a tool loop (issue 39 item 6); nothing for any other."""
    state = record.state
    if state is None or not state.steps:
        return {}
    from steerflow.tools._view import node_steps

    record_kind, key = ("op", info.key) if info.kind == "planned" else ("spawn", info.node_id)
    steps = node_steps(state.steps, record_kind, str(key))
    return {"steps": steps} if steps else {}


# -- the run's result ----------------------------------------------------------------------


def response_text(response: object) -> str:
    """A recorded response as text: strings as they are, anything else as JSON."""
    if isinstance(response, str):
        return response
    return json.dumps(response, ensure_ascii=False, sort_keys=True)


def _synthesis(record: RunRecord) -> NodeInfo | None:
    """The synthesis node, when the run's plan declared one (CONTRACT §10 ``synthesis``)."""
    if record.state is None or not record.state.config.get("synthesis"):
        return None
    for node in record.nodes:
        if node.key == SYNTHESIS_KEY:
            return node
    return None


def _sinks(record: RunRecord) -> list[NodeInfo]:
    """Nodes no other node depends on, planned ones in plan order, then spawned ones."""
    depended = {dep for node in record.nodes for dep in node.depends_on}
    return [n for n in record.nodes if n.key not in depended]


def _run_status(record: RunRecord) -> str:
    if record.status is not None:
        return record.status
    statuses = {n.status for n in record.nodes}
    if "failed" in statuses:
        return "failed"
    return "completed" if statuses <= _TERMINAL else "incomplete"


def run_result(home: Path, target: str) -> dict[str, Any]:
    """The run's result (``result TARGET --json``): synthesis, else every sink's outcome.

    Raises:
        CheckpointRecoveryError: the checkpoint is missing or refused, so nothing can be read.
    """
    return result_of(read_run(home, target))


def result_of(record: RunRecord) -> dict[str, Any]:
    """The result object of a read run (see :func:`run_result`)."""
    if record.state is None:
        assert record.load_error is not None
        raise record.load_error
    synthesis = _synthesis(record)
    picked = [synthesis] if synthesis is not None else _sinks(record)
    # Not through describe(): it lists each node's children, which is a scan of every
    # node, and a wide plan has thousands of sinks.
    items = []
    for node in picked:
        status = node.status
        items.append(
            {
                "id": node.key,
                "kind": node.kind,
                "status": status,
                "response": node.response,
                "output": node.output,
                "error": _error(node) if status == "failed" else None,
            }
        )
    out = {
        "run_id": record.run_id,
        "session_id": record.session_id,
        "status": _run_status(record),
        "source": "synthesis" if synthesis is not None else "sinks",
        "nodes": items,
        **_spend(record.metadata),
    }
    out["text"] = result_text(out)
    return out


def _spend(meta: dict[str, Any]) -> dict[str, Any]:
    """The run's ``usage`` (stored when it ended) and ``budget`` (CONTRACT §11)."""
    caps = meta.get("budget")
    caps = caps if isinstance(caps, dict) else {}
    usage = Usage.from_json(meta.get("usage"))
    return {
        "usage": usage.to_json() if usage is not None else None,
        "budget": {"max_cost": caps.get("max_cost"), "max_tokens": caps.get("max_tokens")},
    }


def result_text(result: dict[str, Any]) -> str:
    """The result as one text: the synthesis response alone, else one block per sink."""
    if result["source"] == "synthesis":
        item = result["nodes"][0]
        if item["response"] is not None:
            return response_text(item["response"])
    blocks = []
    for item in result["nodes"]:
        if item["status"] == "completed":
            blocks.append(f"### {item['id']}\n{response_text(item['response'])}")
        elif item["status"] == "failed":
            blocks.append(f"### {item['id']} (failed)\nerror: {item['error']}")
        else:
            blocks.append(f"### {item['id']} ({item['status']})\n(no response)")
    return "\n\n".join(blocks)


# -- run summaries for ``show`` and ``runs`` -----------------------------------------------


def run_summary(nodes: list[dict[str, Any]], usage: object) -> dict[str, Any]:
    """Node counts by status and the total usage (``show``'s summary line).

    ``usage`` is the total a finished run stored; a live run's is summed from its nodes.
    """
    counts = {"completed": 0, "failed": 0, "skipped": 0, "pending": 0, "running": 0}
    for node in nodes:
        status = str(node.get("status"))
        key = "pending" if status == "paused" else status
        if key in counts:
            counts[key] += 1
    if not isinstance(usage, dict):
        total = Usage()
        for node in nodes:
            total = total + (Usage.from_json(node.get("detail")) or Usage())
        usage = total.to_json()
    return {**counts, "total": len(nodes), "usage": usage}


def elapsed(start: object, end: object, *, running: bool) -> float | None:
    """Seconds from ``start`` to ``end`` (to now while ``running``), None when unknown."""
    if not isinstance(start, (int, float)):
        return None
    if running:
        end = time.time()
    if not isinstance(end, (int, float)):
        return None
    return round(max(0.0, end - start), 3)
