"""Live output of running nodes: the per-node files beside a run (decisions 190, 196).

A provider hands text chunks to a sink (``ProviderRequest.emit``); the run's one
:class:`LiveWriter` thread appends them to ``<run_dir>/live/<node_key>/<n>.txt`` so the
event loop only appends them to a list. The files are never part of the checkpoint: they are a
view of a call in flight, and the recorded response stays the only truth.

Bounded with the head and the tail kept: segment ``0`` holds the first ``head`` bytes and
is never touched again; later segments roll at ``segment`` bytes and only the newest two
are kept, so a node's directory never holds more than ``head + 2 * segment`` bytes. Every
segment is append-only (a reader holding one never sees it rewritten); the writer makes
segment ``n + 1`` only once ``n`` is finished, and an ``end`` file once the call ended, so
a reader knows when it has everything. Only a call that emitted something gets a directory
and an end mark: :meth:`LiveWriter.end` says which, so a reader told that a node ended
knows whether to wait for the mark (decision 235).

This module imports only the standard library: ``show --follow`` and the Studio read it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_BYTES",
    "LIVE_DIR",
    "LiveCursor",
    "LiveWriter",
    "live_dir",
    "max_bytes_from_env",
]

LIVE_DIR = "live"
END_MARK = "end"
MAX_BYTES_ENV = "STEERFLOW_LIVE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 20
_COALESCE_S = 0.02  # what a viewer waits at most for a chunk, on top of its own polling
_ELIDED = "\n[… output not kept: only the head and the tail are …]\n"


def max_bytes_from_env(env: Mapping[str, str] | None = None) -> int:
    """``STEERFLOW_LIVE_MAX_BYTES`` (at least 4 KiB), else 1 MiB; 0 turns live files off."""
    raw = (os.environ if env is None else env).get(MAX_BYTES_ENV, "")
    try:
        value = int(raw) if raw.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES
    return 0 if value <= 0 else max(value, 4096)


def live_dir(run_dir: Path, node_key: str) -> Path:
    """Where one node's live segments are."""
    return run_dir / LIVE_DIR / node_key


@dataclass
class _Node:
    directory: Path
    segment: int = 0
    size: int = 0  # bytes in the current segment
    fd: int | None = None


@dataclass(eq=False)
class _Stream:
    """One call's chunks on their way from the loop to the writer thread.

    The loop only appends to ``parts`` and the writer only takes a prefix of it (``len``,
    slice, ``del``), each one operation under the GIL: no lock and no queue item per chunk.
    """

    key: str
    parts: list[str] = field(default_factory=list)
    open: bool = False  # announced to the writer thread now running
    emitted: bool = False  # announced to any writer thread: its end will be marked


_OPEN, _END, _WAKE, _STOP = range(4)
_Item = tuple[int, _Stream | None]


