"""Run the steerflow CLI with ``script:`` calls held on release files.

Usage: ``python gated_cli.py --home HOME ARGS...`` — identical to ``python -m steerflow``
except that a ``script:`` node whose file ``HOME/gate-<node>`` exists when it is invoked
first creates ``HOME/started-<node>``, then waits until ``HOME/release-<node>`` exists (at
most 60 s) before it logs its invocation and responds. A test can so keep a call in flight
across a deadline or a ``ctl stop`` for exactly as long as it needs, with no timing guess.
"""

from __future__ import annotations

import asyncio
import sys
import time

from steerflow.cli import main
from steerflow.providers import script
from steerflow.providers._base import ProviderRequest, ProviderResponse

HOLD_S = 60.0
_original_invoke = script.ScriptProvider.invoke


async def _held_invoke(self: script.ScriptProvider, request: ProviderRequest) -> ProviderResponse:
    home = request.home
    if (home / f"gate-{request.node_key}").exists():
        (home / f"started-{request.node_key}").touch()
        release = home / f"release-{request.node_key}"
        deadline = time.monotonic() + HOLD_S
        while not release.exists() and time.monotonic() < deadline:  # noqa: ASYNC110 (a file, not an event)
            await asyncio.sleep(0.01)
    return await _original_invoke(self, request)


script.ScriptProvider.invoke = _held_invoke  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
