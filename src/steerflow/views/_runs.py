"""Runs and one run: the readers behind ``runs --json`` and ``show --json``.

Live facts (status, phase, node rows) come from the state DB; outcomes, recorded
artifacts and plan order from the checkpoint, read with ``checkpoint.load_state`` (v2
leniently): the one loader every reader shares.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

from steerflow._usage import Usage
from steerflow.checkpoint import (
    CHECKPOINT_FILENAME,
    JOURNAL_FILENAME,
    CheckpointState,
    load_state,
)
from steerflow.errors import CheckpointRecoveryError, UsageError, quote_input
from steerflow.orchestrate._agent_state import ordered_keys
from steerflow.orchestrate._detail import elapsed, run_summary
from steerflow.plan import SYNTHESIS_KEY
from steerflow.resume import resolve_run_target
from steerflow.state import NodeRow, SessionRow, SessionStatus, StateDB, db_exists
from steerflow.views._loops import recorded_loops

__all__ = [
    "NodeState",
    "RunListing",
    "RunView",
    "last_life",
    "list_runs",
    "resumed_by",
    "saved_at",
    "show_run",
]


@dataclass(frozen=True)
class RunListing:
    """One row of ``runs``: a session, its live status and its resume links."""

    session_id: str
    run_id: str | None
    kind: str
    status: str
    created_at: float
    #: Where a running run is (``planning``/``executing``/``paused``); None once it ended.
    phase: str | None
    duration_s: float | None
    resumed_from: str | None
    resumed_from_run: str | None
    #: Every resume of this run, oldest first (``ResumedBy.to_json`` objects).
    resumed_by: tuple[dict[str, Any], ...] = ()
    #: Plan ``name``, playbook name, else the prompt's first line (CONTRACT §11).
    name: str | None = None
    #: What the run spent (stored when it ended; null while it runs) and its caps.
    usage: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    #: Approval requests of this run that wait for an operator (issue 41).
    approvals_waiting: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``runs --json`` row."""
        return {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "created_at": self.created_at,
            "phase": self.phase,
            "duration_s": self.duration_s,
            "resumed_from": self.resumed_from,
            "resumed_from_run": self.resumed_from_run,
            "resumed_by": list(self.resumed_by),
            "usage": self.usage,
            "budget": self.budget,
            "approvals_waiting": self.approvals_waiting,
        }


#: What a status filter may name: the stored vocabulary (a dead run reads ``interrupted``).
STATUSES: tuple[str, ...] = get_args(SessionStatus)
#: Rows read per query while a status filter drops dead-or-alive ``running`` rows.
_BATCH = 500


def list_runs(
    home: Path,
    *,
    limit: int | None = 20,
    status: str | None = None,
    offset: int = 0,
    text: str | None = None,
    since: float | None = None,
) -> list[RunListing]:
    """Runs, newest first; at most ``limit`` (None: all), only ``status`` ones if given.

    ``text``: only runs whose name or run id contains it (case-insensitive); ``since``:
    only runs started at or after that epoch.

    ``status`` filters on the effective status (a dead run reads as ``interrupted``)
    before ``limit`` cuts: the list holds ``limit`` rows whenever that many match.
    ``offset`` skips that many matching runs first (a page of the list).

    Raises:
        UsageError: ``status`` is not a session status, or ``limit``/``offset`` is
            negative.
    """
    if status is not None and status not in STATUSES:
        raise UsageError(
            f"unknown status {quote_input(status)}: expected one of {', '.join(STATUSES)}"
        )
    if (limit is not None and limit < 0) or offset < 0:
        raise UsageError("limit and offset must not be negative")
    if not db_exists(home):
        return []
    with StateDB.open(home, create=False) as db:
        rows = _matching_sessions(db, status, limit, offset, text or None, since)
        by = db.resumed_by([r.run_id for r in rows if r.run_id])
        return [_listing(db, r, by, home) for r in rows]


