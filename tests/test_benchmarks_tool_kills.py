"""``benchmarks/tool_kills.py``'s steerflow rows, one kill each (issue 39's goal).

A real ``steerflow flow`` against the benchmark's loopback server (its own process) is
SIGKILLed while ``charge`` blocks after writing its ledger line; a fresh ``steerflow resume``
recovers. The benchmark prints counts and asserts nothing, so this pins what its steerflow
rows must count: the in-flight call refused then skipped without running again, or, declared
idempotent, run again without asking; no call that had returned runs again either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``benchmarks`` is a directory of scripts, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.tool_kills import Kill, steerflow_kill  # noqa: E402
from benchmarks.tool_loop import server  # noqa: E402

pytestmark = pytest.mark.timeout(180)

STEPS = 5  # 4 charge calls, then text; the kill at the 3rd (key k2)


def _kill(tmp_path: Path, idempotent: bool) -> Kill:
    with server(STEPS, 0.0) as base_url:
        kill = steerflow_kill(idempotent, base_url, STEPS, "k2", tmp_path)
    assert kill.error is None, kill.error
    assert kill.killed
    return kill


def _ledger(tmp_path: Path) -> list[str]:
    return [line.split()[0] for line in (tmp_path / "ledger").read_text().splitlines()]


def test_a_call_in_flight_at_a_kill_is_refused_then_skipped_never_run_again(
    tmp_path: Path,
) -> None:
    kill = _kill(tmp_path, idempotent=False)
    assert kill.refused and kill.recovered
    assert not kill.ran_again and kill.done_again == 0
    assert _ledger(tmp_path) == ["k0", "k1", "k2", "k3"]


@pytest.mark.slow  # the same path as tests/e2e/test_tool_nodes_e2e.py's idempotent re-run
def test_a_call_declared_idempotent_runs_again_without_asking(tmp_path: Path) -> None:
    kill = _kill(tmp_path, idempotent=True)
    assert kill.ran_again and kill.recovered and not kill.refused
    assert kill.done_again == 0
    assert _ledger(tmp_path) == ["k0", "k1", "k2", "k2", "k3"]
