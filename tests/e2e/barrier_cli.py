"""Run the steerflow CLI once a barrier file appears: ``barrier_cli.py BARRIER READY ARGS...``.

The child imports everything a resume needs, announces itself by creating READY, then
waits (bounded) for BARRIER, so several children start their command at the same moment
instead of one interpreter start-up apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import steerflow.orchestrate  # noqa: F401  (warm: the race starts after imports)
from steerflow.cli import main

# tests/ holds the shared bounded wait (waiting.py); this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from waiting import wait_until

BARRIER_TIMEOUT_S = 60.0


def _run(argv: list[str]) -> int:
    barrier, ready, args = Path(argv[0]), Path(argv[1]), argv[2:]
    ready.touch()
    # A fine interval: the point of the barrier is that every process starts at once.
    wait_until(barrier.exists, timeout=BARRIER_TIMEOUT_S, what=str(barrier), interval=0.001)
    return main(args)


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1:]))
