"""The only module that writes to stdout; progress and diagnostics go to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["emit_json", "emit_text", "warn"]


def emit_json(obj: dict[str, Any]) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def emit_text(text: str) -> None:
    """Print human-readable text on stdout."""
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


def warn(text: str) -> None:
    """Print a diagnostic on stderr."""
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()
