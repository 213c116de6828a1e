"""Operator messages a dead process left behind in a resume chain (issue 26 item 2).

A message row of a session that no longer runs is *stranded* when nothing will ever
deliver it:

* ``pending``: no consumer claimed it before the process died (an agent claims a
  message only when the turn that renders it starts, so one sent during the turn
  it died in is pending). Nobody applied it, so it is re-queued into the resumed run
  without asking: no duplicate is possible (decision 110);
* ``applying``: the dead process claimed it and the checkpoint does not show it
  delivered (no recorded turn or operation, and no turn in flight, took it). D3
  allows the loss; the resume lists it, and re-queues it only with
  ``resume --redeliver-claimed``, the operator's choice between losing it and
  possibly delivering it twice;
* ``applying`` and taken by the agent's turn in flight (issue 38 item 5): the dead
  agent recorded that turn's prompt with it (``next``) but died before its stamp. The
  resume runs that turn with it, so it is listed with ``delivered_in`` (the turn) and
  never re-queued, and the resumed run stamps the old row ``applied`` (conditionally,
  on the claim it was seen with) once its first checkpoint, which holds that prompt,
  is published: the stamp an agent writes once the turn a message starts is durable.

Every session of the chain is looked at (the source, the run it resumed, and so on,
at most :data:`MAX_CHAIN` hops), because an earlier resume that did not re-queue a
message left it where it was. Re-queueing writes, per message and in one
transaction, a new pending row of the resumed session (payload ``redelivered_from``)
and stamps the old row ``abandoned:redelivered:<new control id>``; it runs once the
resumed run's first checkpoint is published, so a resume that dies before that point
leaves the rows where the next resume of the same source finds them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from steerflow.errors import SteerflowError
from steerflow.state import ControlRow, SessionRow, StateDB, db_exists, effective_status

__all__ = [
    "MAX_CHAIN",
    "ChainControls",
    "StrandedMessage",
    "read_chain",
    "redeliver_stranded",
    "rendered_into",
    "stranded_notes",
]

_log = logging.getLogger(__name__)

#: How many ``resumed_from`` links are followed (a loop in hand-edited data stops here).
MAX_CHAIN = 32

StrandedState = Literal["pending", "applying"]


@dataclass
class StrandedMessage:
    """One message of the chain that nothing will deliver unless it is re-queued."""

    control_id: str
    session_id: str
    run_id: str | None
    text: str
    #: When the operator sent it (the row's ``created_at``, epoch seconds).
    sent_at: float
    state: StrandedState
    #: ``applying:<claimant>``'s claimant (host, pid, executor), None for ``pending``.
    claimant: str | None
    #: The node or turn that had taken it, when known (``turn-3``, ``review``).
    claimed_by: str | None
    #: The control id of the row it was re-queued as, once re-queued.
    redelivered_as: str | None = None
    #: Who sent it (``control.sender_id``), None for a row from before senders were kept.
    sender: str | None = None
    #: The turn of the resumed run that delivers it: the dead agent's turn in flight,
    #: whose prompt the checkpoint recorded with it. None for every other message.
    delivered_in: str | None = None

    @property
    def redelivered_without_asking(self) -> bool:
        """Never claimed, so re-queueing it cannot deliver it twice."""
        return self.state == "pending"

    @property
    def requeued(self) -> bool:
        """Whether a resume re-queues it (``claimed``: with ``--redeliver-claimed``)."""
        return self.delivered_in is None

    def to_json(self) -> dict[str, Any]:
        """The ``stranded_messages[]`` member of ``resume --json`` and the preflight."""
        return {
            "control_id": self.control_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "text": self.text,
            "sent_at": self.sent_at,
            "state": self.state,
            "claimant": self.claimant,
            "claimed_by": self.claimed_by,
            "redelivered_as": self.redelivered_as,
            "sender": self.sender,
            "delivered_in": self.delivered_in,
        }

    def describe(self, *, redeliver_claimed: bool) -> str:
        """One warning line: what it is, and what this resume does with it."""
        sent = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.sent_at))
        text = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        head = f"operator message {self.control_id} ({text!r}, sent {sent}"
        if self.state == "pending":
            return (
                f"{head}) was never claimed: run {self.run_id} died first; the resume "
                "re-queues it into the resumed run (it cannot be delivered twice)"
            )
        who = f", claimed by {self.claimed_by}" if self.claimed_by else ""
        head += f"{who}) was left applying by a dead process ({self.claimant})"
        if self.delivered_in is not None:
            turn = self.delivered_in
            return (
                f"{head}, after the checkpoint recorded {turn}'s prompt with it: the resume "
                f"runs {turn} with it (delivered once, not re-queued) and stamps it applied"
            )
        if redeliver_claimed:
            return (
                f"{head}; --redeliver-claimed re-queues it into the resumed run (if the dead "
                "process had delivered it, it is delivered twice)"
            )
        return (
            f"{head}: it is lost (at most once, D3). `steerflow resume --redeliver-claimed` "
            "re-queues it instead (a possible duplicate)"
        )


@dataclass
class ChainControls:
    """The message rows of every session of a resume chain, read once."""

    home: Path
    #: The chain's sessions, the source first.
    sessions: tuple[SessionRow, ...] = ()
    #: ``(session, row)`` per message row, in the sessions' order, oldest row first.
    messages: tuple[tuple[SessionRow, ControlRow], ...] = ()
    _steers: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    def published_taker(self, session_id: str, control_id: str) -> str | None:
        """The node a session published as steered by ``control_id`` (its ``steers``).

        Read from the live node status on first use per session: only the few rows a
        resume has to explain need it, and a large run has many nodes.
        """
        if session_id not in self._steers:
            found: dict[str, str] = {}
            with StateDB.open(self.home, create=False) as db:
                for node in db.list_nodes(session_id):
                    taken = (node.detail or {}).get("steers")
                    for control in taken if isinstance(taken, list) else []:
                        if isinstance(control, str):
                            found.setdefault(control, node.node_key)
            self._steers[session_id] = found
        return self._steers[session_id].get(control_id)

    @property
    def applied(self) -> list[tuple[SessionRow, ControlRow]]:
        """Messages stamped ``applied``: some turn or operation was started with each."""
        return [(s, row) for s, row in self.messages if row.result == "applied"]

    def stranded(
        self,
        delivered: Collection[str],
        claimed_by: Callable[[SessionRow, ControlRow], str | None],
        in_flight: Mapping[str, str] | None = None,
    ) -> list[StrandedMessage]:
        """Rows of dead sessions left pending, or claimed and not ``delivered``.

        ``in_flight`` maps the controls of an agent's turn in flight (its prompt recorded,
        its messages maybe never stamped) to that turn: such a row left applying is listed
        too, as delivered by that turn (``delivered_in``).
        """
        out: list[StrandedMessage] = []
        for session, row in self.messages:
            if effective_status(session) == "running":
                continue  # its own process may still take it (not a chain a resume starts)
            turn = (in_flight or {}).get(row.id) if row.is_applying else None
            if row.is_pending:
                state: StrandedState = "pending"
            elif row.is_applying and (turn is not None or row.id not in delivered):
                state = "applying"
            else:
                continue
            payload = row.payload if isinstance(row.payload, dict) else {}
            text = payload.get("text", "")
            out.append(
                StrandedMessage(
                    control_id=row.id,
                    session_id=session.id,
                    run_id=session.run_id,
                    text=text if isinstance(text, str) else str(text),
                    sent_at=row.created_at,
                    state=state,
                    claimant=(row.result or "").removeprefix("applying:") or None
                    if state == "applying"
                    else None,
                    claimed_by=(turn or claimed_by(session, row)) if state == "applying" else None,
                    sender=row.sender,
                    delivered_in=turn,
                )
            )
        return out


def read_chain(home: Path, session_id: str | None) -> ChainControls:
    """The message rows of ``session_id``'s resume chain (none without a state DB)."""
    if session_id is None or not db_exists(home):
        return ChainControls(home)
    with StateDB.open(home, create=False) as db:
        sessions: list[SessionRow] = []
        current: str | None = session_id
        while current is not None and len(sessions) < MAX_CHAIN:
            row = db.get_session(current)
            if row is None or any(s.id == row.id for s in sessions):
                break
            sessions.append(row)
            source = row.node_metadata.get("resumed_from")
            current = source if isinstance(source, str) and source else None
        messages = [
            (session, control)
            for session in sessions
            for control in db.list_controls(session.id)
            if control.verb == "message"
        ]
    return ChainControls(home, tuple(sessions), tuple(messages))


