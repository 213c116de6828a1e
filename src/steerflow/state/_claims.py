"""One resume per source run: the claim check, the claim, and who resumed a run.

See docs/decisions.md, "One resume per source".

A resume writes its claim (``resume_claims``) in the same write transaction that
creates its session, after checking the claims already there, so two resumes of
one source started at the same moment are serialized by the write lock: the
second sees the first one's claim and is refused.

A claim counts while its holder can still matter:

* its holder session is alive (``running`` with a live owner): the source is
  being resumed right now;
* or its holder's run has published a checkpoint: the source was continued, and
  the work acknowledged there must be resumed from that run, not paid for again.

A claim whose holder is dead (``interrupted`` or finished) and whose run has no
checkpoint holds nothing a later resume could lose: it is dropped when the next
claim of the same source is taken. Whether a run has a checkpoint is a question
about files, so the caller answers it (``ResumeClaim.has_checkpoint``).

Before any claim counts, the source run itself must have stopped: while the
session that owns the source run directory is ``running`` with a live owner, it
still invokes the source's pending nodes, so any resume of it (``--fork``
included) would pay for them a second time. A source whose owner died
(``interrupted``) or that finished is resumable.

"Live" is judged with the lease (decision 120, :func:`steerflow.state._lease.holds_lease`):
by the process table on the owner's own host, else by ``lease_expires`` against the
database's clock, read in the claiming transaction. A ``running`` session judged dead
that way (the source's owner, or a resume whose claim is dropped) is *taken over*: the
claiming transaction raises its ``lease_epoch`` and names itself in ``lease_taken_by``,
so that session, should it wake up, finds every fenced write refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from steerflow.errors import ResumeClaimedError
from steerflow.state._lease import dead_on_this_host, holds_lease
from steerflow.state._owner import HEARTBEAT_STALE_S, effective_status
from steerflow.state._schema import SessionRow, SessionStatus, StateTransaction

__all__ = [
    "ClaimCheck",
    "ResumeClaim",
    "ResumedBy",
    "check_claim",
    "db_clock",
    "record_claim",
    "resumed_by",
    "take_over",
]

_HOLDERS_SQL = (
    "SELECT c.source_run_id AS claim_source, c.fork AS claim_fork,"
    " c.created_at AS claim_created, s.* FROM resume_claims c"
    " JOIN sessions s ON s.id = c.session_id"
)


@dataclass(frozen=True)
class ResumeClaim:
    """What a resume asks for.

    Attributes:
        source_run_id: The run being resumed.
        fork: An explicit branch (``resume --fork``): never refused by other claims.
        has_checkpoint: Whether the run with this id has published a checkpoint.
    """

    source_run_id: str
    fork: bool
    has_checkpoint: Callable[[str], bool]


@dataclass(frozen=True)
class ResumedBy:
    """One resume of a run, for ``runs`` and ``show``.

    Attributes:
        session_id: The resuming session.
        run_id: Its run, if it got one.
        fork: Whether it was started with ``--fork``.
        status: Its effective status (a dead owner reads ``interrupted``).
        created_at: When the claim was taken (epoch seconds).
    """

    session_id: str
    run_id: str | None
    fork: bool
    status: SessionStatus
    created_at: float

    def to_json(self) -> dict[str, Any]:
        """The JSON form used by ``runs --json`` and ``show --json``."""
        return {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "fork": self.fork,
            "status": self.status,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class ClaimCheck:
    """What :func:`check_claim` found besides a refusal.

    Attributes:
        stale: Session ids of dead claims without a checkpoint, to drop when claiming.
        takeover: ``running`` sessions judged dead by their lease (or on this host by
            the process table): the claim takes them over (:func:`take_over`).
    """

    stale: list[str]
    takeover: list[SessionRow]


@dataclass(frozen=True)
class _Holder:
    fork: bool
    row: SessionRow
    live: bool


def _holders(tx: StateTransaction, source_run_id: str, db_now: float) -> list[_Holder]:
    rows = tx.query(
        _HOLDERS_SQL + " WHERE c.source_run_id = ? ORDER BY c.created_at, c.session_id",
        (source_run_id,),
    )
    out = []
    for raw in rows:
        row = SessionRow.from_mapping(raw)
        out.append(_Holder(bool(raw["claim_fork"]), row, holds_lease(row, db_now)))
    return out


def _counts(holder: _Holder, has_checkpoint: Callable[[str], bool]) -> bool:
    return holder.live or (holder.row.run_id is not None and has_checkpoint(holder.row.run_id))


def _successor(
    tx: StateTransaction, run_id: str, has_checkpoint: Callable[[str], bool], db_now: float
) -> _Holder | None:
    """The run that continued ``run_id``: its plain resume, else its newest fork."""
    counted = [h for h in _holders(tx, run_id, db_now) if _counts(h, has_checkpoint)]
    plain = [h for h in counted if not h.fork]
    if plain:
        return plain[0]
    return counted[-1] if counted else None


def _newest(
    tx: StateTransaction, first: _Holder, has_checkpoint: Callable[[str], bool], db_now: float
) -> _Holder:
    newest, seen = first, {first.row.id}
    while newest.row.run_id is not None:
        nxt = _successor(tx, newest.row.run_id, has_checkpoint, db_now)
        if nxt is None or nxt.row.id in seen:
            break
        newest = nxt
        seen.add(nxt.row.id)
    return newest


def _owner_text(row: SessionRow) -> str:
    return f", pid {row.owner_pid} on {row.owner_host}" if row.owner_pid is not None else ""


def _running_owners(tx: StateTransaction, run_id: str) -> list[SessionRow]:
    """The sessions that own run ``run_id`` and are stored ``running``, oldest first."""
    rows = tx.query(
        "SELECT * FROM sessions WHERE run_id = ? AND status = 'running' ORDER BY created_at, id",
        (run_id,),
    )
    return [SessionRow.from_mapping(raw) for raw in rows]


def _lease_text(row: SessionRow, db_now: float) -> str:
    if row.lease_expires is None or row.lease_expires < db_now:
        return ""
    return f"; its lease runs {row.lease_expires - db_now:.0f} s more by the state DB's clock"


def _refuse_live_source(tx: StateTransaction, source: str, db_now: float) -> list[SessionRow]:
    """Refuse while the source's owner holds its lease; else the owners to take over."""
    owners = _running_owners(tx, source)
    owner = next((row for row in owners if holds_lease(row, db_now)), None)
    if owner is None:
        return owners
    raise ResumeClaimedError(
        f"run {source} is still running (session {owner.id}{_owner_text(owner)}"
        f"{_lease_text(owner, db_now)}); "
        f"resuming it now would run its pending nodes a second time, and so would --fork. "
        f"Stop it first (Ctrl-C / SIGINT to its process: completed work is saved; "
        f"`steerflow ctl pause {owner.id}` only holds new operations, the run stays live), "
        f"or wait for it to finish, then: steerflow resume {source}",
        holder_session_id=owner.id,
        newest_run_id=source,
    )


