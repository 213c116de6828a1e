"""``show TARGET [NODE] --follow``: tail the live output of running nodes (decisions 191, 235).

Imported only when ``--follow`` is given, so ``show`` itself stays light. It reads the
files :mod:`steerflow._live` writes beside the run, polling them every
:data:`POLL_S`, and asks the state DB (through ``views.show_run``) every
:data:`STATUS_S` whether the node or the run has ended. A node's output is whole once the
writer's end mark is there: its published status can come first, since the writer thread
appends the call's last chunks on its own timer (decision 235). It writes nothing: Ctrl-C
stops the follower (exit 130) and leaves the run as it was, whatever SIGINT state the
follower inherited (decision 198).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from steerflow._live import LIVE_DIR, LiveCursor, live_dir
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
    # A run on another host has no live files here: its node follows as status only.
    local = cursor.directory.parent.parent.is_dir()
    checked = time.monotonic()
    ended_at: float | None = None
    wrote_newline = True
    while True:
        marked = cursor.ended  # looked at before the read: that read gets everything
        if text := cursor.read():
            emit_chunk(text)
            wrote_newline = text.endswith("\n")
        now = time.monotonic()
        if marked and ended_at is None:
            ended_at = now
        if now - checked >= STATUS_S or ended_at == now:
            view, checked = _view(home, target), now
        node = _node(view, key)
        status = node["status"] if node is not None else None
        if _over(
            view,
            node,
            whole=marked or not local,
            since=None if ended_at is None else now - ended_at,
        ):
            # The run's writer is closed before its end is published, or died with it:
            # what it wrote meanwhile is read here.
            if text := cursor.read():
                emit_chunk(text)
                wrote_newline = text.endswith("\n")
            if not wrote_newline:
                emit_chunk("\n")
            emit_text(_final_line(key, status, view))
            return 0
        time.sleep(POLL_S)


def _node(view: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((n for n in view["nodes"] if n["id"] == key), None)


def _over(
    view: dict[str, Any], node: dict[str, Any] | None, *, whole: bool, since: float | None
) -> bool:
    """Whether a node follower is done: the run ended, or the node did and its output is whole.

    ``whole``: the writer's end mark was there before the last read (or there are no live
    files here to wait for); ``since``: seconds since the mark was first seen.
    """
    if view["status"] != "running":
        return True
    if since is not None and since > _SETTLE_S:
        return True  # the call ended long ago and its outcome was never published
    if node is None or node["status"] not in _ENDED:
        return False
    # Published ended. A call that streamed has its end mark coming (queued before the
    # status was): wait for it, never for the status alone (decision 235).
    return whole or not (node.get("detail") or {}).get("streamed")


def _final_line(key: str, status: str | None, view: dict[str, Any]) -> str:
    line = f"[{printable(key)}] {status or 'unknown'}"
    if view["status"] != "running" and status not in _ENDED:
        line += f" (run {view['status']})"
    return line


def follow_run(home: Path, target: str) -> int:
    """Every running node's output, each line prefixed with its node id, until the run ends.

    A node's lines are printed as they come, and its last line without a newline as soon
    as its call ended (the end mark), not when the run ends (decision 235).
    """
    _take_ctrl_c()
    view = _view(home, target)
    run_dir = _run_dir(view)
    cursors: dict[str, LiveCursor] = {}
    done: set[str] = set()  # every byte printed and the cursor closed
    partial: dict[str, str] = {}
    width = _width(view, 0) or 4
    try:
        while True:
            _open_cursors(view, run_dir, cursors, done)
            _pump(cursors, done, width, partial)
            if view["status"] != "running":
                # The writer was closed before the run's end was published, or died with it.
                for key, cursor in cursors.items():
                    _print_lines(key, width, cursor.read(), partial)
                for key in list(partial):  # a last line without its newline
                    _print_lines(key, width, "\n", partial)
                emit_text(f"run {printable(view['run_id'])}: {view['status']}")
                return 0
            deadline = time.monotonic() + STATUS_S
            while time.monotonic() < deadline:
                time.sleep(POLL_S)
                _pump(cursors, done, width, partial)
            view = _view(home, target)
            width = _width(view, width)
    except KeyboardInterrupt:
        return 130
    finally:
        for cursor in cursors.values():
            cursor.close()


def _width(view: dict[str, Any], width: int) -> int:
    return max([width, *(len(n["id"]) for n in view["nodes"])])


def _open_cursors(
    view: dict[str, Any], run_dir: Path, cursors: dict[str, LiveCursor], done: set[str]
) -> None:
    """A cursor for each node of the view that has live files and no cursor yet."""
    try:  # one listing, rather than a stat per node every STATUS_S
        present = set(os.listdir(run_dir / LIVE_DIR))
    except OSError:
        return
    for node in view["nodes"]:
        key = node["id"]
        if key in present and key not in cursors and key not in done:
            cursors[key] = LiveCursor(live_dir(run_dir, key))


def _pump(
    cursors: dict[str, LiveCursor], done: set[str], width: int, partial: dict[str, str]
) -> None:
    """Print what each node wrote since; a node whose call ended is flushed and closed."""
    for key, cursor in list(cursors.items()):
        marked = cursor.ended  # looked at before the read: that read gets everything
        _print_lines(key, width, cursor.read(), partial)
        if marked:
            if key in partial:
                _print_lines(key, width, "\n", partial)
            cursor.close()
            del cursors[key]
            done.add(key)


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
