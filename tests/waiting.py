"""Bounded waits on a condition: the one polling loop every test uses instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["wait_until", "wait_until_async"]


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