def db_clock(tx: StateTransaction, clock_sql: str) -> float:
    """The database's clock, read inside ``tx`` (see ``StateBackend.clock_sql``)."""
    return float(tx.query(f"SELECT {clock_sql} AS now")[0]["now"])


def check_claim(tx: StateTransaction, claim: ResumeClaim, db_now: float) -> ClaimCheck:
    """Refuse ``claim`` if its source still runs, or another resume holds or continued it.

    Args:
        tx: The claiming (or preflight) transaction.
        claim: What the resume asks for.
        db_now: The database's clock in ``tx`` (:func:`db_clock`): leases expire by it.

    Returns:
        The dead claims to drop and the ``running`` sessions to take over.

    Raises:
        ResumeClaimedError: The source run's own session still holds its lease (fork
            or not); or, not a fork, a live resume holds the source, or a resume of it
            has published a checkpoint.
    """
    source = claim.source_run_id
    takeover = _refuse_live_source(tx, source, db_now)
    holders = _holders(tx, source, db_now)
    dropped = [h for h in holders if not _counts(h, claim.has_checkpoint)]
    # A dropped claim whose session is still stored running (stalled past its lease)
    # must be fenced too, or it would wake up and run the source's pending nodes.
    takeover += [h.row for h in dropped if h.row.status == "running"]
    check = ClaimCheck([h.row.id for h in dropped], takeover)
    if claim.fork:
        return check
    live = [h for h in holders if h.live]
    if live:
        holder = live[0].row
        raise ResumeClaimedError(
            f"run {source} is being resumed right now by session {holder.id} (run "
            f"{holder.run_id}{_owner_text(holder)}); only one resume of a run may proceed. "
            f"When it stops, resume its run {holder.run_id}, or pass --fork to branch "
            f"from {source} on purpose (its pending nodes run, and are paid for, again)",
            holder_session_id=holder.id,
            newest_run_id=holder.run_id,
        )
    first = _successor(tx, source, claim.has_checkpoint, db_now)
    if first is None:
        return check
    newest = _newest(tx, first, claim.has_checkpoint, db_now)
    running = " (still running)" if newest.live else ""
    raise ResumeClaimedError(
        f"run {source} was already resumed by run {first.row.run_id} (session "
        f"{first.row.id}), which has a checkpoint; resuming {source} again would run its "
        f"pending nodes a second time. Resume the newest run of that chain instead: "
        f"steerflow resume {newest.row.run_id}{running}; or pass --fork to branch from "
        f"{source} on purpose",
        holder_session_id=first.row.id,
        newest_run_id=newest.row.run_id,
    )


