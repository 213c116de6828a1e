"""Read-only views for ``runs``, ``show`` and ``ctl status`` (one loader for every reader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steerflow.checkpoint import CheckpointState, load_state
from steerflow.control import open_existing_db
from steerflow.errors import CheckpointRecoveryError
from steerflow.orchestrate._detail import elapsed, run_summary
from steerflow.resume import resolve_run_target
from steerflow.state import SessionRow, StateDB, db_exists

__all__ = [
    "checkpoint_nodes",
    "ctl_status_view",
    "resume_links",
    "resumed_by_view",
    "runs_view",
    "show_view",
]


def runs_view(home: Path, *, limit: int | None) -> dict[str, Any]:
    """``{"runs": [...]}``, newest first."""
    if not db_exists(home):
        return {"runs": []}
    with StateDB.open(home, create=False) as db:
        rows = db.list_sessions(limit=limit)
        by = db.resumed_by([r.run_id for r in rows if r.run_id])
        return {
            "runs": [
                {
                    "session_id": r.id,
                    "run_id": r.run_id,
                    "kind": r.kind,
                    "status": db.effective_status(r),
                    "created_at": r.created_at,
                    "phase": r.phase,
                    "duration_s": _run_duration(r, db.effective_status(r)),
                    "resumed_from": r.node_metadata.get("resumed_from"),
                    "resumed_from_run": r.node_metadata.get("resumed_from_run"),
                    "resumed_by": [b.to_json() for b in by.get(r.run_id or "", [])],
                }
                for r in rows
            ]
        }


def _run_duration(row: SessionRow, status: str) -> float | None:
    """Start to finish; a live run to now; a dead one to its last heartbeat."""
    if status == "running":
        return elapsed(row.created_at, None, running=True)
    end = row.node_metadata.get("finished_at") or row.heartbeat_at or row.updated_at
    return elapsed(row.created_at, end, running=False)


def checkpoint_nodes(state: CheckpointState) -> list[dict[str, Any]]:
    """Node rows derived from a loaded checkpoint (used when the state DB has none)."""
    nodes = []
    for item in state.plan:  # plan items are not entries: read as far as readable
        entry = state.ops.get(item.get("agent_id"))
        nodes.append(
            {
                "id": item.get("agent_id"),
                "kind": "planned",
                "status": entry.status if entry is not None else "pending",
                "assignee": item.get("assignee"),
            }
        )
    for spawned in state.spawned:
        nodes.append(
            {
                "id": spawned.spawn_id or spawned.node_id,
                "kind": "spawned",
                "status": spawned.status,
                "assignee": spawned.assignee,
            }
        )
    return nodes


def show_view(home: Path, target: str) -> dict[str, Any]:
    """Status, phase, live node statuses and checkpoint report of one run."""
    run = resolve_run_target(home, target)
    ckpt_path = run.run_dir / "checkpoint.json"
    view: dict[str, Any] = {
        "session_id": run.session_id,
        "run_id": run.run_id,
        "run_dir": str(run.run_dir),
        "status": None,
        "phase": None,
        "nodes": [],
        "checkpoint": {"path": str(ckpt_path), "version": None, "exists": ckpt_path.exists()},
        "checkpoint_recovery": None,
    }
    state: CheckpointState | None = None
    if ckpt_path.exists():
        try:
            state, report = load_state(ckpt_path, v2_lenient=True)
        except CheckpointRecoveryError as exc:
            report = exc.report
        view["checkpoint_recovery"] = report
        view["checkpoint"]["version"] = report.get("checkpoint_version")
    if run.session_id is not None:
        with StateDB.open(home, create=False) as db:
            session = db.get_session(run.session_id)
            if session is not None:
                view["status"] = db.effective_status(session)
                view["phase"] = session.phase
                view["kind"] = session.kind
                meta = session.node_metadata
                view["resumed_from"] = meta.get("resumed_from")
                view["resumed_from_run"] = meta.get("resumed_from_run")
                view["usage"] = meta.get("usage")
                view["nodes"] = [
                    {
                        "id": n.node_key,
                        "kind": n.kind,
                        "status": n.status,
                        "assignee": n.assignee,
                        "model": (n.detail or {}).get("model"),
                        "duration_s": elapsed(
                            (n.detail or {}).get("started_at"),
                            (n.detail or {}).get("ended_at"),
                            running=n.status == "running",
                        ),
                        # The rendered instruction can be large: `show RUN NODE` has it.
                        **(
                            {"detail": {k: v for k, v in n.detail.items() if k != "instruction"}}
                            if n.detail
                            else {}
                        ),
                    }
                    for n in db.list_nodes(run.session_id)
                ]
    view["resumed_by"] = resumed_by_view(home, run.run_id)
    if state is not None:
        from_checkpoint = checkpoint_nodes(state)
        if not view["nodes"]:
            view["nodes"] = from_checkpoint
        else:  # live rows, in plan order (spawned nodes after, as recorded)
            order = {n["id"]: i for i, n in enumerate(from_checkpoint)}
            view["nodes"].sort(key=lambda n: order.get(n["id"], len(order)))
        recorded = _recorded_artifacts(state)
        for node in view["nodes"]:
            if node["id"] in recorded:
                node["artifacts"] = recorded[node["id"]]
    view["summary"] = run_summary(view["nodes"], view.get("usage"))
    return view


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


def resumed_by_view(home: Path, run_id: str) -> list[dict[str, Any]]:
    """Every resume of run ``run_id``, oldest first (``show``'s ``resumed_by``)."""
    if not db_exists(home):
        return []
    with StateDB.open(home, create=False) as db:
        return [b.to_json() for b in db.resumed_by([run_id]).get(run_id, [])]


def resume_links(view: dict[str, Any]) -> str:
    """``resumed from RUN; resumed by RUN (fork), ...`` for a ``runs`` row or ``show`` view."""
    parts = []
    source = view.get("resumed_from_run") or view.get("resumed_from")
    if source:
        parts.append(f"resumed from {source}")
    by = [
        f"{b['run_id'] or b['session_id']}{' (fork)' if b['fork'] else ''}"
        f"{' (' + b['status'] + ')' if b['status'] == 'running' else ''}"
        for b in view.get("resumed_by") or []
    ]
    if by:
        parts.append("resumed by " + ", ".join(by))
    return "; ".join(parts)


def ctl_status_view(home: Path, target: str) -> dict[str, Any]:
    """``{"session_id", "status", "phase", "poller", "controls": [...]}``."""
    with open_existing_db(home) as db:
        resolved = db.resolve_target(target)
        session = db.get_session(resolved.session_id)
        assert session is not None
        return {
            "session_id": session.id,
            "status": db.effective_status(session),
            "phase": session.phase,
            "poller": session.node_metadata.get("poller", "pending"),
            "controls": [
                {
                    "id": c.id,
                    "verb": c.verb,
                    "payload": c.payload,
                    "created_at": c.created_at,
                    "applied_at": c.applied_at,
                    "result": c.result,
                }
                for c in db.list_controls(session.id)
            ],
        }
