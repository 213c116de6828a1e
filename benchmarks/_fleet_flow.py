"""``python _fleet_flow.py BARRIER ARGS...``: the CLI, its ``script:`` calls held until BARRIER.

fleet_pg.py's real row starts its flows with this, so all of them are running at once,
each holding its server connection, before the first call starts: on a loaded 2-core
machine the first flows would otherwise finish before the last had started.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from steerflow.cli import main
from steerflow.providers import script
from steerflow.providers._base import ProviderRequest, ProviderResponse

BARRIER = Path(sys.argv.pop(1))
HOLD_S = 900.0
_original = script.ScriptProvider.invoke


async def _held(self: script.ScriptProvider, request: ProviderRequest) -> ProviderResponse:
    deadline = time.monotonic() + HOLD_S
    # A benchmark's start line, not a test's wait: another process creates the file.
    while not BARRIER.exists() and time.monotonic() < deadline:  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.2)
    return await _original(self, request)


script.ScriptProvider.invoke = _held  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
