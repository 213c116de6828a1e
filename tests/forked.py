"""Child writers forked from a server that imported ``steerflow.checkpoint`` once.

The crash campaigns start hundreds of child processes that each write a checkpoint and die
at an armed seam. Importing ``steerflow.checkpoint`` (it pulls in pydantic and YAML) is
~0.6 s of the ~0.75 s of CPU such a child costs, so :func:`run_forked` forks each child
from a ``multiprocessing`` fork server that imported it once per test process. The child
is still a process of its own: it writes real files, its armed ``exit`` fault is a real
``os._exit(137)``, and the test loads what it left from another process. It is armed with
:func:`steerflow._faults.arm`, the function ``STEERFLOW_FAULT`` reaches at import; tests
that exec a child with the variable set keep that path covered (``test_seams``'s
uninterrupted child, ``test_random_sigkill``, the e2e fault tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["Forked", "run_forked"]


@dataclass(frozen=True)
class Forked:
    """How a forked child ended, and what it wrote on fd 1 and fd 2."""

    returncode: int  # 137 after an armed exit; -N after signal N
    stdout: bytes
    stderr: bytes


def run_forked(
    code: str, args: Sequence[str], *, fault: str | None, timeout: float, scratch: Path
) -> Forked:
    """Run ``python -c CODE ARGS...`` as a forked child with ``STEERFLOW_FAULT=fault``.

    Its fd 1 and fd 2 go to files in a new directory under ``scratch``, read (and removed)
    once it has ended; past ``timeout`` seconds it is killed and TimeoutExpired raised.
    """
    with tempfile.TemporaryDirectory(prefix="forked-", dir=scratch) as out:
        stdout, stderr = Path(out) / "stdout", Path(out) / "stderr"
        child = _server().Process(
            target=_child, args=(code, list(args), fault, str(stdout), str(stderr))
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["-c", code, *args], timeout)
        return Forked(child.exitcode, stdout.read_bytes(), stderr.read_bytes())


@cache
def _server() -> Any:
    """The ``forkserver`` context; its server imports ``steerflow.checkpoint`` when started."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["steerflow.checkpoint"])
    return context


def _child(code: str, args: list[str], fault: str | None, stdout: str, stderr: str) -> None:
    """The forked side: own fd 1 and fd 2, the fault armed, then ``code`` as ``-c`` runs it."""
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    from steerflow import _faults

    _faults.arm(fault)  # replaces whatever the server's import read from the environment
    sys.argv = ["-c", *args]
    exec(compile(code, "<forked child>", "exec"), {"__name__": "__main__"})
