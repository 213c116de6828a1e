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
    #: The model of the first published call, None before any node ran.
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
            model = None
            # Statuses first, then one row's detail: decoding every detail is the cost.
            started = [r.node_key for r in rows if r.status not in ("pending", "paused")]
            if started:
                detail = db.list_nodes(session_id, keys=started[:1])
                found = detail[0].detail if detail else None
                model = str(found["model"]) if found and found.get("model") else None
            out[session_id] = RunProgress(
                session_id=session_id,
                done=sum(n for status, n in counts.items() if status in _DONE),
                total=len(rows),
                by_status=counts,
                model=model,
            )
    return out
