"""Function nodes that watch how a ``steerflow`` process ends (decision 392).

Named as ``python:exit_fns:NAME`` with ``tests/`` on the child's ``PYTHONPATH``; each
writes a file under ``$EXIT_FNS_DIR`` when its ending happens, so the test reads what the
process did after it was gone.
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

from steerflow import NodeCall


def _mark(name: str, text: str = "") -> None:
    (Path(os.environ["EXIT_FNS_DIR"]) / name).write_text(text, encoding="utf-8")


class _Finalized:
    """Marks when the interpreter tears this module down (the step the fast exit skips)."""

    def __del__(self) -> None:
        _mark("finalized")


_FINALIZED = _Finalized()


def with_atexit(call: NodeCall) -> str:
    """A user's atexit handler: it must still run."""
    atexit.register(_mark, "atexit", call.node_id)
    return "x" * 200_000  # a long result: stdout must arrive whole, buffered or not


def with_thread(call: NodeCall) -> str:
    """A non-daemon thread that finishes only after the main thread has ended."""

    def after_main() -> None:
        threading.main_thread().join()
        _mark("thread", call.node_id)

    threading.Thread(target=after_main, name="after-main", daemon=False).start()
    return "started"