def _matching_sessions(
    db: StateDB,
    status: str | None,
    limit: int | None,
    offset: int,
    text: str | None,
    since: float | None = None,
) -> list[SessionRow]:
    """Sessions whose effective status is ``status``, newest first, sliced in SQL if it can.

    Only a stored ``running`` row can read otherwise (``interrupted`` once its owner is
    dead), so the other statuses are one indexed query; ``running`` and ``interrupted``
    read stored-running rows in batches and judge each.
    """
    if status is None or status not in ("running", "interrupted"):
        stored = None if status is None else [status]
        return db.list_sessions(limit=limit, offset=offset, stored=stored, text=text, since=since)
    wanted = None if limit is None else offset + limit
    out: list[SessionRow] = []
    start = 0
    while wanted is None or len(out) < wanted:
        batch = db.list_sessions(
            limit=_BATCH, offset=start, stored=["running", "interrupted"], text=text, since=since
        )
        out += [r for r in batch if db.effective_status(r) == status]
        if len(batch) < _BATCH:
            break
        start += _BATCH
    return out[offset:wanted]


def _listing(db: StateDB, r: SessionRow, by: dict[str, list[Any]], home: Path) -> RunListing:
    effective = db.effective_status(r)
    run_dir = home / "runs" / r.run_id if r.run_id else None
    return RunListing(
        session_id=r.id,
        run_id=r.run_id,
        kind=r.kind,
        status=effective,
        created_at=r.created_at,
        phase=_live_phase(r.phase, effective),
        duration_s=_run_duration(r, effective, db, run_dir),
        resumed_from=r.node_metadata.get("resumed_from"),
        resumed_from_run=r.node_metadata.get("resumed_from_run"),
        resumed_by=tuple(b.to_json() for b in by.get(r.run_id or "", [])),
        name=r.name,
        usage=r.node_metadata.get("usage"),
        budget=_budget(r.node_metadata),
        # a run a resume continued waits on nothing: its resume holds the requests now
        approvals_waiting=0
        if any(not b.fork and b.run_id for b in by.get(r.run_id or "", []))
        else _waiting(r.node_metadata),
    )


def _waiting(meta: dict[str, Any]) -> int:
    """How many approval requests the run published as waiting (issue 41)."""
    found = meta.get("approvals")
    return len(found) if isinstance(found, dict) else 0


def _live_phase(stored: str | None, status: str) -> str | None:
    """The phase a reader reports: a running run's stored one, else none (issue 38 item 7).

    The poller writes ``sessions.phase`` only while the run goes, so an ended or dead run
    keeps its last one (``executing``); ``runs --json``, ``show --json``, the MCP tools and
    the Studio report null for it instead. ``ctl status`` keeps the stored column.
    """
    return stored if status == "running" else None


def _run_duration(
    row: SessionRow, status: str, db: StateDB, run_dir: Path | None = None
) -> float | None:
    """Start to finish; a live run to now; a dead one to its last recorded event."""
    if status == "running":
        return elapsed(row.created_at, None, running=True)
    return elapsed(row.created_at, last_life(row, db, run_dir), running=False)


def saved_at(run_dir: Path | None) -> float | None:
    """When the run's checkpoint was last written: the newer of its base file and journal.

    Every completion is appended to the journal (the base file is rewritten only at a
    compaction), so the base file's time alone reads as the run's start.
    """
    if run_dir is None:
        return None
    times = []
    for name in (CHECKPOINT_FILENAME, JOURNAL_FILENAME):
        try:
            times.append(os.lstat(run_dir / name).st_mtime)
        except OSError:
            continue
    return max(times, default=None)


