"""Which runs one page of the Runs list shows: filters, time range and sort (issue 42 item 6).

Newest first is one indexed query sliced in SQL. Sorting by duration or spend needs every
matching run's figures (the duration of a dead run is computed, the spend is in its
``node_metadata``): those read every run the filters keep, then sort and slice. The time
range bounds that read (decision 322).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from steerflow import views
from steerflow.views import RunListing

if TYPE_CHECKING:
    from steerflow.studio._pages import RunsQuery

__all__ = ["SINCE", "SORTS", "listed", "runs_of", "since_epoch"]

#: Time-range filter values and their length in seconds.
SINCE: dict[str, float] = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0}
#: Sort values, their labels; the first is the default (newest first).
SORTS: dict[str, str] = {
    "newest": "newest first",
    "oldest": "oldest first",
    "duration": "longest first",
    "spend": "most spent first",
}


def since_epoch(since: str | None, *, now: float | None = None) -> float | None:
    """The earliest start a ``since`` value keeps (None: no time range)."""
    if not since or since not in SINCE:
        return None
    return (time.time() if now is None else now) - SINCE[since]


def _spent(run: RunListing) -> tuple[float, int]:
    usage = run.usage or {}
    cost = usage.get("cost_usd")
    tokens = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0)
    return (float(cost) if isinstance(cost, (int, float)) else 0.0, int(tokens))


def listed(
    home: Path,
    *,
    status: str | None,
    text: str,
    since: str,
    sort: str,
    page: int,
    size: int,
) -> tuple[list[RunListing], bool]:
    """``(one page of runs, whether more follow)`` for the Runs list's query."""
    start = since_epoch(since)
    if sort in ("newest", ""):
        found = views.list_runs(
            home, limit=size + 1, offset=page * size, status=status, text=text, since=start
        )
        return found[:size], len(found) > size
    every = views.list_runs(home, limit=None, status=status, text=text, since=start)
    if sort == "oldest":
        every.reverse()
    elif sort == "duration":
        every.sort(key=lambda r: r.duration_s or 0.0, reverse=True)
    elif sort == "spend":
        every.sort(key=_spent, reverse=True)
    chunk = every[page * size : (page + 1) * size + 1]
    return chunk[:size], len(chunk) > size


def runs_of(home: Path, query: RunsQuery, size: int) -> tuple[list[RunListing], bool]:
    """:func:`listed` for a Runs page query."""
    return listed(
        home,
        status=query.status,
        text=query.text,
        since=query.since,
        sort=query.sort,
        page=query.page,
        size=size,
    )
