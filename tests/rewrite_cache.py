"""Rewrite the suite's test modules once, before the xdist workers collect them.

pytest rewrites every test module's ``assert`` statements when it imports it (about 3 s
of CPU for this suite) and caches the result as a ``.pyc`` beside it, except where
``PYTHONDONTWRITEBYTECODE`` is set (CI images often set it, this machine's does): then
each of the ``-n 4`` workers rewrites every module again, on every run. Done here once,
in the controller, split over two forked processes, the workers find the rewritten
modules on disk and only read them (pytest reads a cached rewrite even when it may not
write one).

This reaches into pytest's rewrite module (``_rewrite_test``, ``_write_pyc``), which has
kept these names and signatures since pytest 6; pyproject.toml caps pytest below 9.2. If
they move, :func:`prewarm` does nothing and the workers rewrite as before: it only ever
saves time, never changes what a test sees.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

__all__ = ["prewarm"]

_CONFIG: pytest.Config | None = None


def _rewrite(files: list[Path]) -> None:
    from _pytest.assertion import rewrite

    assert _CONFIG is not None
    state = _CONFIG.stash[rewrite.assertstate_key]
    for fn in files:
        pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(fn, pyc, state.trace) is not None:
            continue  # up to date
        if not rewrite.try_makedirs(pyc.parent):
            continue
        stat, code = rewrite._rewrite_test(fn, _CONFIG)
        rewrite._write_pyc(state, code, stat, pyc)


def prewarm(config: pytest.Config, tests: Path, processes: int = 2) -> None:
    """Write the rewritten ``.pyc`` of every ``test_*.py`` and ``conftest.py`` under ``tests``."""
    global _CONFIG
    try:
        from _pytest.assertion import rewrite

        for name in ("_rewrite_test", "_write_pyc", "_read_pyc", "get_cache_dir", "try_makedirs",
                     "PYC_TAIL"):  # fmt: skip
            getattr(rewrite, name)
        config.stash[rewrite.assertstate_key]
    except (ImportError, AttributeError, KeyError):
        return  # pytest moved them (or assertion rewriting is off): the workers rewrite
    files = sorted([*tests.rglob("test_*.py"), *tests.rglob("conftest.py")])
    _CONFIG = config
    try:
        # fork: the children inherit the configured pytest (its config is not picklable).
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            pool.map(_rewrite, [files[i::processes] for i in range(processes)])
    finally:
        _CONFIG = None
