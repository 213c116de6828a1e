"""Run the steerflow CLI with every ``script:`` call held open: ``agent_gate_cli.py GATE ARGS...``.

The real ``ScriptProvider.invoke`` runs first (it logs the invocation and builds its
scripted response); then the call writes ``GATE/started-<node_key>`` and waits (bounded)
for ``GATE/release-<node_key>`` before returning. A test thus knows a turn is in flight
and decides when it ends, without sleeping.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from steerflow.cli import main
from steerflow.providers import ProviderRequest, ProviderResponse
from steerflow.providers import script as script_module

GATE_TIMEOUT_S = 120.0


def _install(gate: Path) -> None:
    original = script_module.ScriptProvider.invoke

    async def gated(
        self: script_module.ScriptProvider, request: ProviderRequest
    ) -> ProviderResponse:
        response = await original(self, request)
        (gate / f"started-{request.node_key}").touch()
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not (gate / f"release-{request.node_key}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate release-{request.node_key} never appeared")
            await asyncio.sleep(0.01)
        return response

    script_module.ScriptProvider.invoke = gated  # type: ignore[method-assign]


if __name__ == "__main__":
    _install(Path(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
