"""How far each run got, for a runs overview: done/total nodes and the model (state DB only).

Kept apart from :func:`steerflow.views.list_runs` so ``runs`` stays one query; a page
that shows progress pays one node listing per run it shows, never a checkpoint load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.state import StateDB, db_exists

__all__ = ["RunProgress", "run_progress"]

_DONE = frozenset({"completed", "failed", "skipped"})


@dataclass(frozen=True)
class RunProgress:
    """Published node counts of one session and the model its first node called."""

    session_id: str
    #: Nodes in a terminal status (completed, failed or skipped).
    done: int
    total: int
    by_status: dict[str, int]
    #: The model of the first call this session made (a node a resume replayed made
    #: none here); None before any node ran.
    model: str | None

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the same members."""
        return {
            "session_id": self.session_id,
            "done": self.done,
            "total": self.total,
            "by_status": dict(self.by_status),
            "model": self.model,
        }


def run_progress(home: Path, session_ids: Sequence[str]) -> dict[str, RunProgress]:
    """Session id -> progress, for each of ``session_ids`` the state DB knows."""
    if not db_exists(home) or not session_ids:
        return {}
    out: dict[str, RunProgress] = {}
    with StateDB.open(home, create=False) as db:
        for session_id in session_ids:
            rows = db.list_nodes(session_id, detail=False)
            counts: dict[str, int] = {}
            for row in rows:
                counts[row.status] = counts.get(row.status, 0) + 1
            started = [r.node_key for r in rows if r.status not in ("pending", "paused")]
            model = _first_model(db, session_id, started)
            out[session_id] = RunProgress(
                session_id=session_id,
                done=sum(n for status, n in counts.items() if status in _DONE),
                total=len(rows),
                by_status=counts,
                model=model,
            )
    return out


#: Details decoded per query while looking for the first call this session made.
_MODEL_BATCH = 16


def _first_model(db: StateDB, session_id: str, started: list[str]) -> str | None:
    """The model of the first started node that this session called, not replayed.

    Statuses come first and details in small batches: decoding every detail of a long
    run is the cost, and a resumed run's first nodes are often all replays.
    """
    for at in range(0, len(started), _MODEL_BATCH):
        keys = started[at : at + _MODEL_BATCH]
        details = {r.node_key: r.detail or {} for r in db.list_nodes(session_id, keys=keys)}
        for key in keys:
            found = details.get(key) or {}
            if found.get("model") and not found.get("replayed"):
                return str(found["model"])
    return None
