"""Seam discovery done once: dry runs kept per source tree and shared by a run's workers.

A campaign's cases are the seams a dry run of the child writer reached, and parametrizing
needs them at collection, before any fixture. Every pytest-xdist worker collects the whole
suite, so without this each worker would start the same dry runs. :func:`once` computes a
JSON value at most once per test run (the first worker computes it under a file lock in
the run's shared temporary root, the others read it) and at most once per source tree (the
pytest cache, keyed by a digest of ``src/steerflow``, ``crash_support.py`` and the caller's
files): a collection with unchanged sources starts no child.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["once"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def sources_key(files: Sequence[Path]) -> str:
    """A digest of everything a dry run's hits depend on."""
    digest = hashlib.sha256(sys.version.encode())
    paths = [*sorted((ROOT / "src" / "steerflow").rglob("*.py")), HERE / "crash_support.py"]
    for path in [*paths, *files]:
        digest.update(str(path.resolve().relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def _run_root(config: pytest.Config) -> Path:
    """The temporary root this run's processes share (a worker's basetemp is under it)."""
    base: Path = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


def once(
    config: pytest.Config, name: str, files: Sequence[Path], compute: Callable[[], Any]
) -> Any:
    """``compute()`` (a JSON value) from the pytest cache, this run's first worker, or now."""
    key = f"steerflow/{name}/{sources_key(files)}"
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    stored = cache.get(key, None) if cache is not None else None
    if stored is not None:
        return stored
    shared = _run_root(config) / f"{name}-{key.rsplit('/', 1)[1]}.json"
    with open(shared.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if shared.exists():
            value = json.loads(shared.read_text())
        else:
            value = compute()
            partial = shared.with_suffix(f".{os.getpid()}")
            partial.write_text(json.dumps(value))
            partial.replace(shared)
    if cache is not None:
        cache.set(key, value)
    return value
