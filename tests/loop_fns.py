"""``python:`` until functions the loop tests name (importable: tests/ is on sys.path)."""

from __future__ import annotations


def approved(replies: dict[str, object]) -> bool:
    """True once the critique says LGTM."""
    return "LGTM" in str(replies.get("critique", ""))


def never(replies: dict[str, object]) -> bool:
    """Never met."""
    return False


def broken(replies: dict[str, object]) -> bool:
    """Raises: the loop ends failed."""
    raise RuntimeError("judge unavailable")
