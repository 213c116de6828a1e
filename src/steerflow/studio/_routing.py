"""What every page's routes share: the studio's state for one home and the form helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

from starlette.requests import Request

from steerflow.control import check_budget
from steerflow.errors import UsageError
from steerflow.home import is_run_id
from steerflow.studio._actions import Starter
from steerflow.studio._live import LiveRuns
from steerflow.studio._security import csrf_token

__all__ = [
    "MAX_FORM_BYTES",
    "SESSION_ID",
    "VERBS",
    "Page",
    "StudioState",
    "field_of",
    "is_target",
    "read_form",
    "requested_caps",
]

#: The largest form body read: a message is at most 64 KiB, plus the other fields.
MAX_FORM_BYTES = 128 * 1024
SESSION_ID = re.compile(r"[0-9a-f]{32}")
VERBS = ("pause", "resume", "message", "stop", "budget")


@dataclass
class StudioState:
    """One studio's state: its home, CSRF token, live-answer cache and resume starter."""

    home: Path
    token: str
    csrf: str = ""
    answers: LiveRuns = field(init=False)
    starter: Starter = field(init=False)

    def __post_init__(self) -> None:
        self.csrf = csrf_token(self.token)
        self.answers = LiveRuns(self.home)
        self.starter = Starter(self.home)


class Page:
    """A page's handlers over the shared state (``self.home``, ``self.csrf``, ...)."""

    def __init__(self, state: StudioState) -> None:
        self.state = state
        self.home = state.home
        self.csrf = state.csrf
        self.answers = state.answers
        self.starter = state.starter


async def read_form(request: Request) -> dict[str, list[str]] | None:
    """An urlencoded form body, or None when it is larger than ``MAX_FORM_BYTES``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return parse_qs(b"".join(chunks).decode("utf-8", "replace"), keep_blank_values=True)


def field_of(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def is_target(target: str) -> bool:
    """A run id or a session id: the only targets the pages link to."""
    return is_run_id(target) or bool(SESSION_ID.fullmatch(target))


def requested_caps(max_cost: str | None, max_tokens: str | None) -> dict[str, float | int | None]:
    """A Set cap form's caps, checked as ``ctl budget`` checks them (``UsageError``: 400)."""
    cost: float | None = None
    tokens: int | None = None
    if max_cost and max_cost.strip():
        try:
            cost = float(max_cost)
        except ValueError:
            raise UsageError(f"--max-cost: {max_cost[:50]!r} is not a number of USD") from None
    if max_tokens and max_tokens.strip():
        try:
            tokens = int(max_tokens)
        except ValueError:
            raise UsageError(f"--max-tokens: {max_tokens[:50]!r} is not a whole number") from None
    return check_budget({"max_cost": cost, "max_tokens": tokens}, via="studio")
