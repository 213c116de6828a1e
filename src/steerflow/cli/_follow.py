"""``show TARGET [NODE] --follow``: tail the live output of running nodes (decision 191).

Imported only when ``--follow`` is given, so ``show`` itself stays light. It reads the
files :mod:`steerflow._live` writes beside the run, polling them every
:data:`POLL_S`, and asks the state DB (through ``views.show_run``) every
:data:`STATUS_S` whether the node or the run has ended. It writes nothing: Ctrl-C
stops the follower (exit 130) and leaves the run as it was, whatever SIGINT state the
follower inherited (decision 198).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from steerflow._live import LiveCursor, live_dir
from steerflow.cli._output import emit_chunk, emit_text, printable

__all__ = ["follow_node", "follow_run"]

POLL_S = 0.05
STATUS_S = 0.25
_ENDED = ("completed", "failed", "skipped")
#: How long a node whose call ended may take to publish its outcome (checkpoint first).
_SETTLE_S = 30.0


def _view(home: Path, target: str) -> dict[str, Any]:
    from steerflow.views import show_run

    return show_run(home, target).to_json()


def _run_dir(view: dict[str, Any]) -> Path:
    """The run's directory; a run on another host has none here and follows as status only."""
    return Path(view["run_dir"]) if view.get("run_dir") else Path("/nonexistent/steerflow")


def _status(view: dict[str, Any], key: str) -> str | None:
    return next((n["status"] for n in view["nodes"] if n["id"] == key), None)


def _take_ctrl_c() -> None:
    """Make SIGINT stop this process with KeyboardInterrupt, as in a terminal.

    A follower started as a background job of a non-interactive shell (``cmd &`` in a
    script, a CI runner, a test run launched that way) inherits SIGINT ignored, and
    Python then installs no handler; a parent may also leak a blocked mask. Either way
    the follower outlived its Ctrl-C, and a follower writes nothing and runs until
    the node ends: the one way it is meant to stop must work (decision 198). A SIGINT
    held pending by the mask is raised here, before anything is read.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # the CLI called in-process from a thread: signals are not its to change
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def follow_node(home: Path, target: str, node: str) -> int:
    """Print one node's output so far, then every new chunk, then its final status line."""
    from steerflow.orchestrate._detail import node_detail

    _take_ctrl_c()
    key = node_detail(home, target, node)["id"]
    view = _view(home, target)
    cursor = LiveCursor(live_dir(_run_dir(view), key))
    try:
        return _follow_one(home, target, key, cursor, view)
    except KeyboardInterrupt:
        return 130
    finally:
        cursor.close()


def _follow_one(home: Path, target: str, key: str, cursor: LiveCursor, view: dict[str, Any]) -> int:
    checked = time.monotonic()
    ended_at: float | None = None
    wrote_newline = True
    while True:
        if text := cursor.read():
            emit_chunk(text)
            wrote_newline = text.endswith("\n")
        now = time.monotonic()
        if cursor.ended and ended_at is None:
            ended_at = now
        if now - checked >= STATUS_S or ended_at == now:
            view, checked = _view(home, target), now
        status = _status(view, key)
        run_over = view["status"] != "running"
        settled = ended_at is not None and now - ended_at > _SETTLE_S
        if status in _ENDED or run_over or settled:
            if text := cursor.read():  # what came between the last read and the status
                emit_chunk(text)
                wrote_newline = text.endswith("\n")
            if not wrote_newline:
                emit_chunk("\n")
            emit_text(_final_line(key, status, view))
            return 0
        time.sleep(POLL_S)


def _final_line(key: str, status: str | None, view: dict[str, Any]) -> str:
    line = f"[{printable(key)}] {status or 'unknown'}"
    if view["status"] != "running" and status not in _ENDED:
        line += f" (run {view['status']})"
    return line


def follow_run(home: Path, target: str) -> int:
    """Every running node's output, each line prefixed with its node id, until the run ends."""
    _take_ctrl_c()
    view = _view(home, target)
    run_dir = _run_dir(view)
    cursors: dict[str, LiveCursor] = {}
    partial: dict[str, str] = {}
    width = max((len(n["id"]) for n in view["nodes"]), default=4)
    try:
        while True:
            for node in view["nodes"]:
                key = node["id"]
                if key not in cursors and live_dir(run_dir, key).is_dir():
                    cursors[key] = LiveCursor(live_dir(run_dir, key))
            for key, cursor in cursors.items():
                _print_lines(key, width, cursor.read(), partial)
            if view["status"] != "running":
                for key, cursor in cursors.items():
                    _print_lines(key, width, cursor.read(), partial)
                    if key in partial:  # a last line without its newline
                        _print_lines(key, width, "\n", partial)
                emit_text(f"run {printable(view['run_id'])}: {view['status']}")
                return 0
            deadline = time.monotonic() + STATUS_S
            while time.monotonic() < deadline:
                time.sleep(POLL_S)
                for key, cursor in cursors.items():
                    _print_lines(key, width, cursor.read(), partial)
            view = _view(home, target)
            width = max(width, *(len(n["id"]) for n in view["nodes"]))
    except KeyboardInterrupt:
        return 130
    finally:
        for cursor in cursors.values():
            cursor.close()


def _print_lines(key: str, width: int, text: str, partial: dict[str, str]) -> None:
    """Whole lines only, each with the node's prefix; the rest waits for its newline."""
    if not text:
        return
    *lines, rest = (partial.pop(key, "") + text).split("\n")
    if rest:
        partial[key] = rest
    if lines:
        prefix = f"{printable(key):<{width}} | "
        emit_chunk("".join(f"{prefix}{line}\n" for line in lines))
