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
        self.users = 0  # calls inside this proxy (an abandoned one counts until it returns)

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


def _enter() -> _RoutedStdout | None:
    with _lock:
        current = sys.stdout
        if current is None:
            return None
        # A proxy per stream: a call abandoned by a stop keeps the proxy it entered, and
        # whoever replaced ``sys.stdout`` since (a capture, a redirect) gets a proxy of its
        # own for the next call, put back when that call returns.
        if not isinstance(current, _RoutedStdout):
            current = _RoutedStdout(current)
            sys.stdout = cast(TextIO, current)
        current.users += 1
        return current


def _leave(proxy: _RoutedStdout | None) -> None:
    if proxy is None:
        return
    with _lock:
        proxy.users -= 1
        if proxy.users == 0 and sys.stdout is cast(TextIO, proxy):  # else replaced: theirs
            sys.stdout = proxy.through


@contextlib.contextmanager
def routed_stdout(sink: Sink) -> Iterator[None]:
    """Send what the code run inside the block prints to ``sink`` (this context only)."""
    token = _SINK.set(sink)
    proxy = _enter()
    try:
        yield
    finally:
        _leave(proxy)
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
