"""Run the steerflow CLI with every ``script:`` call held open: ``agent_gate_cli.py GATE ARGS...``.

The real ``ScriptProvider.invoke`` runs first (it logs the invocation and builds its
scripted response); then the call writes ``GATE/started-<node_key>`` and waits (bounded)
for ``GATE/release-<node_key>`` before returning. A test thus knows a turn is in flight
and decides when it ends, without sleeping.
"""

from __future__ import annotations

import sys
from pathlib import Path

from steerflow.cli import main
from steerflow.providers import ProviderRequest, ProviderResponse
from steerflow.providers import script as script_module

# tests/ holds the shared bounded wait (waiting.py); this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until_async

GATE_TIMEOUT_S = 120.0


def _install(gate: Path) -> None:
    original = script_module.ScriptProvider.invoke

    async def gated(
        self: script_module.ScriptProvider, request: ProviderRequest
    ) -> ProviderResponse:
        response = await original(self, request)
        (gate / f"started-{request.node_key}").touch()
        release = gate / f"release-{request.node_key}"
        await wait_until_async(release.exists, timeout=GATE_TIMEOUT_S, what=str(release))
        return response

    script_module.ScriptProvider.invoke = gated  # type: ignore[method-assign]


if __name__ == "__main__":
    _install(Path(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