def last_life(session: SessionRow, db: StateDB, run_dir: Path | None = None) -> float:
    """The end of a settled run: its recorded finish, else its last recorded event.

    A run that died has no finish: its end is the latest of its heartbeat, its last node
    publication and its checkpoint's last save. Never ``updated_at``: marking the dead
    run ``interrupted`` (``mark_interrupted_if_dead``, which a resume does) stamps it
    with that later moment, and the crashed run would last until its resume (decision
    320).
    """
    end = session.node_metadata.get("finished_at")
    if isinstance(end, (int, float)):
        return float(end)
    signs = (
        session.created_at,
        session.heartbeat_at or 0.0,
        db.last_node_update(session.id) or 0.0,
        saved_at(run_dir) or 0.0,
    )
    return max(signs)


@dataclass(frozen=True)
class NodeState:
    """One node's live status in a run view (``show``'s node list)."""

    id: str
    kind: str
    status: str
    assignee: str | None
    #: False when the state DB has no rows for the run and the node comes from the
    #: checkpoint alone: then nothing is known about its call (model, duration, detail).
    live: bool = True
    model: str | None = None
    duration_s: float | None = None
    #: The published call detail without the rendered instruction (``node_detail`` has it).
    detail: dict[str, Any] | None = None
    #: The artifacts its completed checkpoint entry records (path, bytes, digest).
    artifacts: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``show --json`` node object."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "assignee": self.assignee,
        }
        if self.live:
            out["model"] = self.model
            out["duration_s"] = self.duration_s
            # CONTRACT §11: every member, null where the provider reported nothing.
            used = Usage.from_json(self.detail)
            out["usage"] = used.to_json() if used is not None else None
            if self.detail:
                out["detail"] = self.detail
        if self.artifacts:
            out["artifacts"] = list(self.artifacts)
        return out