@dataclass
class LiveWriter:
    """The run's one writer thread: chunks listed by the loop, appended to files off it.

    No ``fsync``: a live file is a view, never recovery data (decision 190); a crash
    that loses the page cache loses only what an operator was watching.
    """

    run_dir: Path
    max_bytes: int = field(default_factory=max_bytes_from_env)
    #: What is not a chunk, in order: a stream's first chunk, its end, a wake-up, stop.
    _control: queue.SimpleQueue[_Item] = field(default_factory=queue.SimpleQueue, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _nodes: dict[str, _Node] = field(default_factory=dict, init=False)
    _latest: dict[str, _Stream] = field(default_factory=dict, init=False)
    _idle: bool = field(default=False, init=False)  # the writer waits for a control item
    _root_made: bool = field(default=False, init=False)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def sink(self, node_key: str) -> Callable[[str], None] | None:
        """The callable a provider's chunks go to, or None when live files are off.

        What a chunk costs the loop: a list append and two flag checks. It hands the
        writer a control item only for a call's first chunk or when the writer has
        gone idle; a busy writer wakes on its own timer (decision 196).
        """
        if not self.enabled:
            return None
        stream = self._latest[node_key] = _Stream(node_key)
        parts = stream.parts

        def emit(text: str) -> None:
            if text:
                parts.append(text)
                if self._idle or not stream.open:
                    self._notify(stream)

        return emit

    def end(self, node_key: str) -> bool:
        """The node's call ended (any outcome): close its segment, mark it ended.

        Returns whether the call emitted anything: then, and only then, the writer thread
        writes its last chunks and the end mark (later, off the loop); a call that emitted
        nothing gets no directory and no mark (decision 190). A reader told the node ended
        waits for the mark only when this was true (decision 235).
        """
        stream = self._latest.pop(node_key, None)
        if self.enabled and self._thread is not None:
            self._control.put((_END, stream or _Stream(node_key)))
        return stream is not None and stream.emitted

    def close(self) -> None:
        """Write everything queued and stop the thread (blocking: call it off the loop)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._control.put((_STOP, None))
            thread.join()

    def _notify(self, stream: _Stream) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="live-writer", daemon=True)
            self._thread.start()
        if not stream.open:
            stream.open = stream.emitted = True
            self._control.put((_OPEN, stream))
        elif self._idle:
            self._idle = False
            self._control.put((_WAKE, None))

    def _run(self) -> None:
        active: dict[_Stream, None] = {}
        items: list[_Item] = []
        while True:
            # Woken by the loop or busy, first a tick on our own timer: what came in it
            # goes out as one write per node, so under a burst (100 calls streaming at
            # once) this thread asks the loop's thread for the GIL once a tick plus once
            # per syscall, whatever the chunk rate (decisions 190, 196).
            if not items or items[-1][0] != _STOP:
                time.sleep(_COALESCE_S)
            with contextlib.suppress(queue.Empty):
                while True:
                    items.append(self._control.get_nowait())
            if not self._apply(items, active):
                break
            wrote = sum(self._take(stream) for stream in active)
            items = []
            if wrote or any(stream.parts for stream in active):
                continue
            # Idle: the flag first, then a last look, so a chunk appended before the
            # loop saw the flag is found here and one appended after it sends a wake-up.
            self._idle = True
            if not any(stream.parts for stream in active):
                items.append(self._control.get())
            self._idle = False
        for stream in active:
            self._take(stream)
            stream.open = False  # a later chunk announces it to the next thread
        for key in list(self._nodes):
            with contextlib.suppress(OSError):
                self._finish(key)

    def _apply(self, items: list[_Item], active: dict[_Stream, None]) -> bool:
        """Act on the control items in order; False once stop is reached."""
        for kind, stream in items:
            if kind == _STOP:
                return False
            if stream is None:
                continue
            if kind == _OPEN:
                active[stream] = None
            elif kind == _END:
                # Every chunk of the call was appended before its end was queued.
                self._take(stream)
                active.pop(stream, None)
                self._guarded(stream.key, None)
        return True

    def _take(self, stream: _Stream) -> bool:
        """Write what the stream holds now; chunks appended meanwhile stay for the next."""
        parts = stream.parts
        count = len(parts)
        if not count:
            return False
        text = parts[0] if count == 1 else "".join(parts[:count])
        del parts[:count]
        self._guarded(stream.key, text)
        return True

    def _guarded(self, key: str, text: str | None) -> None:
        try:
            if text is None:
                self._finish(key)
            else:
                self._write(key, text.encode("utf-8", errors="replace"))
        except OSError:
            # A full disk or a removed run directory costs the view, never the run.
            self._nodes.pop(key, None)

    def _open(self, node: _Node) -> int:
        if node.fd is None:
            path = node.directory / f"{node.segment}.txt"
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            node.fd = os.open(path, flags, 0o600)
        return node.fd

    def _node(self, key: str) -> _Node:
        node = self._nodes.get(key)
        if node is None:
            root = self.run_dir / LIVE_DIR
            if not self._root_made:
                root.mkdir(mode=0o700, exist_ok=True)
                self._root_made = True
            with contextlib.suppress(FileExistsError):
                os.mkdir(root / key, 0o700)
            node = self._nodes[key] = _Node(root / key)
        return node

    def _write(self, key: str, data: bytes) -> None:
        node = self._node(key)
        head = self.max_bytes // 2
        roll = max(1, self.max_bytes // 4)
        while data:
            limit = head if node.segment == 0 else roll
            room = limit - node.size
            if room <= 0:
                self._roll(node)
                continue
            part, data = data[:room], data[room:]
            os.write(self._open(node), part)
            node.size += len(part)

    def _roll(self, node: _Node) -> None:
        """Finish the current segment, start the next, drop the one two back (never 0)."""
        if node.fd is not None:
            os.close(node.fd)
            node.fd = None
        node.segment += 1
        node.size = 0
        self._open(node)
        if node.segment - 2 >= 1:
            with contextlib.suppress(FileNotFoundError):
                (node.directory / f"{node.segment - 2}.txt").unlink()

    def _finish(self, key: str) -> None:
        node = self._nodes.pop(key, None)
        directory = node.directory if node is not None else self.run_dir / LIVE_DIR / key
        if node is not None and node.fd is not None:
            os.close(node.fd)
        _mark(directory / END_MARK)


def _mark(path: Path) -> None:
    """Create an empty 0600 file, never through a symlink; nothing if the directory is gone.

    One ``mknod`` where ``open`` + ``close`` (and a ``stat`` first) were three syscalls:
    each is a GIL round trip the loop's thread pays for while it is busy (decision 196).
    """
    try:
        os.mknod(path, 0o600 | stat.S_IFREG)
    except (FileExistsError, FileNotFoundError):
        return
    except PermissionError:  # where only the superuser may mknod (macOS)
        with contextlib.suppress(FileNotFoundError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))


@dataclass
class LiveCursor:
    """A reader's place in one node's live output: new text since the last :meth:`read`.

    It keeps the open segment's descriptor, so a segment the writer drops while it is
    being read is still read to its end; segments dropped before it got to them are
    reported as one elision line.
    """

    directory: Path
    segment: int = 0
    offset: int = 0
    _fd: int | None = None
    _pending: bytes = b""

    @property
    def position(self) -> tuple[int, int]:
        """Where the next :meth:`read` starts, for a reader that keeps no cursor (the Studio)."""
        return self.segment, max(0, self.offset - len(self._pending))

    @property
    def ended(self) -> bool:
        """Whether the writer marked the call ended (read once more to get the rest)."""
        return (self.directory / END_MARK).exists()

    def read(self) -> str:
        """Every byte written since the last call, decoded (a split character waits)."""
        return "".join(self._chunks())

    def _chunks(self) -> Iterator[str]:
        while True:
            data = self._read_segment()
            if data:
                yield self._decode(data)
            following = self._next_segment()
            if following is None:
                return
            # The next segment exists, so ours is finished: drain what came meanwhile.
            if data := self._read_segment():
                yield self._decode(data)
            if following > self.segment + 1:
                yield _ELIDED
            self._close()
            self.segment, self.offset = following, 0

    def _decode(self, data: bytes) -> str:
        data = self._pending + data
        cut = len(data)
        # Hold back an incomplete UTF-8 sequence at the end for the next read.
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if byte & 0xC0 == 0x80:
                continue
            if byte >= 0xC0:
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                if back < need:
                    cut = len(data) - back
            break
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def _read_segment(self) -> bytes:
        if self._fd is None:
            try:
                self._fd = os.open(
                    self.directory / f"{self.segment}.txt", os.O_RDONLY | os.O_NOFOLLOW
                )
            except FileNotFoundError:
                return b""
            os.lseek(self._fd, self.offset, os.SEEK_SET)
        parts = []
        while block := os.read(self._fd, 1 << 16):
            parts.append(block)
            self.offset += len(block)
        return b"".join(parts)

    def _next_segment(self) -> int | None:
        """The lowest segment after ours that exists (its existence finishes ours)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return None
        later = [
            n
            for name in names
            if name.endswith(".txt") and (n := _segment_no(name)) is not None and n > self.segment
        ]
        return min(later) if later else None

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Release the open segment."""
        self._close()


def _segment_no(name: str) -> int | None:
    stem = name.removesuffix(".txt")
    return int(stem) if stem.isdigit() else None
