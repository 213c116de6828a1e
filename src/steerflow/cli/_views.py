"""Read-only views for ``runs``, ``show`` and ``ctl status`` (one loader for every reader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steerflow.checkpoint import load_checkpoint
from steerflow.control import open_existing_db
from steerflow.errors import CheckpointRecoveryError
from steerflow.resume import resolve_run_target
from steerflow.state import StateDB

__all__ = ["checkpoint_nodes", "ctl_status_view", "runs_view", "show_view"]


def runs_view(home: Path, *, limit: int | None) -> dict[str, Any]:
    """``{"runs": [...]}``, newest first."""
    if not (home / "state.db").is_file():
        return {"runs": []}
    with StateDB.open(home, create=False) as db:
        rows = db.list_sessions(limit=limit)
        return {
            "runs": [
                {
                    "session_id": r.id,
                    "run_id": r.run_id,
                    "kind": r.kind,
                    "status": db.effective_status(r),
                    "created_at": r.created_at,
                    "phase": r.phase,
                }
                for r in rows
            ]
        }


def checkpoint_nodes(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Node rows derived from a loaded checkpoint (used when the state DB has none)."""
    ops = state.get("ops") or {}
    nodes = []
    for item in state.get("plan") or []:
        entry = ops.get(item.get("agent_id")) or {}
        nodes.append(
            {
                "id": item.get("agent_id"),
                "kind": "planned",
                "status": entry.get("status", "pending"),
                "assignee": item.get("assignee"),
            }
        )
    for entry in state.get("spawned") or []:
        nodes.append(
            {
                "id": entry.get("spawn_id") or entry.get("node_id"),
                "kind": "spawned",
                "status": entry.get("status"),
                "assignee": entry.get("assignee"),
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
    state: dict[str, Any] | None = None
    if ckpt_path.exists():
        try:
            state, report = load_checkpoint(ckpt_path)
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
                view["usage"] = meta.get("usage")
                view["nodes"] = [
                    {
                        "id": n.node_key,
                        "kind": n.kind,
                        "status": n.status,
                        "assignee": n.assignee,
                        **({"detail": n.detail} if n.detail else {}),
                    }
                    for n in db.list_nodes(run.session_id)
                ]
    if state is not None:
        from_checkpoint = checkpoint_nodes(state)
        if not view["nodes"]:
            view["nodes"] = from_checkpoint
        else:  # live rows, in plan order (spawned nodes after, as recorded)
            order = {n["id"]: i for i, n in enumerate(from_checkpoint)}
            view["nodes"].sort(key=lambda n: order.get(n["id"], len(order)))
    return view


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
