"""Bounded waits on a condition: the one polling loop every test uses instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["holds_for", "holds_for_async", "wait_until", "wait_until_async"]


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str = "condition",
    interval: float = 0.02,
) -> T:
    """Return ``probe()``'s first truthy value; fail after ``timeout`` seconds.

    ``probe`` may raise to stop waiting early (e.g. when the process being watched died).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last={value!r}"
            )
        time.sleep(interval)


async def loop_turn() -> None:
    """One full turn of the event loop: every callback already scheduled runs first.

    Not a sleep: a future resolved by ``call_soon`` completes after exactly the callbacks
    queued before it (the loop runs them in order), so a task started just before has
    taken its first step, and a stray cancel already scheduled has landed.
    """
    loop = asyncio.get_running_loop()
    turned: asyncio.Future[None] = loop.create_future()
    loop.call_soon(turned.set_result, None)
    await turned


async def wait_until_async(
    probe: Callable[[], T | None],
    *,
    timeout: float,  # noqa: ASYNC109 - same signature as wait_until; bounds the polling
    what: str = "condition",
    interval: float = 0.01,
) -> T:
    """The event-loop version of :func:`wait_until`: other tasks run between probes."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last={value!r}"
            )
        await asyncio.sleep(interval)


def holds_for(
    check: Callable[[], object],
    *,
    seconds: float,
    interval: float = 0.05,
) -> None:
    """Run ``check`` (which asserts) over ``seconds``: the bounded proof that nothing happens.

    A negative property ("the paused node is never called") has no event to wait on; it
    is checked all along a window, and fails at the first probe that sees it broken.
    """
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


async def holds_for_async(
    check: Callable[[], object],
    *,
    seconds: float,
    interval: float = 0.01,
) -> None:
    """The event-loop version of :func:`holds_for`: other tasks run between checks."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(interval)
