"""Suite-wide fixtures."""

from __future__ import annotations

import compileall
import functools
import inspect
import re
import resource
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

import rewrite_cache
import steerflow
from pg_support import PgServer, pg_server
from steerflow.state import STATE_DB_URL_ENV

# The modules whose code runs on a run's event loop. A blocking call with one of their
# frames on the loop's stack stalls every other task of the run (poller, heartbeat,
# publisher), so it must go through asyncio.to_thread. The synchronous layers (state/,
# the checkpoint loaders, plan/) are not scanned: async code reaches them through a
# thread, and tests call them directly.
LOOP_MODULES = [
    "steerflow.checkpoint._writer",
    "steerflow.cli._cmd_flow",
    "steerflow.control",
    "steerflow.executor",
    "steerflow.orchestrate",
]
# steerflow.providers is left out: its tests build providers (a sync constructor that
# looks up executables) inside async tests. A provider call made by a run is still
# covered, because the executor's frames are on the stack while it awaits the call.


def pytest_configure(config: pytest.Config) -> None:
    """Compile ``steerflow`` to bytecode before any test starts a ``steerflow`` process.

    The suite starts a few thousand of them. Where ``PYTHONDONTWRITEBYTECODE`` is set (CI
    images often set it) none of them writes its ``__pycache__``, so each would compile
    the package from source again: ~0.3 s of CPU per process on a two-core machine, more
    than the test it serves. Bytecode already on disk is still read, so compiling once
    here (a no-op when it is up to date; every xdist worker checks) is enough.
    """
    compileall.compile_dir(Path(steerflow.__file__).parent, quiet=1)
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        # The controller of an xdist run, before any worker starts: the suite's own helpers
        # (imported by every worker and by the `python:` nodes of child processes) and the
        # test modules' assertion rewrites are compiled once instead of once per worker.
        tests = Path(__file__).parent
        compileall.compile_dir(tests, quiet=1, rx=re.compile(r"(^|/)test_[^/]*\.py$"))
        rewrite_cache.prewarm(config, tests)


_CPU_AT_SETUP = pytest.StashKey[tuple[float, float]]()


#: The modules that take longest (docs/testing.md's table), longest first: handed out
#: before everything else, so no worker ends the run alone with one of them (longest
#: processing time first). The Ray module is one xdist group (one worker) of about a minute.
LONGEST_FIRST = (
    "tests/e2e/test_ray_e2e.py",
    "tests/crash/test_resume_chain.py",
    "tests/e2e/test_lease_takeover.py",
    "tests/e2e/test_studio_live_output.py",
    "tests/e2e/test_studio_browser_header.py",
    "tests/e2e/test_studio_browser.py",
    "tests/e2e/test_budget_e2e.py",
    "tests/e2e/test_studio_browser_runs.py",
    "tests/e2e/test_provider_plugins_e2e.py",
    "tests/e2e/test_two_hosts_netns.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put :data:`LONGEST_FIRST`'s tests first (a stable sort: every worker agrees)."""
    rank = {module: at for at, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


def _cpu_s() -> tuple[float, float]:
    """CPU seconds of this process, and of every child it has reaped so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_SETUP] = _cpu_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    """Record each test's CPU (its process and the children it waited for) as ``cpu_s``.

    A JUnit report (``--junitxml``) carries it as a property, which ``scripts/test-durations``
    sets beside the wall time: the difference is what the test waited for. ``cpu_self_s``
    is the test process's own part (the rest is its children: ``steerflow`` processes,
    servers).
    """
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        (own0, kids0), (own1, kids1) = item.stash[_CPU_AT_SETUP], _cpu_s()
        item.user_properties.append(("cpu_s", round(own1 + kids1 - own0 - kids0, 2)))
        item.user_properties.append(("cpu_self_s", round(own1 - own0, 2)))
    return (yield)


@functools.cache
def _shared_blockbuster() -> BlockBuster:
    return BlockBuster(LOOP_MODULES)


@pytest.fixture(autouse=True)
def blockbuster(request: pytest.FixtureRequest) -> Iterator[BlockBuster]:
    """Fail a test when steerflow's loop code makes a blocking call on the running loop.

    Scanned to the library only: a test body may block on purpose (writing fixtures,
    reading results); a blocking call made by steerflow code on the loop may not.

    Building a BlockBuster (wrapping every function it watches) costs ~3 ms; activating
    one, 0.1 ms. A test that does not name this fixture cannot change it, so those share
    one per worker, activated for each test; a test that names it (to allow a call with
    ``can_block_in``, or to deactivate it for a moment) gets its own.
    """
    if "blockbuster" in inspect.signature(request.function).parameters:
        with blockbuster_ctx(LOOP_MODULES) as bb:
            yield bb
        return
    shared = _shared_blockbuster()
    shared.activate()
    try:
        yield shared
    finally:
        shared.deactivate()


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """One real PostgreSQL server for the whole run, started on first use (pg_support)."""
    with pg_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def state_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test against each state backend: the home's SQLite file, or a fresh
    PostgreSQL database named by ``STEERFLOW_STATE_DB_URL`` (children inherit it)."""
    if request.param == "postgresql":
        server: PgServer = request.getfixturevalue("pg")
        monkeypatch.setenv(STATE_DB_URL_ENV, server.new_database())
    else:
        monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    return str(request.param)
