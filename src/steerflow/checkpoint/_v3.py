"""Version 3 persistence: a base snapshot plus an append-only journal of transitions.

Files
    ``checkpoint.json`` (base: the snapshot, ``version: 3``, a fresh 32-hex
    ``generation`` per publication, ``journal_seq: 0``) and ``checkpoint.json.journal``
    (one compact JSON record per line, ``seq`` 1, 2, ... within the generation).

Identity (see ``shared/design/durable-files.md``)
    Every object is created unnamed (``O_TMPFILE``) inside the private staging
    directory ``.checkpoint.json.staging`` (0700, flock'd: one writer), written and
    fsync'd through its creation descriptor, named there with ``linkat`` through
    ``/proc/self/fd``, then swapped into place with ``renameat2(RENAME_EXCHANGE)``
    (``RENAME_NOREPLACE`` when the name is free).  The identity ``(st_dev, st_ino)``
    always comes from the creation descriptor, and those descriptors stay open as pins
    until superseded.  After the swap the published name must hold that identity.
    The displaced object is unlinked only if it is the pinned previous one; anything
    else is moved to ``quarantine.*`` in staging, never destroyed.

Append and acknowledgement
    Before writing and again after the fsync, the journal descriptor must still be
    linked and both published names must still hold the pinned objects.  Only then is
    a record acknowledged.  Several queued records may share one write and one fsync.

Compaction
    Before an append that would exceed ``max_records`` records or ``max_bytes`` bytes
    (or the sequence limit), the folded state is published as a new base, the
    directory synced, and an empty journal swapped in for the old one.  A single record
    larger than ``max_bytes`` is never appended: it goes straight into a new base.
    Lines of the same batch not yet written when a compaction starts are dropped (their
    records are in the folded state the base holds), and when the record count limit
    is reached with more records of the batch behind the one reaching it, those go
    into that base too and the new journal starts empty; a batch of one record behaves
    exactly as the rule above says.  The base is assembled from the encodings the state
    keeps (see :class:`~._state.State`): nothing unchanged is encoded again.

Errors
    Any I/O error or identity mismatch stops the writer: later calls raise
    ``PersistenceError``.  Nothing is retried on a descriptor whose fsync failed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterable, Iterator

from steerflow import _faults
from steerflow.errors import CheckpointRecoveryError, PersistenceError

from . import _capture, _io
from ._load_v3 import MAX_SEQ, fold_unit
from ._report import Report
from ._state import Item, State, Ticket, dumps_compact, group_lines, seal

__all__ = ["V3Backend"]

_Pin = tuple[int, _io.Identity]  # (open creation fd, identity)
_KIND_ENTRY = {
    kind: b',"kind":' + dumps_compact(kind) + b',"entry":'
    for kind in ("op", "spawn", "intent", "step")
}


class V3Backend:
    """Owns the base/journal pair; methods run on a worker thread under the writer lock."""

    version = 3
    #: The count limit reached with more records behind it in the batch: fold them all
    #: into the base being written (version 4 journals them instead: decision 395).
    fold_batch_rest = True

    def __init__(self, path: str, state: State, *, max_records: int, max_bytes: int) -> None:
        self.dirname = os.path.dirname(path) or "."
        self.name = os.path.basename(path)
        self.jname = self.name + ".journal"
        self.staging = f".{self.name}.staging"
        self.state = state
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.generation = ""
        self.seq = 0  # last sequence number assigned in this generation
        # Outcome records in the current journal: ``max_records`` counts these. A call
        # intent is a small line closed by at most one outcome (or carried into the next
        # base), so counting it too would double the compactions of every run for no
        # bound the outcomes do not already give (decision 217).
        self.outcomes = 0
        self.jbytes = 0  # bytes in the current journal (written or buffered)
        self.broken: str | None = None
        self.resync = False  # next record restates the whole context (after reconcile)
        self._pfd: int | None = None
        self._sfd: int | None = None
        self._base: _Pin | None = None
        self._journal: _Pin | None = None
        self.compactions = 0
        self.bytes_written = 0  # bases, journal lines and compactions, published or not
        self._head: tuple[str | None, bytes] = (None, b"")  # (generation, its lines' start)

    # -- batch entry point -----------------------------------------------------

    def persist(self, batch: list[Ticket]) -> None:
        """Append (or compact) every item of ``batch`` in order and acknowledge it."""
        seal(batch)
        if self.broken is not None:
            self._fail_all(batch, PersistenceError(self._stopped_message()))
            return
        pending: list[Ticket] = []
        buf: list[bytes] = []
        try:
            if self._journal is None or self._base is None:
                self._initialize()
            left = sum(_counts(ticket.item) for ticket in batch)
            for index, ticket in enumerate(batch):
                item = ticket.item
                if item is None:
                    pending.append(ticket)
                    continue
                counted = _counts(item)
                left -= counted
                # The entry and the context change are encoded once: the line for
                # either generation, and every later base, reuse these bytes.
                entry = self.state.encode_entry(item.entry)
                tail = self._tail(item, entry)
                line = self._line(tail, self.seq + 1)
                # Before any compaction, lines still in ``buf`` are dropped, not written:
                # their items are folded into the state, so the new base holds them
                # (version 4 writes them first: its journal becomes a segment, ``_spill``).
                if len(line) > self.max_bytes:
                    self._spill(buf, pending)
                    self.state.apply(item, entry)
                    self._compact()  # the oversize transition lands in the new base
                    self.resync = False
                    pending.append(ticket)  # acknowledged by the next commit's checks
                    continue
                if self.fold_batch_rest and counted and self.outcomes >= self.max_records and left:
                    # The count limit, with more records admitted in the same batch:
                    # all of them go into the base that is being written anyway, and
                    # the new journal starts empty (fewer compactions under load).
                    buf.clear()
                    self.state.apply(item, entry)
                    pending.append(ticket)
                    for rest in batch[index + 1 :]:
                        if rest.item is not None:
                            self.state.apply(rest.item)
                        pending.append(rest)
                    self._compact()
                    self.resync = False
                    break
                if (
                    (counted and self.outcomes >= self.max_records)
                    or self.jbytes + len(line) > self.max_bytes
                    or self.seq >= MAX_SEQ
                ):
                    self._spill(buf, pending)
                    self._compact()
                    line = self._line(tail, 1)
                buf.append(line)
                self._buffered(item, entry, line)
                if counted:  # an intent never restates the context: the next outcome does
                    self.resync = False
                self.seq += 1
                self.outcomes += counted
                self.jbytes += len(line)
                self.state.apply(item, entry)
                pending.append(ticket)
            self._commit(buf, pending)
        except Exception as exc:  # anything after the first byte is an uncertain outcome
            self.broken = f"{type(exc).__name__}: {exc}"
            error = exc if isinstance(exc, PersistenceError) else None
            self._fail_all(batch, error or PersistenceError(f"checkpoint write failed: {exc}"))

    def reconcile(self) -> None:
        """Adopt what is durably on disk and continue in a fresh generation.

        The durable prefix is reloaded through the journal-aware loader (a complete
        line that was never acknowledged is kept), published as a new base with an
        empty journal, and the next record restates the whole context, because the
        admitted baseline may include transitions that never reached the disk.
        """
        if self.broken is None:
            return
        if self._base is None or self._journal is None:
            self.broken = None  # initialization never finished: the next write redoes it
            return
        try:
            # Read the objects this writer created and pinned, never whatever occupies
            # the published names now: a substitute must not be adopted, and its
            # quarantine by the compaction below restores the names' reachability.
            base, journal = self._read_pin(self._base), self._read_pin(self._journal)
            state = fold_unit(base, journal, Report())
        except CheckpointRecoveryError as exc:
            raise PersistenceError(f"reconciliation could not load the checkpoint: {exc}") from exc
        except OSError as exc:
            raise PersistenceError(f"reconciliation could not read its own files: {exc}") from exc
        try:
            self.state.reset(
                dict(state["ops"]),
                list(state["spawned"]),
                _capture.freeze(state["flow_context"]),
                list(state.get("in_flight", ())),
                list(state.get("steps", ())),
            )
            self._compact()
        except (OSError, ValueError) as exc:
            raise PersistenceError(f"reconciliation failed: {exc}") from exc
        self.resync = True
        self.broken = None

    @staticmethod
    def _read_pin(pin: _Pin) -> bytes:
        """The bytes of a pinned object, through its descriptor (write-only: reopen it)."""
        fd = os.open(f"/proc/self/fd/{pin[0]}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _io.identity(fd) != pin[1]:
                raise PersistenceError("a pinned checkpoint descriptor changed identity")
            chunks: list[bytes] = []
            offset = 0
            while chunk := os.pread(fd, 1 << 20, offset):
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _remove_staging(self) -> None:
        """At close, remove the staging directory if it is still ours and empty.

        It is needed only while a writer holds it (every object is made there), so it is
        not left in every run directory. Still under the lock: no other writer can use it
        meanwhile. Anything in it (a quarantined object) keeps it, untouched; a name that
        no longer holds the directory we locked is left alone.
        """
        pfd, sfd = self._pfd, self._sfd
        if pfd is None or sfd is None:
            return
        if _io.lstat_identity(pfd, self.staging) != _io.identity(sfd):
            return
        # No directory fsync: an empty staging directory that power loss brings back is
        # harmless (the next writer reuses it), and nothing published depends on it.
        _io.remove_dir(pfd, self.staging, "staging")

    def _release_dirs(self) -> None:
        for fd in (self._sfd, self._pfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._sfd = self._pfd = None

    def close(self) -> None:
        """Close every descriptor and drop the writer lock (errors propagate)."""
        errors: list[OSError] = []
        for pin in (self._journal, self._base):
            if pin is not None:
                try:
                    _io.close(pin[0], "pin")
                except OSError as exc:
                    errors.append(exc)
        self._journal = self._base = None
        self.state.release()
        try:
            self._remove_staging()
        except OSError as exc:
            errors.append(exc)
        self._release_dirs()
        if errors:
            raise PersistenceError(f"closing the checkpoint files failed: {errors[0]}")

    # -- helpers ---------------------------------------------------------------

    def _stopped_message(self) -> str:
        return f"checkpoint writer stopped after an earlier failure ({self.broken})"

    @staticmethod
    def _fail_all(batch: list[Ticket], error: BaseException) -> None:
        for ticket in batch:
            if not ticket.done:
                ticket.done, ticket.error = True, error

    def _tail(self, item: Item, entry: bytes) -> bytes:
        """The members after ``seq``: kind, the encoded entry, the context change."""
        tail = _KIND_ENTRY[item.kind] + entry
        if item.kind in ("intent", "step"):
            return tail + b"}\n"
        if self.resync:
            # Disk and the admitted baseline may differ after reconciliation: restate it.
            patch: object = [{"op": "replace", "path": "", "value": item.context}]
        elif item.patch:
            patch = item.patch
        else:
            return tail + b"}\n"
        return tail + b',"flow_context":{"patch":' + dumps_compact(patch) + b"}}\n"

    def _line(self, tail: bytes, seq: int) -> bytes:
        """Exactly ``dumps_compact(record) + LF`` for the record of ``item`` at ``seq``."""
        if self._head[0] != self.generation:  # encoded once per generation, not per line
            gen = dumps_compact(self.generation)
            self._head = (self.generation, b'{"version":3,"generation":' + gen + b',"seq":')
        return b"".join((self._head[1], str(seq).encode("ascii"), tail))

    def _buffered(self, item: Item, entry: bytes, line: bytes) -> None:
        """Called with each line put in the batch's buffer, before ``jbytes`` counts it."""

    def _spill(self, buf: list[bytes], pending: list[Ticket]) -> None:
        """Before a compaction: drop the batch's unwritten lines (the new base holds them)."""
        buf.clear()

    def _write_lines(self, buf: list[bytes], pending: list[Ticket]) -> None:
        """Write and fsync the buffered lines (acknowledging is the caller's)."""
        assert self._journal is not None
        fd = self._journal[0]
        # A batch of call intents alone is its own seam (``intent-write``, ...): fault
        # points counted in outcome records keep their numbers (decision 217).
        obj = "journal" if any(_counts(t.item) for t in pending) else "intent"
        self._check_reachable()
        self.bytes_written += _io.write_all(fd, group_lines(buf), obj)
        _faults.seam(f"{obj}-flush", "before")  # raw fd: nothing buffered in userspace
        _faults.seam(f"{obj}-flush", "after")
        _io.fsync(fd, obj)
        buf.clear()

    def _commit(self, buf: list[bytes], pending: list[Ticket]) -> None:
        """Write and fsync the buffered lines, check reachability, acknowledge them."""
        if buf:
            self._write_lines(buf, pending)
        if pending:
            # Every acknowledgement (a flush or a compacted oversize record included)
            # requires the published names to hold the objects this writer owns.
            self._check_reachable()
        _faults.seam("advance", "before")
        for ticket in pending:
            ticket.done = True
        pending.clear()
        _faults.seam("advance", "after")

    def _check_reachable(self) -> None:
        assert self._journal is not None and self._base is not None and self._pfd is not None
        jfd, jid = self._journal
        if os.fstat(jfd).st_nlink < 1:
            raise PersistenceError("the journal was unlinked; refusing to acknowledge")
        if _io.lstat_identity(self._pfd, self.jname) != jid:
            raise PersistenceError(f"{self.jname!r} no longer names the journal this writer owns")
        if _io.lstat_identity(self._pfd, self.name) != self._base[1]:
            raise PersistenceError(f"{self.name!r} no longer names the base this writer owns")

    def _open_dirs(self) -> None:
        """Open the run directory and the locked staging directory (idempotent)."""
        if self._pfd is None:
            os.makedirs(self.dirname, mode=0o700, exist_ok=True)
            pfd = _io.open_dir(self.dirname)
            mode = os.fstat(pfd).st_mode
            if mode & 0o022 and not mode & stat.S_ISVTX:
                os.close(pfd)
                raise PersistenceError(f"{self.dirname!r} is writable by others and not sticky")
            self._pfd = pfd
        for _ in range(8):
            if self._sfd is not None:
                return
            sfd = _io.open_staging(self._pfd, self.staging)
            try:
                _io.lock_exclusive(sfd)
            except BaseException as exc:
                os.close(sfd)
                if isinstance(exc, BlockingIOError):
                    raise PersistenceError(
                        f"another writer owns the checkpoint in {self.dirname!r}"
                    ) from None
                raise
            if _io.lstat_identity(self._pfd, self.staging) == _io.identity(sfd):
                self._sfd = sfd
                return
            # A writer that closed meanwhile removed the directory we locked (see
            # _remove_staging): its lock protects nothing now, so make a new one.
            os.close(sfd)
        raise PersistenceError(f"the staging directory in {self.dirname!r} keeps vanishing")

    def _initialize(self) -> None:
        """Publish an empty journal, then the first base (a base never lacks its journal).

        Safe to repeat after a failed attempt: objects this writer already published
        are pinned and passed as the expected previous occupants.
        """
        self._open_dirs()
        self.generation = uuid.uuid4().hex
        old_journal, old_base = self._journal, self._base
        self._journal = self._publish(self.jname, b"", "journal", previous=old_journal)
        if old_journal is not None:
            _io.close(old_journal[0], "pin")
        data, size = self._base_bytes()
        self._base = self._publish(self.name, data, "base", previous=old_base, size=size)
        self._adopt_base()
        if old_base is not None:
            _io.close(old_base[0], "pin")
        self.seq = self.jbytes = self.outcomes = 0

    def _adopt_base(self) -> None:
        """Let the state read unchanged entries back from the base just published.

        Its kept encodings then cost no memory (decision 65). The base is this writer's
        own object, pinned and never written again; it is read through a descriptor of
        that object (identity checked), never through its published name. Where it
        cannot be reopened the encodings simply stay in memory.
        """
        assert self._base is not None
        try:
            fd = os.open(f"/proc/self/fd/{self._base[0]}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            same = _io.identity(fd) == self._base[1]
        except OSError:
            same = False
        if not same:
            os.close(fd)
            return
        self.state.published(fd)

    def _base_bytes(self) -> tuple[Iterator[bytes | _io.Span], int]:
        """The new base's pieces and its exact length (its blocks are reserved first)."""
        head: dict[str, object] = {"version": 3, "generation": self.generation, "journal_seq": 0}
        # Spans of the previous base are copied in the kernel (copy_file_range), never
        # read into this process: no transient buffers for its malloc arena to keep.
        pieces = self.state.pieces(head)
        return pieces, self.state.assembled

    def _compact(self) -> None:
        """Publish the folded state as a new generation's base, then an empty journal."""
        self.generation = uuid.uuid4().hex
        old_base, old_journal = self._base, self._journal
        data, size = self._base_bytes()
        self._base = self._publish(self.name, data, "base", previous=old_base, size=size)
        self._adopt_base()
        self._journal = self._publish(self.jname, b"", "journal", previous=old_journal)
        self.seq = self.jbytes = self.outcomes = 0
        self.compactions += 1
        for pin in (old_base, old_journal):
            if pin is not None:
                _io.close(pin[0], "pin")

    def _publish(
        self,
        name: str,
        data: bytes | Iterable[bytes | _io.Span],
        obj: str,
        *,
        previous: _Pin | None,
        size: int | None = None,
    ) -> _Pin:
        """Create, fill, fsync and install one object under ``name``; return its pin.

        ``size``: the exact length of ``data`` when known (bases), reserved before writing.
        """
        assert self._pfd is not None and self._sfd is not None
        sfd = self._sfd
        append = obj == "journal"
        temp = _io.unique_name(obj)
        fd = _io.create_tmpfile(sfd, obj, append=append)
        named = fd is None
        if fd is None:
            fd = _io.create_exclusive(sfd, temp, obj, append=append)
        created = _io.identity(fd)
        try:
            self.bytes_written += _io.write_all(fd, data, obj, vectored=True, size=size)
            _faults.seam(f"{obj}-flush", "before")  # raw fd: nothing buffered in userspace
            _faults.seam(f"{obj}-flush", "after")
            _io.fsync(fd, obj)
            if not named:
                _io.link_fd(fd, sfd, temp, obj)
                named = True
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
                if named and _io.lstat_identity(sfd, temp) == created:
                    _io.unlink(sfd, temp, "cleanup")
            raise
        try:
            self._install(temp, name, obj, created, previous)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return fd, created

    def _install(
        self, temp: str, name: str, obj: str, created: _io.Identity, previous: _Pin | None
    ) -> None:
        pfd, sfd = self._pfd, self._sfd
        assert pfd is not None and sfd is not None
        swapped = _io.exchange(sfd, temp, pfd, name, obj)
        if swapped is None:
            # No renameat2 flags here: check the occupant, then a plain rename (R3).
            occupant = _io.lstat_identity(pfd, name)
            if occupant is not None and (previous is None or occupant != previous[1]):
                raise PersistenceError(f"{name!r} holds an object this writer did not create")
            _io.replace(sfd, temp, pfd, name, obj)
        if _io.lstat_identity(pfd, name) != created:
            raise PersistenceError(f"{name!r} does not hold the file this writer just created")
        _io.fsync_dir(pfd)
        if swapped:
            self._dispose(temp, name, previous)

    def _dispose(self, temp: str, name: str, previous: _Pin | None) -> None:
        """Handle what the exchange moved into staging: ours is removed, others kept."""
        sfd = self._sfd
        assert sfd is not None
        displaced = _io.lstat_identity(sfd, temp)
        if displaced is None:
            return
        if previous is not None and displaced == previous[1]:
            _io.unlink(sfd, temp, "cleanup")
            return
        keep = f"quarantine.{name}.{uuid.uuid4().hex}"
        if _io.rename_noreplace(sfd, temp, sfd, keep, "quarantine") is False:
            raise OSError(errno.EEXIST, f"quarantine name {keep!r} is taken")


def _counts(item: Item | None) -> int:
    """1 for an outcome record (what ``max_records`` counts), 0 for an intent or a flush."""
    return 0 if item is None or item.kind in ("intent", "step") else 1
