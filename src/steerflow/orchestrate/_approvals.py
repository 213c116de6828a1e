"""A run's approval desk wired to its session and its resume chain (issue 41).

The desk (``executor.ApprovalDesk``) holds what waits; here it is told which requests a
resumed run's checkpoint holds undecided, and it is handed the decisions an operator sent
to an earlier run of the chain that no process applied (sent while nothing ran, or taken
by a process that died before it journaled them). Those rows belong to sessions that no
longer run: this run stamps them itself, ``applied`` once the decision is journaled, or
the rejection (a second decision of a request, one for an unknown request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from steerflow.errors import SteerflowError
from steerflow.executor import ApprovalDesk
from steerflow.state import ControlRow, StateDB

__all__ = [
    "MAX_CHAIN",
    "adopt_chain_decisions",
    "chain_decision_rows",
    "know_requests",
    "publisher",
]

_log = logging.getLogger(__name__)

#: How many ``resumed_from`` links are followed, as for stranded messages.
MAX_CHAIN = 32


def publisher(
    db: StateDB, session_id: str
) -> Callable[[dict[str, dict[str, Any]]], Awaitable[None]]:
    """What publishes the desk's waiting requests: the session's ``node_metadata``.

    Written (a merge of that one key, in one transaction) before the node is shown
    waiting, so whoever learns of a request (an event, ``approvals``) can decide it at once.
    """

    async def publish(pending: dict[str, dict[str, Any]]) -> None:
        try:
            await asyncio.to_thread(
                db.update_node_metadata, session_id, {"approvals": pending or None}
            )
        except SteerflowError as exc:  # readers see it late; the wait itself is journaled
            _log.warning("could not publish the waiting approvals: %s", exc)

    return publish


def know_requests(desk: ApprovalDesk, steps: Iterable[Mapping[str, Any]]) -> None:
    """Tell the desk every request the checkpoint's steps hold undecided."""
    last: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for step in steps:
        if step["type"] == "approval":
            last[(str(step["record"]), str(step["key"]), int(step["index"]))] = step
    for step in last.values():
        if step["status"] == "awaiting":
            desk.know(step["data"], str(step["node"]))


def chain_decision_rows(db: StateDB, session_id: str | None) -> list[ControlRow]:
    """``approve``/``deny`` rows of the chain ending at ``session_id`` not yet stamped.

    Oldest first by ``(created_at, id)``, so the first decision sent is the one taken.
    """
    rows: list[ControlRow] = []
    seen: set[str] = set()
    current = session_id
    while current is not None and current not in seen and len(seen) < MAX_CHAIN:
        seen.add(current)
        session = db.get_session(current)
        if session is None:
            break
        rows += [
            row
            for row in db.list_controls(session.id)
            if row.verb in ("approve", "deny") and row.applied_at is None
        ]
        source = session.node_metadata.get("resumed_from")
        current = source if isinstance(source, str) and source else None
    return sorted(rows, key=lambda r: (r.created_at, r.id))


def _stamp(db: StateDB, row: ControlRow, result: str) -> None:
    claimant = (row.result or "").removeprefix("applying:") or None
    try:
        db.finalize_control(row.id, result, claimant=claimant)
    except SteerflowError as exc:  # left as it was: the next resume of the chain sees it
        _log.warning("could not stamp approval decision %s: %s", row.id, exc)


async def adopt_chain_decisions(db: StateDB, desk: ApprovalDesk, session_id: str | None) -> None:
    """Hand the chain's unapplied decisions to ``desk``; stamp each row as it is settled."""
    rows = await asyncio.to_thread(chain_decision_rows, db, session_id)
    taken: dict[str, ControlRow] = {}
    for row in rows:
        payload = row.payload if isinstance(row.payload, dict) else {}
        request_id = payload.get("request_id")
        result = (
            desk.decide(row.verb, request_id, payload, control_id=row.id, sender=row.sender)
            if isinstance(request_id, str)
            else "rejected:unknown-request"
        )
        if result is None:
            taken[row.id] = row
        else:
            await asyncio.to_thread(_stamp, db, row, result)

    def journaled(control_id: str) -> None:
        row = taken.pop(control_id, None)
        if row is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing: a resume retries
                asyncio.get_running_loop().run_in_executor(None, _stamp, db, row, "applied")

    desk.on_journaled.append(journaled)
