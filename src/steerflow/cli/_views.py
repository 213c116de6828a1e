"""The JSON of ``runs``, ``show`` and ``ctl status``: ``steerflow.views`` objects, serialised.

The readers live below the CLI (:mod:`steerflow.views`), so a Studio page or an MCP client
reads exactly what these commands print; only the human wording is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steerflow.cli._output import printable

# Each reader is imported by the function that uses it: ``ctl status`` needs the control
# view only, not the run readers (checkpoint loader, node detail) behind ``runs``/``show``.

__all__ = ["ctl_status_view", "resume_links", "runs_view", "show_view", "unreachable_line"]


def runs_view(home: Path, *, limit: int | None) -> dict[str, Any]:
    """``{"runs": [...]}``, newest first."""
    from steerflow.views import list_runs

    return {"runs": [r.to_json() for r in list_runs(home, limit=limit)]}


def show_view(home: Path, target: str) -> dict[str, Any]:
    """Status, phase, live node statuses and checkpoint report of one run."""
    from steerflow.views import show_run

    return show_run(home, target).to_json()


def unreachable_line(view: dict[str, Any]) -> str:
    """``show``'s one line for a run whose directory is not in this home."""
    from steerflow.state import this_host

    host = view.get("owner_host")
    where = (
        f"run directory on {printable(host)}"
        if host and host != this_host()
        else f"run directory {printable(view['run_dir'])!r} is missing"
    )
    return (
        f"checkpoint: not reachable from this host ({where}); "
        "node detail, resume and verify need it"
    )


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
    from steerflow.views import control_status

    return control_status(home, target).to_json()
