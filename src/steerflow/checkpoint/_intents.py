"""Write-ahead call intents: a paid call recorded before it leaves the process.

A version 3 journal may hold, beside outcomes, a record of kind ``intent``: a call
that was about to leave (a model request, a function node, an agent turn) with the
reservation the spend meter made for it.  It is acknowledged (written and fsync'd)
before the request is sent, and the outcome of the node it belongs to closes it: a
``completed`` or ``failed`` entry recorded under the same record kind and key.  An
intent with no outcome after the valid prefix is a call that may have been paid and
whose result nobody has: a resume lists it (``in_flight_calls``) and counts its
reservation as spent against the chain's cap (issue 38, decision 217).

An intent entry carries exactly :data:`INTENT_MEMBERS` plus its ``result_digest``, a
BLAKE2b digest over every other member, so an edited reservation, node or model is
refused like an edited response.  A base carries the intents still open when it was
published as ``in_flight`` (present only when some are).

The ``type`` member says what kind of call it is (``call`` today); a tool call of an
agent's step loop will be an intent of its own type closed by its step's record.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._digest import result_digest

__all__ = [
    "INTENT_MEMBERS",
    "InFlightCall",
    "IntentError",
    "check_intent",
    "closed_by",
    "in_flight_call",
    "intent_digest",
]

#: Every member of an intent entry besides ``result_digest``.
INTENT_MEMBERS = (
    "call_id",
    "type",
    "node",
    "record",
    "key",
    "attempt",
    "model",
    "started_at",
    "reserved_cost_usd",
    "reserved_tokens",
)
_TYPES = frozenset({"call"})
_CALL_ID = re.compile(r"[0-9a-f]{32}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
#: The statuses of an outcome that closes its node's open intents.
_FINAL = frozenset({"completed", "failed"})


class IntentError(ValueError):
    """An intent fails the format rules; ``detail`` says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def intent_digest(entry: Mapping[str, object]) -> str:
    """The ``result_digest`` of an intent: over every member but the digest itself."""
    return result_digest({name: entry.get(name) for name in INTENT_MEMBERS})


def _number(value: object, *, integral: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integral:
        return isinstance(value, int) and value >= 0
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def check_intent(entry: object, *, sealed: bool = True) -> None:
    """Validate one intent entry (raise :class:`IntentError`); ``sealed``: digest checked."""
    if not isinstance(entry, dict):
        raise IntentError("intent is not an object")
    allowed = {*INTENT_MEMBERS, "result_digest"} if sealed else set(INTENT_MEMBERS)
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise IntentError(f"intent has unknown members {unknown!r}")
    missing = [name for name in INTENT_MEMBERS if name not in entry]
    if sealed and "result_digest" not in entry:
        missing.append("result_digest")
    if missing:
        raise IntentError(f"intent lacks {missing!r}")
    if not isinstance(entry["call_id"], str) or not _CALL_ID.fullmatch(entry["call_id"]):
        raise IntentError("intent call_id is not 32 lowercase hex characters")
    if entry["type"] not in _TYPES:
        raise IntentError("intent type is not 'call'")
    for name in ("node", "key"):
        if not isinstance(entry[name], str) or not _ID.fullmatch(entry[name]):
            raise IntentError(f"intent {name} is not an id")
    if entry["record"] not in ("op", "spawn"):
        raise IntentError("intent record is not 'op' or 'spawn'")
    attempt = entry["attempt"]
    if not _number(attempt, integral=True) or attempt < 1:
        raise IntentError("intent attempt is not a positive integer")
    if entry["model"] is not None and not isinstance(entry["model"], str):
        raise IntentError("intent model is not a string or null")
    if not _number(entry["started_at"], integral=False):
        raise IntentError("intent started_at is not a time")
    cost, tokens = entry["reserved_cost_usd"], entry["reserved_tokens"]
    if cost is not None and not _number(cost, integral=False):
        raise IntentError("intent reserved_cost_usd is not a non-negative number or null")
    if tokens is not None and not _number(tokens, integral=True):
        raise IntentError("intent reserved_tokens is not a non-negative integer or null")
    if sealed and entry["result_digest"] != intent_digest(entry):
        raise IntentError("intent result_digest does not match its members")


def closed_by(kind: str, entry: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``(record, key)`` whose open intents an outcome entry closes, or None.

    Only a final outcome closes: a spawned ``pending`` entry is spawn intent, not a call.
    """
    if entry.get("status") not in _FINAL:
        return None
    key = entry.get("agent_id") if kind == "op" else entry.get("node_id")
    return (kind, key) if isinstance(key, str) else None


@dataclass(frozen=True)
class InFlightCall:
    """An intent no outcome closed: a call that left and may have been paid."""

    call_id: str
    node: str
    attempt: int
    model: str | None
    started_at: float
    reserved_cost_usd: float | None
    reserved_tokens: int | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """One ``in_flight_calls[]`` member (CONTRACT §12), plus the call id and tokens."""
        return {
            "node": self.node,
            "attempt": self.attempt,
            "model": self.model,
            "started_at": self.started_at,
            "reserved_cost_usd": self.reserved_cost_usd,
            "reserved_tokens": self.reserved_tokens,
            "call_id": self.call_id,
        }


def in_flight_call(raw: Mapping[str, Any]) -> InFlightCall:
    """Type one checked intent entry."""
    return InFlightCall(
        call_id=raw["call_id"],
        node=raw["node"],
        attempt=raw["attempt"],
        model=raw["model"],
        started_at=float(raw["started_at"]),
        reserved_cost_usd=raw["reserved_cost_usd"],
        reserved_tokens=raw["reserved_tokens"],
        raw=raw,
    )
