"""Named durability seams, so tests can kill the process or fail I/O at an exact step.

Every checkpoint syscall in :mod:`steerflow.checkpoint._io` is bracketed by
``seam(step, "before")`` and ``seam(step, "after")``.  Unarmed, a seam is one
global lookup and a return.

Arming from the environment (read once, at import, so a child process picks it up)::

    STEERFLOW_FAULT=exit:after:journal-fsync        # os._exit(137) there
    STEERFLOW_FAULT=eio:before:base-exchange        # raise OSError(EIO) there
    STEERFLOW_FAULT=exit:after:journal-write:3      # only at the 3rd hit of that point
    STEERFLOW_FAULT=short-write:7                   # every os.write moves at most 7 bytes

Several specifications may be joined with ``,``.  In-process tests use
:func:`set_fault_hook` (called with ``(step, when)`` at every seam; it may raise,
substitute files, or record the sequence) and :func:`arm` / :func:`disarm`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ENV_VAR",
    "FaultHook",
    "Spec",
    "arm",
    "disarm",
    "parse",
    "seam",
    "set_fault_hook",
    "short_write_cap",
]

ENV_VAR = "STEERFLOW_FAULT"
FaultHook = Callable[[str, str], None]
When = Literal["before", "after"]


@dataclass
class Spec:
    """One armed fault: what to do at which point, optionally only at its n-th hit."""

    action: str  # "exit" | "eio" | "enospc"
    point: str  # "<when>:<step>"
    nth: int | None = None
    hits: int = 0


_specs: list[Spec] = []
_short_write: int | None = None
_hook: FaultHook | None = None
_armed = False


def parse(text: str) -> tuple[list[Spec], int | None]:
    """Parse an ``STEERFLOW_FAULT`` value; raise ``ValueError`` on a malformed one."""
    specs: list[Spec] = []
    cap: int | None = None
    for raw in filter(None, (part.strip() for part in text.split(","))):
        parts = raw.split(":")
        if parts[0] == "short-write" and len(parts) == 2:
            cap = int(parts[1])
            if cap < 1:
                raise ValueError(f"short-write cap must be positive: {raw!r}")
            continue
        if len(parts) not in (3, 4) or parts[0] not in ("exit", "eio", "enospc"):
            raise ValueError(f"malformed fault specification: {raw!r}")
        if parts[1] not in ("before", "after"):
            raise ValueError(f"fault point must start with before/after: {raw!r}")
        nth = int(parts[3]) if len(parts) == 4 else None
        specs.append(Spec(parts[0], f"{parts[1]}:{parts[2]}", nth))
    return specs, cap


def arm(text: str | None) -> None:
    """Replace the armed faults with ``text`` (same grammar as the variable); None disarms."""
    global _specs, _short_write
    _specs, _short_write = parse(text) if text else ([], None)
    _refresh()


def disarm() -> None:
    """Remove every armed fault and the hook."""
    global _hook
    _hook = None
    arm(None)


def set_fault_hook(hook: FaultHook | None) -> FaultHook | None:
    """Install ``hook(step, when)`` at every seam (None removes it); return the previous one."""
    global _hook
    previous, _hook = _hook, hook
    _refresh()
    return previous


def short_write_cap() -> int | None:
    """Largest number of bytes one write call may move, when short-write mode is armed."""
    return _short_write


def seam(step: str, when: When) -> None:
    """Mark one durability step; a no-op unless something armed it."""
    if not _armed:
        return
    if _hook is not None:
        _hook(step, when)
    point = f"{when}:{step}"
    for spec in _specs:
        if spec.point != point:
            continue
        spec.hits += 1
        if spec.nth is not None and spec.hits != spec.nth:
            continue
        if spec.action == "exit":
            os._exit(137)  # real death: no finally blocks, no atexit, no buffered flush
        code = errno.ENOSPC if spec.action == "enospc" else errno.EIO
        raise OSError(code, f"injected fault at {point}")


def _refresh() -> None:
    global _armed
    _armed = bool(_specs) or _hook is not None


arm(os.environ.get(ENV_VAR))