@dataclass(frozen=True)
class RunView:
    """One run: status, phase, every node's live status, checkpoint and its report."""

    run_id: str
    session_id: str | None
    run_dir: Path
    #: None when the state DB has no session row for the run.
    status: str | None
    #: Where a running run is (``planning``/``executing``/``paused``); None once it ended.
    phase: str | None
    kind: str | None
    nodes: tuple[NodeState, ...]
    checkpoint_path: Path
    checkpoint_exists: bool
    checkpoint_version: int | None
    #: The ``checkpoint_recovery`` report (CONTRACT §8); None without a checkpoint file.
    checkpoint_recovery: dict[str, Any] | None
    summary: dict[str, Any]
    resumed_by: tuple[dict[str, Any], ...] = ()
    resumed_from: str | None = None
    resumed_from_run: str | None = None
    usage: dict[str, Any] | None = None
    #: Whether the state DB has a session row for the run (``show --json`` then also
    #: carries ``kind``, ``resumed_from``, ``resumed_from_run`` and ``usage``).
    has_session: bool = False
    #: False when the run directory is not in this home (another host ran it, or it was
    #: deleted): the view holds the state DB's facts only, no checkpoint.
    reachable: bool = True
    #: The host that ran it (the session's ``owner_host``); None when unknown.
    owner_host: str | None = None
    #: Plan ``name``, playbook name, else the prompt's first line (CONTRACT §11).
    name: str | None = None
    #: The run's caps, ``{max_cost, max_tokens}`` (null members when not set).
    budget: dict[str, Any] | None = None
    #: Each loop's ``{id, rounds, ended, nodes}`` (issue 40 item 4); empty when none.
    loops: tuple[dict[str, Any], ...] = ()
    #: When the session began; None without a session row.
    created_at: float | None = None
    #: When it ended: its recorded finish, or for a run that died its last recorded event
    #: (heartbeat, node publication, checkpoint save); None while it runs (decision 320).
    ended_at: float | None = None
    #: The session's ``node_metadata`` (stop, budget and finish facts); not in ``to_json``.
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        """Start to end; a running run to now."""
        return elapsed(self.created_at, self.ended_at, running=self.status == "running")

    def node(self, key: str) -> NodeState | None:
        """The node named ``key`` exactly, else None."""
        return next((n for n in self.nodes if n.id == key), None)

    def to_json(self) -> dict[str, Any]:
        """The ``show --json`` object."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "name": self.name,
            "run_dir": str(self.run_dir),
            "status": self.status,
            "phase": self.phase,
            "nodes": [n.to_json() for n in self.nodes],
            # Unreachable: nothing is known about the checkpoint from here, not "absent".
            "checkpoint": {
                "path": str(self.checkpoint_path),
                "version": self.checkpoint_version,
                "exists": self.checkpoint_exists,
            }
            if self.reachable
            else None,
            "checkpoint_recovery": self.checkpoint_recovery,
            "reachable": self.reachable,
            "owner_host": self.owner_host,
        }
        if self.has_session:
            out["kind"] = self.kind
            out["resumed_from"] = self.resumed_from
            out["resumed_from_run"] = self.resumed_from_run
            out["usage"] = self.usage
            out["budget"] = self.budget
        out["resumed_by"] = list(self.resumed_by)
        out["summary"] = self.summary
        if self.loops:
            out["loops"] = list(self.loops)
        return out


def show_run(home: Path, target: str) -> RunView:
    """Resolve ``target`` (run id or prefix, run dir, session/invocation/play id) and read it.

    A run the state DB knows whose directory is not in this home (it ran on another host
    sharing a PostgreSQL state DB, or its directory was deleted) is read from the DB
    alone: status, phase and ``session_nodes``, with ``reachable`` False.

    Raises:
        UnknownIdError, AmbiguousIdError: ``target`` names no run or several.
    """
    run = resolve_run_target(home, target, need_dir=False)
    ckpt_path = run.run_dir / CHECKPOINT_FILENAME
    # A dangling link is there too: the loader refuses it by name (it never follows one).
    exists = run.reachable and os.path.lexists(ckpt_path)
    state: CheckpointState | None = None
    report: dict[str, Any] | None = None
    if exists:
        try:
            state, report = load_state(ckpt_path, v2_lenient=True)
        except CheckpointRecoveryError as exc:
            report = exc.report
    status = phase = kind = owner_host = name = None
    created_at: float | None = None
    ended_at: float | None = None
    meta: dict[str, Any] = {}
    nodes: list[NodeState] = []
    has_session = False
    if run.session_id is not None and db_exists(home):
        with StateDB.open(home, create=False) as db:
            session = db.get_session(run.session_id)
            if session is not None:
                has_session = True
                status, kind = db.effective_status(session), session.kind
                phase = _live_phase(session.phase, status)
                owner_host, name = session.owner_host, session.name
                meta = dict(session.node_metadata)
                settled = None if status == "running" else last_life(session, db, run.run_dir)
                created_at, ended_at = session.created_at, settled
                nodes = [_live_node(n, settled) for n in db.list_nodes(run.session_id)]
    if state is not None:
        from_checkpoint = checkpoint_nodes(state)
        if not nodes:
            nodes = from_checkpoint
        else:  # live rows, in plan order (spawned nodes after, as recorded)
            order = {n.id: i for i, n in enumerate(from_checkpoint)}
            nodes.sort(key=lambda n: order.get(n.id, len(order)))
        recorded = _recorded_artifacts(state)
        nodes = [_with_artifacts(n, recorded[n.id]) if n.id in recorded else n for n in nodes]
    usage = meta.get("usage")
    return RunView(
        run_id=run.run_id,
        session_id=run.session_id,
        run_dir=run.run_dir,
        status=status,
        phase=phase,
        kind=kind,
        nodes=tuple(nodes),
        checkpoint_path=ckpt_path,
        checkpoint_exists=exists,
        checkpoint_version=report.get("checkpoint_version") if report else None,
        checkpoint_recovery=report,
        summary=run_summary([n.to_json() for n in nodes], usage),
        resumed_by=tuple(resumed_by(home, run.run_id)),
        resumed_from=meta.get("resumed_from"),
        resumed_from_run=meta.get("resumed_from_run"),
        usage=usage,
        has_session=has_session,
        reachable=run.reachable,
        owner_host=owner_host or run.owner_host,
        name=name,
        budget=_budget(meta),
        loops=tuple(recorded_loops(state, meta.get("loops") or ())),
        created_at=created_at,
        ended_at=ended_at,
        metadata=meta,
    )


def _live_node(n: NodeRow, settled_at: float | None = None) -> NodeState:
    """One ``session_nodes`` row as ``show`` lists it.

    ``settled_at``: the run is not running any more (it ended or its owner died) and was
    last alive then. A node still published ``running`` was in flight when it died: it
    reads ``interrupted``, its duration up to that moment rather than growing (decision
    200).
    """
    detail = n.detail or {}
    in_flight = n.status == "running"
    interrupted = in_flight and settled_at is not None
    ended = detail.get("ended_at")
    if interrupted and ended is None:
        ended = settled_at
    return NodeState(
        id=n.node_key,
        kind=n.kind,
        status="interrupted" if interrupted else n.status,
        assignee=n.assignee,
        model=detail.get("model"),
        duration_s=elapsed(detail.get("started_at"), ended, running=in_flight and not interrupted),
        # The rendered instruction can be large: node_detail has it.
        detail={k: v for k, v in n.detail.items() if k != "instruction"} if n.detail else None,
    )


def _budget(meta: dict[str, Any]) -> dict[str, Any]:
    stored = meta.get("budget")
    stored = stored if isinstance(stored, dict) else {}
    return {"max_cost": stored.get("max_cost"), "max_tokens": stored.get("max_tokens")}


def _with_artifacts(node: NodeState, artifacts: list[Any]) -> NodeState:
    return replace(node, artifacts=tuple(artifacts))


def checkpoint_nodes(state: CheckpointState) -> list[NodeState]:
    """Node states derived from a loaded checkpoint (used when the state DB has none)."""
    nodes = []
    for item in state.plan:  # plan items are not entries: read as far as readable
        entry = state.ops.get(item.get("agent_id"))
        nodes.append(
            NodeState(
                id=item.get("agent_id"),
                kind="planned",
                status=entry.status if entry is not None else "pending",
                assignee=item.get("assignee"),
                live=False,
            )
        )
    for spawned in state.spawned:
        nodes.append(
            NodeState(
                id=spawned.spawn_id or spawned.node_id,
                kind="spawned",
                status=spawned.status,
                assignee=spawned.assignee,
                live=False,
            )
        )
    # An agent run has no plan: its turns are entries only (issue 19), in turn order.
    planned = {item.get("agent_id") for item in state.plan if isinstance(item, dict)}
    for key in ordered_keys([k for k in state.ops if k not in planned]):
        nodes.append(
            NodeState(id=key, kind="planned", status=state.ops[key].status, assignee=None,
                      live=False)
        )  # fmt: skip
    if isinstance(state.config.get("synthesis"), dict) and SYNTHESIS_KEY not in state.ops:
        # A requested synthesis not recorded yet is owed (decision 72): shown pending, last.
        nodes.append(
            NodeState(id=SYNTHESIS_KEY, kind="planned", status="pending", assignee=None,
                      live=False)
        )  # fmt: skip
    return nodes


def _recorded_artifacts(state: CheckpointState) -> dict[str, list[Any]]:
    """Leg key -> the ``artifacts`` its completed entry records (path, bytes, digest)."""
    out: dict[str, list[Any]] = {}
    entries = [(key, e.raw) for key, e in state.ops.items()]
    entries += [(e.spawn_id or e.node_id, e.raw) for e in state.spawned]
    for key, raw in entries:
        recorded = raw.get("artifacts")
        if raw.get("status") == "completed" and isinstance(recorded, list) and recorded:
            out[key] = recorded
    return out


def resumed_by(home: Path, run_id: str) -> list[dict[str, Any]]:
    """Every resume of run ``run_id``, oldest first (``show``'s ``resumed_by``)."""
    if not db_exists(home):
        return []
    with StateDB.open(home, create=False) as db:
        return [b.to_json() for b in db.resumed_by([run_id]).get(run_id, [])]
