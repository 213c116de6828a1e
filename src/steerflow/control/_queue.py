"""The writers: ``ctl pause|resume|msg|stop`` insert rows, ``ctl resolve`` closes one (D1).

A writer only queues. Every refusal (missing state DB, unknown or ambiguous id,
session not running, invocation kind without a consumer for the verb) happens
before the insert, so a refused call leaves ``session_controls`` unchanged. Every
lock wait is bounded by :data:`DB_BUSY_TIMEOUT_S`; running past it raises
:class:`~steerflow.errors.DatabaseBusyError` ("database busy", exit 3).

The "session is running" check and the insert share one write transaction, and
``created_at`` is taken while that transaction holds the write lock, so rows are
stored in commit order (see :meth:`StateDB.insert_control`).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from steerflow._values import positive_usd, whole_number
from steerflow.errors import (
    KindNotAllowedError,
    RefusedError,
    UnknownIdError,
    UsageError,
    quote_input,
)
from steerflow.home import is_run_id
from steerflow.state import ControlRow, StateDB, normalize_state_db_url, this_host

__all__ = [
    "ALLOWED_KINDS",
    "DB_BUSY_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "UNENFORCEABLE_KEY",
    "CliVerb",
    "FrontEnd",
    "Queued",
    "check_budget",
    "check_message_text",
    "enqueue_control",
    "open_existing_db",
    "resolve_control",
    "send_control",
    "sender_id",
    "session_target",
]

CliVerb = Literal["pause", "resume", "message", "stop", "budget"]

FrontEnd = Literal["cli", "studio", "mcp", "api"]
"""Where a control was sent from: ``steerflow ctl``, the Studio, the MCP server, or the
Python writers (``steerflow.views`` and ``steerflow.resume``)."""

#: Longest user or host kept in a sender: the column is shown on every history row.
_SENDER_PART_CHARS = 64


def sender_id(front_end: FrontEnd) -> str:
    """Who is queuing a control from this process: ``<front end>:<user>@<host>:<pid>``.

    The user is the login name of the process (``getpass.getuser``; ``uid<N>`` when the
    system has no name for it), the host the one leases and claims name
    (``STEERFLOW_HOST_ID`` or the host name), so a sender and a claimant on one machine
    read alike (docs/decisions.md, decision 205).
    """
    if front_end not in get_args(FrontEnd):
        raise UsageError(f"unknown front end {front_end!r}: expected cli, studio, mcp or api")
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry (a bare container)
        user = f"uid{os.getuid()}"
    user = user[:_SENDER_PART_CHARS] or f"uid{os.getuid()}"
    return f"{front_end}:{user}@{this_host()[:_SENDER_PART_CHARS]}:{os.getpid()}"


#: ``sessions.node_metadata`` member a run writes when it starts: cap name (``max_cost``,
#: ``max_tokens``) -> why its models cannot enforce that cap (no price known, no usage
#: reported). ``ctl budget`` refuses such a cap before queuing it (decision 246).
UNENFORCEABLE_KEY = "unenforceable"

DB_BUSY_TIMEOUT_S = 10.0
#: Largest ``ctl msg`` text, in UTF-8 bytes.
MAX_MESSAGE_BYTES = 64 * 1024
"""Bound on every lock wait of a writer (ADR-0069 D1)."""

# Which invocation kinds have a consumer for each verb (D1, widened for message by ADR-0108).
ALLOWED_KINDS: dict[str, frozenset[str]] = {
    "pause": frozenset({"flow", "play"}),
    "resume": frozenset({"flow", "play"}),
    "message": frozenset({"flow", "play", "agent"}),
    # An agent stops after its current turn (``--now``: the turn is cancelled).
    "stop": frozenset({"flow", "play", "agent"}),
    # New caps for the whole resume chain, checked before the next admission (a turn).
    "budget": frozenset({"flow", "play", "agent"}),
}


@dataclass(frozen=True)
class Queued:
    """A control row that was inserted; it is queued, not applied."""

    control_id: str
    session_id: str
    verb: str
    #: Who queued it, as the row stores it (:func:`sender_id`).
    sender: str | None = None


def open_existing_db(
    home: Path, *, busy_timeout_s: float = DB_BUSY_TIMEOUT_S, state_db: str | None = None
) -> StateDB:
    """Open the state DB without creating the home, the file or anything in it.

    ``state_db``: a state DB URL (``--state-db``) instead of ``STEERFLOW_STATE_DB_URL``
    or ``<home>/state.db``.

    Raises:
        RefusedError: There is no state database (nothing to control).
        DatabaseBusyError: Opening waited on a lock past ``busy_timeout_s``.
        UsageError: ``state_db`` is malformed or names no supported backend.
    """
    if state_db is not None:
        url = normalize_state_db_url(state_db)
        return StateDB.open_url(url, create=False, busy_timeout_s=busy_timeout_s)
    return StateDB.open(home, create=False, busy_timeout_s=busy_timeout_s)


def check_message_text(text: str | None) -> str:
    """Refuse a steer message that is empty, blank, or over :data:`MAX_MESSAGE_BYTES`.

    A blank message would still consume the next operation's one steer pass; an
    unbounded one would be copied into every later prompt of the flow.
    """
    if text is None or not text.strip():
        raise UsageError("ctl msg needs a non-empty TEXT (it is empty or only whitespace)")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"ctl msg TEXT is {size} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (64 KiB)"
        )
    return text


def check_stop_reason(reason: str | None) -> str | None:
    """Refuse a ``ctl stop --reason`` over :data:`MAX_MESSAGE_BYTES`, as ``ctl msg`` does.

    The reason is kept in the row, the session's metadata and every result that names
    the stop, so it is held to the bound a steer message has.
    """
    if reason is None:
        return None
    size = len(reason.encode("utf-8", errors="surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"ctl stop --reason is {size} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (64 KiB)"
        )
    return reason


def enqueue_control(
    home: Path,
    target: str,
    verb: CliVerb,
    text: str | None = None,
    *,
    now: bool = False,
    busy_timeout_s: float = DB_BUSY_TIMEOUT_S,
    state_db: str | None = None,
    budget: dict[str, float | int | None] | None = None,
    via: FrontEnd = "api",
) -> Queued:
    """Insert one control row for the running session ``target`` resolves to.

    ``target`` is a session, invocation or play id, or a prefix of one: sessions
    are searched first, then invocations, then plays; several matches in the first
    table that has any are refused, and a full 32-character id is taken as is. A run
    id stands for the session that ran it (CONTRACT §12).

    For ``stop``, ``text`` is the optional operator reason and ``now`` asks for the
    in-flight operations to be cancelled too; both are kept in the row payload
    (``{"now": bool, "reason": str | None}``). ``state_db``: see :func:`open_existing_db`.
    ``via`` names the front end the row is sent from; it is stored with the user, host
    and pid as the row's ``sender`` (:func:`sender_id`).

    Raises:
        UsageError: A message without text, or a verb the CLI does not send.
        RefusedError: No state DB, the target points at a missing session, or a
            ``budget`` cap the session recorded it cannot enforce (no price known).
        UnknownIdError, AmbiguousIdError: The target does not resolve to one row (a run
            id no session ran).
        KindNotAllowedError: The invocation kind has no consumer for ``verb``.
        NotRunningError: The session is not running (a dead owner reads as interrupted).
        DatabaseBusyError: A lock wait ran past ``busy_timeout_s``.
    """
    if verb not in ALLOWED_KINDS:
        raise UsageError(
            f"unknown control verb {verb!r}: expected pause, resume, message, stop or budget"
        )
    if verb == "message":
        check_message_text(text)
    elif verb == "stop":
        check_stop_reason(text)
    elif verb == "budget":
        budget = check_budget(budget, via=via)
    sender = sender_id(via)
    with open_existing_db(home, busy_timeout_s=busy_timeout_s, state_db=state_db) as db:
        resolved = db.resolve_target(session_target(db, target))
        session = db.get_session(resolved.session_id)
        if session is None:
            raise RefusedError(f"target {quote_input(target)} points at a missing session")
        if verb == "budget" and db.effective_status(session) == "running":
            # A session that no longer runs is refused for that, by the insert below.
            _refuse_unenforceable(session.node_metadata, budget or {})
        kind = resolved.invocation_kind or session.kind
        if kind not in ALLOWED_KINDS[verb]:
            allowed = ", ".join(sorted(ALLOWED_KINDS[verb]))
            raise KindNotAllowedError(
                f"kind not allowed: {verb} is not accepted by an invocation of kind {kind!r} "
                f"(accepted: {allowed})"
            )
        payload: dict[str, object] | None = None
        if verb == "message":
            payload = {"text": text}
        elif verb == "stop":
            payload = {"now": now, "reason": text}
        elif verb == "budget":
            payload = dict(budget or {})
        row = db.insert_control(
            session_id=session.id,
            verb=verb,
            payload=payload,
            require_running=True,
            sender=sender,
        )
        return Queued(control_id=row.id, session_id=session.id, verb=verb, sender=row.sender)


def send_control(
    home: Path | str,
    target: str,
    verb: CliVerb,
    text: str | None = None,
    *,
    now: bool = False,
    state_db: str | None = None,
    budget: dict[str, float | int | None] | None = None,
    via: FrontEnd = "api",
) -> str:
    """:func:`enqueue_control` for the library's writers; returns the control id.

    ``target`` as :func:`enqueue_control` takes it (a run id too); ``via``: the sender's
    front end (:func:`sender_id`).

    Raises:
        As :func:`enqueue_control`.
    """
    return enqueue_control(
        Path(home), target, verb, text, now=now, state_db=state_db, budget=budget, via=via
    ).control_id


def session_target(db: StateDB, target: str) -> str:
    """``target`` as ``ctl`` takes it: a run id becomes the id of the session that ran it.

    Raises:
        UnknownIdError: A run id no session ran.
    """
    if not is_run_id(target):
        return target
    row = db.session_for_run(target)
    if row is None:
        raise UnknownIdError(f"unknown run id {quote_input(target)}: no session ran it")
    return row.id


def _refuse_unenforceable(meta: dict[str, object], budget: dict[str, float | int | None]) -> None:
    """Refuse a cap the session recorded it cannot enforce, for the reason it recorded.

    The run's poller would stamp the row ``rejected:unenforceable:<why>`` later; a
    caller told "queued" (exit 0) would take the cap as set (decision 246).
    """
    recorded = meta.get(UNENFORCEABLE_KEY)
    if not isinstance(recorded, dict):
        return
    for name in ("max_cost", "max_tokens"):
        why = recorded.get(name)
        if budget.get(name) is not None and isinstance(why, str):
            raise RefusedError(f"unenforceable: {why}")


def check_budget(
    budget: dict[str, float | int | None] | None, *, via: FrontEnd = "api"
) -> dict[str, float | int | None]:
    """``ctl budget``'s caps: at least one, each positive and finite (exit 2 otherwise).

    The checks of ``--max-cost``/``--max-tokens`` (``steerflow._values``); a refusal names
    the flag for ``ctl`` and the Studio (whose page speaks of flags), else the parameter
    (``max_cost``, ``max_tokens``: the Python writers, the MCP tool's arguments).
    """
    cli = via in ("cli", "studio")
    cost = (budget or {}).get("max_cost")
    tokens = (budget or {}).get("max_tokens")
    if cost is None and tokens is None:
        raise UsageError(
            "ctl budget needs --max-cost USD and/or --max-tokens N"
            if cli
            else "budget needs max_cost (USD) and/or max_tokens"
        )
    if cost is not None:
        cost = positive_usd(cost, "--max-cost" if cli else "max_cost")
    if tokens is not None:
        tokens = whole_number(tokens, "--max-tokens" if cli else "max_tokens", least=1)
    return {"max_cost": cost, "max_tokens": tokens}


def resolve_control(
    home: Path,
    control_id: str,
    outcome: Literal["applied", "abandoned"],
    by: str | None,
    *,
    busy_timeout_s: float = DB_BUSY_TIMEOUT_S,
) -> ControlRow:
    """Close a row left in ``applying`` by a claimant that never came back.

    Stores ``applied``, ``abandoned`` or ``abandoned:<by>``.

    Raises:
        UnknownIdError: No control has exactly this id.
        ControlNotApplyingError: The row is pending or terminal; it is left unchanged.
        DatabaseBusyError: A lock wait ran past ``busy_timeout_s``.
    """
    with open_existing_db(home, busy_timeout_s=busy_timeout_s) as db:
        return db.resolve_control(control_id, outcome=outcome, by=by)
