"""The tools of ``benchmarks/tool_loop.py`` and ``benchmarks/tool_kills.py``.

Importable as ``benchmarks.tool_loop_tools`` (the repository root on ``PYTHONPATH``), so a
steerflow plan can name them as ``python:benchmarks.tool_loop_tools:lookup`` (or ``:charge``).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

#: The file ``charge`` appends one line to per call: ``KEY PID``.
LEDGER_ENV = "TOOL_KILLS_LEDGER"
#: The key whose ``charge`` blocks after its line is written, so a kill finds it in flight.
HANG_ENV = "TOOL_KILLS_HANG"
#: How long a hanging ``charge`` waits for the kill before it gives up and fails.
HANG_LIMIT_S = 120.0


def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: The key to look up, such as ``k7``.

    Returns:
        The key's value: the first 16 hex digits of its SHA-256, the same on every call.
    """
    return f"{key}={hashlib.sha256(key.encode()).hexdigest()[:16]}"


def charge(key: str) -> str:
    """Charge the account stored under a key (a side effect: never twice for one key).

    Args:
        key: The account's key, such as ``k7``.

    Returns:
        A receipt naming the key.
    """
    ledger = os.environ[LEDGER_ENV]
    # One write(2) on an O_APPEND descriptor: a line is whole in the file before the call
    # goes on, so the parent's kill always comes after it.
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    if key == os.environ.get(HANG_ENV):
        # In flight until the parent's SIGKILL: wait for a file nobody writes, bounded, so a
        # run the parent lost track of ends on its own.
        release = Path(f"{ledger}.release")
        deadline = time.monotonic() + HANG_LIMIT_S
        while not release.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"charge({key!r}) was never killed")
            time.sleep(0.05)
    return f"charged {key}"
