"""The Ray task one node call runs as, on whichever worker Ray places it.

A generator task (``num_returns="streaming"``): it yields ``("start", placement)`` once it
runs, ``("out", text)`` for what the provider emits (the live view), ``("tick",)`` while the
call is quiet, and ends with ``("done", response)`` or ``("error", ...)``. The ticks are what
let a cancel land: Ray interrupts a generator task at its next yield, so a quiet call is still
stopped within :data:`TICK_S`, and the provider gets its own cancellation (it kills its
subprocess, closes its stream) before the worker goes on.

Errors travel as text, not pickled exceptions: the flow process raises the same message a
local call would have failed its node with, whatever the worker's classes can pickle.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from steerflow.errors import ProviderError
from steerflow.providers import ProviderRequest, ProviderResponse, make_provider
from steerflow.providers._plugins import checked_response

__all__ = ["CANCEL_GRACE_S", "TICK_S", "run_call", "steerflow_version"]

#: Longest quiet stretch without a yield (so a cancel lands) and a liveness tick.
TICK_S = 1.0
#: How long a cancelled call's own cleanup may take before the worker stops waiting.
CANCEL_GRACE_S = 5.0
#: Most characters of output in one ``out`` item (later output waits for the next one).
_CHUNK_MAX = 64 * 1024


class _Done:
    """The queue's end marker."""


class _Call:
    """One provider call on a thread of its own (the generator keeps the task's thread)."""

    def __init__(self, spec: str, request: ProviderRequest) -> None:
        self.out: queue.SimpleQueue[str | _Done] = queue.SimpleQueue()
        self.response: ProviderResponse | None = None
        self.error: BaseException | None = None
        self._spec = spec
        self._request = replace(request, live=self.out.put)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[ProviderResponse] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steerflow-call", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.response = asyncio.run(self._invoke())
        except BaseException as exc:  # reported to the flow process as the call's error
            self.error = exc
        finally:
            self._ready.set()
            self.out.put(_Done())

    async def _invoke(self) -> ProviderResponse:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._ready.set()
        provider = make_provider(self._spec)
        try:
            return checked_response(provider, await provider.invoke(self._request))
        finally:
            await provider.aclose()

    def cancel(self) -> None:
        """Cancel the provider's call as a local stop would, and wait for it to let go."""
        self._ready.wait(CANCEL_GRACE_S)
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(CANCEL_GRACE_S)

    def next_output(self) -> str | _Done | None:
        """What the call printed since the last look, None after a quiet tick, or the end."""
        try:
            first = self.out.get(timeout=TICK_S)
        except queue.Empty:
            return None
        if isinstance(first, _Done):
            return first
        parts, size = [first], len(first)
        while size < _CHUNK_MAX:
            try:
                more = self.out.get_nowait()
            except queue.Empty:
                break
            if isinstance(more, _Done):
                self.out.put(more)  # seen again on the next look, after this text
                break
            parts.append(more)
            size += len(more)
        return "".join(parts)


def _placement() -> dict[str, object]:
    import ray

    context = ray.get_runtime_context()
    return {
        "executor": "ray",
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "pid": os.getpid(),
        "worker_id": context.get_worker_id(),
    }


def steerflow_version() -> str:
    """The installed steerflow's version: a worker must run the same as the flow process."""
    from importlib.metadata import version

    return version("steerflow")


def run_call(spec: str, request: ProviderRequest, version: str) -> Iterator[tuple[Any, ...]]:
    """Run one node's provider call here; see the module docstring for what it yields."""
    __version__ = steerflow_version()
    if version != __version__:
        yield (
            "error",
            True,
            f"the Ray worker runs steerflow {__version__}, the flow process {version}: "
            "install the same steerflow on every node",
        )
        return
    yield ("start", _placement())
    call = _Call(spec, request)
    call.start()
    try:
        while True:
            item = call.next_output()
            if isinstance(item, _Done):
                break
            yield ("out", item) if item else ("tick",)
    except BaseException:  # GeneratorExit or KeyboardInterrupt: Ray's cancel
        call.cancel()
        raise
    if call.error is not None:
        yield _error(call.error)
    else:
        yield ("done", call.response)


def _error(exc: BaseException) -> tuple[Any, ...]:
    """``("error", is_provider_error, text)``: the text a local call's node would show."""
    if isinstance(exc, ProviderError):
        return ("error", True, str(exc))
    return ("error", False, f"{type(exc).__name__}: {exc}")
