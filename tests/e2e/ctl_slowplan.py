"""Run the steerflow CLI with an ``echo`` planner that waits for a release file.

Usage: ``python ctl_slowplan.py --home HOME flow PROMPT ...`` — identical to
``python -m steerflow`` except that planning with the ``echo`` model blocks until
``HOME/release-plan`` exists (at most 60 s), so a test can steer a flow that is
still planning without racing it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from steerflow.cli import main
from steerflow.providers import echo

_original_plan = echo.EchoProvider.plan


async def _held_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
    release = Path(sys.argv[sys.argv.index("--home") + 1]) / "release-plan"
    deadline = time.monotonic() + 60.0
    while not release.exists() and time.monotonic() < deadline:  # noqa: ASYNC110 (a file, not an event)
        await asyncio.sleep(0.02)
    return await _original_plan(self, request)


echo.EchoProvider.plan = _held_plan  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
