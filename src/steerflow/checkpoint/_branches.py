"""Branch files: a node's persisted conversation, ``<run_dir>/branches/<key>.json``.

They sit beside the checkpoint unit because a resume restores from them what a replayed
node's dependents inherit.  They are not part of the checkpoint's durability contract:
a branch is written before its node's outcome is recorded, without fsync, and a missing
or unreadable one is degraded context (D5), never a refusal of the checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from steerflow.providers import Message

__all__ = ["BRANCHES_DIR", "load_branch", "save_branch"]

BRANCHES_DIR = "branches"
_ROLES = ("system", "user", "assistant")


def save_branch(run_dir: Path, key: str, messages: list[Message]) -> None:
    """Persist ``key``'s conversation, replacing any earlier one in one rename."""
    branches = run_dir / BRANCHES_DIR
    branches.mkdir(mode=0o700, exist_ok=True)
    data = json.dumps([{"role": m.role, "content": m.content} for m in messages])
    tmp = branches / f".{key}.{os.getpid()}.tmp"
    # O_NOFOLLOW: a symlink planted at the temporary name is never written through.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(data)
    os.replace(tmp, branches / f"{key}.json")


def load_branch(run_dir: Path, key: str) -> list[Message] | None:
    """A node's persisted conversation, or None if it was not persisted or is unreadable.

    Cases that still cannot be restored, and so count as degraded context when a node
    that will run inherits them: a branch file that is missing (the node finished but
    the process died before the file was written, or the file was deleted) or
    unreadable; and the private session state of agent workers (``claude-code/``,
    ``codex/``), which lives inside the worker, not in the branch we persist: only the
    prompt and the final reply are restored for those.
    """
    path = run_dir / BRANCHES_DIR / f"{key}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not isinstance(item, dict) or item.get("role") not in _ROLES:
            return None
        out.append(Message(item["role"], str(item.get("content", ""))))
    return out
