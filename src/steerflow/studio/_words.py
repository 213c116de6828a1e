"""Control rows in words: who sent one, what it asked, what came of it (CONTRACT §7)."""

from __future__ import annotations

__all__ = ["payload_words", "readable_result", "sender_of"]


def sender_of(sender: str | None) -> str:
    """Who queued a control, as the pages say it ("unknown": a row from before migration 7)."""
    return sender or "unknown"


def readable_result(result: str) -> str:
    """A stored control result (CONTRACT §7) in words; the claimant's host and pid kept."""
    head, _, rest = result.partition(":")
    if head == "applying":
        host, _, tail = rest.partition(":")
        pid = tail.partition(":")[0]
        return f"being applied by the flow on {host}" + (f" (pid {pid})" if pid else "")
    if head == "rejected":
        return "rejected: " + (rest.replace("-", " ") if rest else "no reason given")
    if head == "abandoned":
        return "abandoned" + (f" (resolved by {rest})" if rest else "")
    return result


def payload_words(verb: str, payload: object) -> str:
    """What the operator asked for, in words (never a Python repr of the stored row)."""
    if payload is None:
        return "-"
    if isinstance(payload, dict):
        if verb == "stop":
            how = "stop now (cancel calls in flight)" if payload.get("now") else "stop when idle"
            reason = payload.get("reason")
            return how + (f"; reason: {reason}" if reason else "")
        text = payload.get("text")
        if isinstance(text, str):
            return text
        return "; ".join(f"{k}: {_word(v)}" for k, v in payload.items() if v is not None) or "-"
    return str(payload)


def _word(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
