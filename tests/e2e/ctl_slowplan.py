"""Run the steerflow CLI with an ``echo`` planner that waits for a release file.

Usage: ``python ctl_slowplan.py --home HOME flow PROMPT ...`` — identical to
``python -m steerflow`` except that planning with the ``echo`` model blocks until
``HOME/release-plan`` exists (at most 60 s), so a test can steer a flow that is
still planning without racing it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from steerflow.cli import main
from steerflow.providers import echo

# tests/ holds the shared bounded wait (waiting.py); this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until_async

_original_plan = echo.EchoProvider.plan


async def _held_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
    release = Path(sys.argv[sys.argv.index("--home") + 1]) / "release-plan"
    await wait_until_async(release.exists, timeout=60.0, what=str(release), interval=0.02)
    return await _original_plan(self, request)


echo.EchoProvider.plan = _held_plan  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
