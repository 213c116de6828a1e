"""Version 2 persistence: the whole D4 snapshot, republished atomically on every batch.

Each publication writes a uniquely named sibling (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600)
in the checkpoint's directory, fsyncs and closes it, renames it over
``checkpoint.json`` and fsyncs the directory.  A reader sees the previous or the new
complete file, never a partial one.

Because every snapshot is complete, a failed publication leaves nothing to reconcile:
the next successful one carries all admitted outcomes.  The v2 writer therefore keeps
accepting work after an error (the failed callers still get ``PersistenceError`` and
``persisted`` stays False).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from steerflow.errors import PersistenceError

from . import _io
from ._entries import unguarded_splice
from ._state import State, Ticket, seal

__all__ = ["V2Backend"]


class V2Backend:
    """Publishes full snapshots; methods run on a worker thread under the writer lock."""

    version = 2

    def __init__(self, path: str, state: State) -> None:
        self.path = path
        self.dirname = os.path.dirname(path) or "."
        self.name = os.path.basename(path)
        self.state = state
        self._dir_fd: int | None = None
        self.bytes_written = 0  # every byte written to a snapshot, published or not
        # A snapshot never carries a splice witness without the planned node ids it
        # refers to (Amendment 3 item 5): every run's plan has them, so this guards input.
        self._plan = state.meta.get("plan")
        if unguarded_splice(self._plan, state.spawned) is not None:
            raise ValueError(
                "an escalation retry's entry needs the plan's node ids (plan[].node_id)"
            )

    def persist(self, batch: list[Ticket]) -> None:
        """Fold the batch and publish one snapshot covering all of it."""
        seal(batch)
        for ticket in batch:
            item = ticket.item
            if (
                item is not None
                and item.kind == "spawn"
                and unguarded_splice(self._plan, [item.entry]) is not None
            ):
                ticket.done = True
                ticket.error = PersistenceError(
                    f"cannot record {item.key!r}: an escalation retry's entry needs the "
                    "plan's node ids (plan[].node_id)"
                )
                continue
            if item is not None:
                self.state.apply(item)
        try:
            self._publish(self.state.chunks({"version": 2}))
        except OSError as exc:
            error = PersistenceError(f"checkpoint write failed: {exc}")
            for ticket in batch:
                if ticket.error is None:
                    ticket.done, ticket.error = True, error
            return
        for ticket in batch:
            ticket.done = True

    def close(self) -> None:
        """Release the directory handle."""
        if self._dir_fd is not None:
            fd, self._dir_fd = self._dir_fd, None
            os.close(fd)

    def _dir(self) -> int:
        if self._dir_fd is None:
            os.makedirs(self.dirname, mode=0o700, exist_ok=True)
            self._dir_fd = _io.open_dir(self.dirname)
        return self._dir_fd

    def _publish(self, data: Iterable[bytes]) -> None:
        dir_fd = self._dir()
        tmp = _io.unique_name(f".{self.name}")
        fd = _io.create_exclusive(dir_fd, tmp, "snapshot")
        created = _io.identity(fd)
        try:
            try:
                self.bytes_written += _io.write_all(fd, data, "snapshot", vectored=True)
                _io.fsync(fd, "snapshot")
            finally:
                _io.close(fd, "snapshot")
            _io.replace(dir_fd, tmp, dir_fd, self.name, "snapshot")
        except BaseException:
            # Remove our temporary only while that name still holds the file we made.
            with contextlib.suppress(OSError):
                if _io.lstat_identity(dir_fd, tmp) == created:
                    _io.unlink(dir_fd, tmp, "snapshot")
            raise
        _io.fsync_dir(dir_fd)
