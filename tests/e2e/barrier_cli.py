"""Run the steerflow CLI once a barrier file appears: ``barrier_cli.py BARRIER READY ARGS...``.

The child imports everything a resume needs, announces itself by creating READY, then
waits (bounded) for BARRIER, so several children start their command at the same moment
instead of one interpreter start-up apart.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import steerflow.orchestrate  # noqa: F401  (warm: the race starts after imports)
from steerflow.cli import main

BARRIER_TIMEOUT_S = 60.0


def _run(argv: list[str]) -> int:
    barrier, ready, args = Path(argv[0]), Path(argv[1]), argv[2:]
    ready.touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not barrier.exists():
        if time.monotonic() > deadline:
            print(f"barrier {barrier} never appeared", file=sys.stderr)
            return 99
        time.sleep(0.001)
    return main(args)


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1:]))
