"""Functions tests name as ``python:tool_fns:NAME`` tools (issue 39).

Importable as ``tool_fns``: pytest puts ``tests/`` on ``sys.path``, and the CLI tests put it
on the child's ``PYTHONPATH``. Side effects go to ``$TOOL_LEDGER`` (one JSON line per
call), so a test counts, across processes and kills, how many times each call ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from waiting import wait_until


def _ledger(tool: str, **args: object) -> int:
    """Append one line for this call; the number of lines so far."""
    path = Path(os.environ["TOOL_LEDGER"])
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"tool": tool, **args}, sort_keys=True) + "\n")
        out.flush()
        os.fsync(out.fileno())
    return len(path.read_text(encoding="utf-8").splitlines())


def post(message: str) -> str:
    """Post a message to the team channel (a side effect: never twice).

    Args:
        message: What to post.
    """
    return f"posted #{_ledger('post', message=message)}"


def lookup(key: str) -> str:
    """Look a key up (read-only, so calling it again is harmless).

    Args:
        key: The key to look up.
    """
    _ledger("lookup", key=key)
    return f"value of {key}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def wait_for_release(tag: str) -> str:
    """Record that it started, then wait until ``$TOOL_RELEASE`` exists (bounded)."""
    _ledger("wait_for_release", tag=tag)
    release = Path(os.environ["TOOL_RELEASE"])
    wait_until(release.exists, timeout=60, what=f"{release} (the test's release)")
    return f"released {tag}"
