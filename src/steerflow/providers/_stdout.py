"""A function node's ``print`` goes to its node's live output, never to steerflow's stdout.

``sys.stdout`` is one object for the whole process, where ``--json`` prints its one object,
and function nodes run at the same time (plain ones on pool threads, ``async`` ones on the
loop), so it cannot be swapped for the length of one call (``contextlib.redirect_stdout``
is not thread-safe). Instead, while any function runs, ``sys.stdout`` is a proxy: a write
made in a call's context (a context variable set around the call, and copied into its
thread) goes to that call's sink; any other write goes to the stream the proxy replaced,
which is put back once no function runs (decision 242).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TextIO, cast

__all__ = ["Sink", "call_sink", "routed_stdout"]

Sink = Callable[[str], None]

#: Where the current call's ``print`` goes; None outside a function call.
_SINK: ContextVar[Sink | None] = ContextVar("steerflow_function_stdout", default=None)


class _RoutedStdout:
    """``sys.stdout`` while functions run: each call's writes to its sink, the rest through."""

    def __init__(self, through: TextIO) -> None:
        self.through = through

    def write(self, text: str) -> int:
        sink = _SINK.get()
        if sink is None:
            return self.through.write(text)
        if text:
            sink(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _SINK.get() is None:
            self.through.flush()

    def __getattr__(self, name: str) -> object:  # encoding, isatty, fileno, buffer, ...
        return getattr(self.through, name)


_lock = threading.Lock()
_calls = 0  # function calls running (an abandoned one counts until its function returns)
_proxy: _RoutedStdout | None = None


def _enter() -> None:
    global _calls, _proxy
    with _lock:
        # Not only for the first call: a call abandoned by a stop still counts, and whoever
        # replaced ``sys.stdout`` since (a capture, a redirect) must not get the next call's
        # prints.
        if sys.stdout is not None and not isinstance(sys.stdout, _RoutedStdout):
            _proxy = _RoutedStdout(sys.stdout)
            sys.stdout = cast(TextIO, _proxy)
        _calls += 1


def _leave() -> None:
    global _calls, _proxy
    with _lock:
        _calls -= 1
        if _calls == 0 and _proxy is not None:
            if sys.stdout is cast(TextIO, _proxy):  # else someone replaced it since: theirs
                sys.stdout = _proxy.through
            _proxy = None


@contextlib.contextmanager
def routed_stdout(sink: Sink) -> Iterator[None]:
    """Send what the code run inside the block prints to ``sink`` (this context only)."""
    token = _SINK.set(sink)
    _enter()
    try:
        yield
    finally:
        _leave()
        _SINK.reset(token)


def _to_stderr(text: str) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or no stderr
        sys.stderr.write(text)
        sys.stderr.flush()


def call_sink(live: Sink | None) -> Sink:
    """A call's sink, usable from any thread.

    The node's live output (``ProviderRequest.live``), on the running loop; else
    steerflow's stderr.
    """
    if live is None:
        return _to_stderr
    loop = asyncio.get_running_loop()

    def emit(text: str) -> None:
        try:
            loop.call_soon_threadsafe(live, text)
        except RuntimeError:  # the loop closed: the call ended long ago (an abandoned thread)
            _to_stderr(text)

    return emit
