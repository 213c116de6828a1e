"""Run the steerflow CLI with an ``echo`` planner that waits for a release file.

Usage: ``python ctl_slowplan.py --home HOME flow PROMPT ...`` — identical to
``python -m steerflow`` except that planning with the ``echo`` model blocks until
``HOME/release-plan`` exists (at most 60 s), so a test can steer a flow that is
still planning without racing it.

It also leaves traces a test can wait on instead of racing the process: every planner
call appends a line to ``HOME/planner-calls.log`` when it starts, and a signal or the
deadline, once the run has taken note of it, touches ``HOME/stop-seen`` or
``HOME/deadline-seen``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from steerflow.cli import main
from steerflow.orchestrate import FlowRun
from steerflow.providers import echo

# tests/ holds the shared bounded wait (waiting.py); this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until_async

_original_plan = echo.EchoProvider.plan
_original_stop = FlowRun.request_stop
_original_deadline = FlowRun._deadline


def _home() -> Path:
    return Path(sys.argv[sys.argv.index("--home") + 1])


def _log_call(prompt: str) -> None:
    with open(_home() / "planner-calls.log", "a") as log:
        log.write(prompt.replace("\n", " ") + "\n")


async def _held_plan(self: echo.EchoProvider, request: echo.PlanRequest) -> object:
    _log_call(request.prompt)  # a few bytes, before anything else runs: fine on the loop
    release = _home() / "release-plan"
    await wait_until_async(release.exists, timeout=60.0, what=str(release), interval=0.02)
    return await _original_plan(self, request)


def _noted_stop(self: FlowRun, signum: int) -> None:
    _original_stop(self, signum)
    (_home() / "stop-seen").touch()


def _noted_deadline(self: FlowRun) -> None:
    _original_deadline(self)
    (_home() / "deadline-seen").touch()


echo.EchoProvider.plan = _held_plan  # type: ignore[method-assign]
FlowRun.request_stop = _noted_stop  # type: ignore[method-assign]
FlowRun._deadline = _noted_deadline  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
