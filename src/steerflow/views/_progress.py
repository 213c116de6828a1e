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
        # One grouped count for the page, then a few details per run that ran nodes.
        all_counts = db.node_counts(list(session_ids))
        for session_id in session_ids:
            counts = all_counts.get(session_id, {})
            ran = any(status not in ("pending", "paused") for status in counts)
            out[session_id] = RunProgress(
                session_id=session_id,
                done=sum(n for status, n in counts.items() if status in _DONE),
                total=sum(counts.values()),
                by_status=counts,
                model=_first_model(db, session_id) if ran else None,
            )
    return out


#: Details decoded per query while looking for the first call this session made.
_MODEL_BATCH = 16


def _first_model(db: StateDB, session_id: str) -> str | None:
    """The model of the first started node that this session called, not replayed.

    Details come in small batches: decoding every detail of a long run is the cost, and
    a resumed run's first nodes are often all replays.
    """
    offset = 0
    while True:
        batch = db.started_details(session_id, limit=_MODEL_BATCH, offset=offset)
        for found in batch:
            if isinstance(found, dict) and found.get("model") and not found.get("replayed"):
                return str(found["model"])
        if len(batch) < _MODEL_BATCH:
            return None
        offset += _MODEL_BATCH
