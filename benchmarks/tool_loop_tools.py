"""The tool of ``benchmarks/tool_loop.py``: one deterministic lookup, the same for every row.

Importable as ``benchmarks.tool_loop_tools`` (the repository root on ``PYTHONPATH``), so a
steerflow plan can name it as ``python:benchmarks.tool_loop_tools:lookup``.
"""

from __future__ import annotations

import hashlib


def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: The key to look up, such as ``k7``.

    Returns:
        The key's value: the first 16 hex digits of its SHA-256, the same on every call.
    """
    return f"{key}={hashlib.sha256(key.encode()).hexdigest()[:16]}"