def stranded_notes(stranded: list[StrandedMessage], *, redeliver_claimed: bool) -> list[str]:
    """One warning per stranded message (``resume`` and ``resume --dry-run`` print them)."""
    return [m.describe(redeliver_claimed=redeliver_claimed) for m in stranded]


def _redeliver(
    db: StateDB, stranded: list[StrandedMessage], session_id: str, claimed: bool
) -> None:
    for message in stranded:
        if not message.requeued:
            # Delivered by the resumed turn (its prompt is in the checkpoint just
            # published): close the dead claimant's row as that claimant would have.
            try:
                db.finalize_control(message.control_id, "applied", claimant=message.claimant)
            except SteerflowError as exc:  # still applying: a later resume lists it again
                _log.warning("could not stamp message %s applied: %s", message.control_id, exc)
            continue
        if message.state == "applying" and not claimed:
            continue
        seen = None if message.state == "pending" else f"applying:{message.claimant}"
        try:
            row = db.redeliver_control(message.control_id, seen=seen, to_session=session_id)
        except SteerflowError as exc:  # the row stays where it was: a later resume finds it
            _log.warning("could not re-queue message %s: %s", message.control_id, exc)
            continue
        if row is not None:
            message.redelivered_as = row.id


async def redeliver_stranded(
    db: StateDB, stranded: list[StrandedMessage], session_id: str, *, claimed: bool
) -> None:
    """Re-queue the stranded messages into ``session_id`` (``applying`` ones if ``claimed``).

    Each one that is re-queued gets its new control id in ``redelivered_as``; one whose
    row changed meanwhile (another resume took it) is left as it is. One the resumed
    run's turn in flight delivers (``delivered_in``) is stamped ``applied`` instead, only
    while it still reads ``applying:<its claimant>``.
    """
    if stranded:
        await asyncio.to_thread(_redeliver, db, stranded, session_id, claimed)


def rendered_into(flow_context: Mapping[str, Any]) -> dict[str, str]:
    """``control_id -> node key`` of every message a flow operation took."""
    messages = flow_context.get("operator_messages")
    out: dict[str, str] = {}
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            control, node = message.get("control_id"), message.get("rendered_into_op")
            if isinstance(control, str) and isinstance(node, str):
                out[control] = node
    return out
