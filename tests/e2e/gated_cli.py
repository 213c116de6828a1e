"""Run the steerflow CLI with ``script:`` calls held on release files.

Usage: ``python gated_cli.py --home HOME ARGS...`` — identical to ``python -m steerflow``
except that a ``script:`` node whose file ``HOME/gate-<node>`` exists when it is invoked
first creates ``HOME/started-<node>``, then waits until ``HOME/release-<node>`` exists (at
most 60 s) before it logs its invocation and responds. A test can so keep a call in flight
across a deadline or a ``ctl stop`` for exactly as long as it needs, with no timing guess.

Mid-stream (issue 31): a node with a ``stream:`` entry whose file ``HOME/hold-stream-<node>``
holds a number N emits its first N chunks, creates ``HOME/streamed-<node>``, then waits for
``HOME/release-<node>`` before it emits the rest.

The live writer (issue 38 item 4): while ``HOME/hold-live-<node>`` exists, the writer thread's
next write for that node creates ``HOME/held-live-<node>`` and waits for
``HOME/release-live-<node>``, so a call can end and publish its status while its last chunk
is still unwritten. ``show --follow`` run through this script appends the node statuses of
every view it reads to ``HOME/follower-views`` (one JSON object a line), so a test knows
what the follower has seen.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from steerflow import _live
from steerflow.cli import _follow, main
from steerflow.providers import script
from steerflow.providers._base import ProviderRequest, ProviderResponse

# tests/ holds the shared bounded wait (waiting.py); this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until, wait_until_async

HOLD_S = 60.0
_original_invoke = script.ScriptProvider.invoke


async def _held_invoke(self: script.ScriptProvider, request: ProviderRequest) -> ProviderResponse:
    home = request.home
    if (home / f"gate-{request.node_key}").exists():
        (home / f"started-{request.node_key}").touch()
        release = home / f"release-{request.node_key}"
        await wait_until_async(release.exists, timeout=HOLD_S, what=str(release))
    return await _original_invoke(self, request)


_original_stream = script._stream


async def _held_stream(request: ProviderRequest, chunks: list[str], delay: float) -> None:
    hold = request.home / f"hold-stream-{request.node_key}"
    if not hold.exists():
        return await _original_stream(request, chunks, delay)
    first = int(hold.read_text())
    for chunk in chunks[:first]:
        request.emit(chunk)
    (request.home / f"streamed-{request.node_key}").touch()
    release = request.home / f"release-{request.node_key}"
    await wait_until_async(release.exists, timeout=HOLD_S, what=str(release))
    for chunk in chunks[first:]:
        request.emit(chunk)
    return None


_original_write = _live.LiveWriter._write


def _held_write(self: _live.LiveWriter, key: str, data: bytes) -> None:
    home = self.run_dir.parent.parent  # HOME/runs/<run_id>
    if (home / f"hold-live-{key}").exists():
        (home / f"held-live-{key}").touch()
        release = home / f"release-live-{key}"
        wait_until(release.exists, timeout=HOLD_S, what=str(release))
    _original_write(self, key, data)


_original_view = _follow._view


def _logged_view(home: Path, target: str) -> dict[str, Any]:
    view = _original_view(home, target)
    statuses = {n["id"]: n["status"] for n in view["nodes"]} | {"": view["status"]}
    with open(home / "follower-views", "a") as log:
        log.write(json.dumps(statuses) + "\n")
    return view


script.ScriptProvider.invoke = _held_invoke  # type: ignore[method-assign]
script._stream = _held_stream
_live.LiveWriter._write = _held_write  # type: ignore[method-assign]
_follow._view = _logged_view

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
