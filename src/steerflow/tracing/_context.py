"""``<run_dir>/trace.json``: a run's root span, so the run that resumes it can link to it.

A resume reads its source run's file and links its own root span to that one (and, with
no application span around it, continues that trace: decision 383). The file is created
once, 0600, never through a symlink; a missing or unreadable one only loses the link.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["TRACE_FILE", "read_root", "write_root"]

TRACE_FILE = "trace.json"
_HEX_TRACE, _HEX_SPAN = 32, 16


def write_root(run_dir: Path, trace_id: int, span_id: int) -> None:
    """Record the run's root span (best effort: tracing never fails a run)."""
    body = json.dumps({"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"})
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(run_dir / TRACE_FILE, flags, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(body)


def read_root(run_dir: Path) -> tuple[int, int] | None:
    """``(trace_id, span_id)`` of the run's root span, or None when not recorded."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(run_dir / TRACE_FILE, flags)
        with os.fdopen(fd, encoding="utf-8") as src:
            data = json.loads(src.read(4096))
        trace_hex, span_hex = str(data["trace_id"]), str(data["span_id"])
        if len(trace_hex) != _HEX_TRACE or len(span_hex) != _HEX_SPAN:
            return None
        trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (trace_id, span_id) if trace_id and span_id else None