def record_claim(
    tx: StateTransaction,
    claim: ResumeClaim,
    session_id: str,
    now: float,
    stale: Sequence[str],
) -> None:
    """Write the claim of ``session_id`` (already inserted in ``tx``) and drop ``stale`` ones."""
    for dead in stale:
        tx.execute("DELETE FROM resume_claims WHERE session_id = ?", (dead,))
    tx.execute(
        "INSERT INTO resume_claims (session_id, source_run_id, fork, created_at)"
        " VALUES (?, ?, ?, ?)",
        (session_id, claim.source_run_id, int(claim.fork), now),
    )


# The condition re-checked by the takeover's UPDATE itself: on PostgreSQL an owner's renewal
# may commit between the check and the update, and the update then matches no row.
_TAKE_OVER_SQL = (
    "UPDATE sessions SET status = 'interrupted', lease_epoch = ?, lease_taken_by = ?,"
    " updated_at = ? WHERE id = ? AND status = 'running' AND lease_epoch = ?"
    " AND (? = 1 OR COALESCE(lease_expires, heartbeat_at + ?, 0) < {clock})"
)


def take_over(
    tx: StateTransaction,
    rows: Sequence[SessionRow],
    by_session: str,
    epoch: int,
    now: float,
    clock_sql: str,
) -> None:
    """Fence every session of ``rows``: status ``interrupted``, ``lease_epoch`` = ``epoch``.

    ``epoch`` is the new owner's token, above every taken-over one. A row judged dead by
    the process table of this host is taken over whatever its lease says (a dead process
    writes nothing); any other only while its lease is still expired at this statement.

    Raises:
        ResumeClaimedError: An owner renewed its lease meanwhile; the caller's
            transaction rolls back, nothing is written.
    """
    sql = _TAKE_OVER_SQL.format(clock=clock_sql)
    for row in rows:
        params = (epoch, by_session, now, row.id, row.lease_epoch, int(dead_on_this_host(row)),
                  HEARTBEAT_STALE_S)  # fmt: skip
        if tx.execute(sql, params) != 1:
            raise ResumeClaimedError(
                f"session {row.id} (run {row.run_id}{_owner_text(row)}) renewed its lease "
                f"while this resume checked it: it is still running; try again once it stops",
                holder_session_id=row.id,
                newest_run_id=row.run_id,
            )


def resumed_by(tx: StateTransaction, run_ids: Sequence[str]) -> dict[str, list[ResumedBy]]:
    """Every resume of each run in ``run_ids``, oldest first (runs never resumed are absent)."""
    out: dict[str, list[ResumedBy]] = {}
    unique = list(dict.fromkeys(run_ids))
    for start in range(0, len(unique), 500):  # stay under any bound-parameter limit
        chunk = unique[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        rows = tx.query(
            _HOLDERS_SQL + f" WHERE c.source_run_id IN ({marks})"
            " ORDER BY c.created_at, c.session_id",
            chunk,
        )
        for raw in rows:
            row = SessionRow.from_mapping(raw)
            out.setdefault(str(raw["claim_source"]), []).append(
                ResumedBy(
                    session_id=row.id,
                    run_id=row.run_id,
                    fork=bool(raw["claim_fork"]),
                    status=effective_status(row),
                    created_at=float(raw["claim_created"]),
                )
            )
    return out
