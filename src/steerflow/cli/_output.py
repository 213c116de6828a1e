"""The only module that writes to stdout; progress and diagnostics go to stderr."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["emit_chunk", "emit_json", "emit_raw", "emit_text", "printable", "warn"]

# C0 controls except tab and newline, DEL, and C1 controls: the bytes a terminal acts on
# (ESC sequences clear the screen or set the title; OSC/CSI can hide or forge text).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_AND_NEWLINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(text: object, *, keep_newlines: bool = False) -> str:
    r"""``text`` with every control character but tab shown visibly (``\x1b``).

    Anything that came from outside (model replies, server errors, plan values, control
    payloads) goes through this before it reaches a terminal in human mode; ``--json``
    output stays exact. ``keep_newlines`` keeps line breaks for multi-line blocks.
    """
    pattern = _CONTROLS if keep_newlines else _CONTROLS_AND_NEWLINE
    return pattern.sub(_escape, str(text))


def emit_json(obj: dict[str, Any]) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def emit_raw(text: str) -> None:
    """Print ``text`` byte for byte (UTF-8, no newline added): ``show --raw`` for pipes."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # an in-memory stream (tests, embedding): it holds text, not bytes
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    sys.stdout.flush()
    buffer.write(text.encode("utf-8", "surrogatepass"))
    buffer.flush()


def emit_text(text: str) -> None:
    """Print human-readable text on stdout, control characters escaped (newlines kept).

    The last line of defence: callers still pass single-line fields through
    :func:`printable` so that an embedded newline cannot forge a line of its own.
    """
    sys.stdout.write(printable(text.rstrip("\n"), keep_newlines=True) + "\n")
    sys.stdout.flush()


def emit_chunk(text: str) -> None:
    """Print live output as it came (no newline added), control characters escaped."""
    sys.stdout.write(printable(text, keep_newlines=True))
    sys.stdout.flush()


def warn(text: str) -> None:
    """Print a diagnostic on stderr, control characters escaped (newlines kept)."""
    sys.stderr.write(printable(text.rstrip("\n"), keep_newlines=True) + "\n")
    sys.stderr.flush()


_T = TypeVar("_T")


def run_with_signals(run: Callable[[], Awaitable[_T]], on_signal: Callable[[int], None]) -> _T:
    """``asyncio.run(run())`` with SIGINT/SIGTERM handed to ``on_signal`` on the loop.

    On the loop, not as Python's default handler: a KeyboardInterrupt raised anywhere
    would skip the graceful end (persist, stamp, exit 130/143).
    """
    # Here, not at module load: the commands that only read or queue never run a loop.
    import asyncio
    import signal

    async def main() -> _T:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
