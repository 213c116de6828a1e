"""Run an example program with its ``script:`` calls held on release files.

Usage: ``python gated_example.py EXAMPLE ARGS...``: the example runs as ``python EXAMPLE
ARGS...`` would, with ``tests/e2e/gated_cli.py``'s hold: a ``script:`` node whose file
``HOME/gate-<node>`` exists waits for ``HOME/release-<node>`` (at most 60 s), so a test
steers it while it is in flight for as long as it needs, with no timing guess.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))
import gated_cli  # noqa: F401  (importing it installs the hold)

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
