"""Version 4 persistence: immutable segments under a manifest, plus version 3's journal.

Files (decision 340)
    ``checkpoint.json`` is a small manifest naming the segments (length and SHA-256
    each), carrying the flow context, open intents and steps; ``checkpoint.json.seg.<hex>``
    are immutable segments: one meta segment (the constant snapshot members, written
    once per writer) and entry segments; ``checkpoint.json.journal`` is version 3's
    journal with records saying ``version: 4``.

Compaction
    Where version 3 republishes the whole base, a compaction here names the journal it
    replaces as a level-0 segment (decision 395: its lines already hold each entry
    upserted since the previous manifest, fsync'd; a record too large for the journal
    goes into an entry segment written for it), merges the last
    :data:`SEGMENT_FANOUT` segments into one of the next level when they share a level
    (each identity's current entry, superseded copies dropped), syncs the directory,
    publishes the new manifest exactly as version 3 publishes a base, then the empty
    journal, and only then unlinks the segments the new manifest no longer names (those
    this writer created and still pins, identity checked).

Segments
    Created unnamed in the staging directory, written and fsync'd through their creation
    descriptor, then linked under a fresh name in the run directory (``linkat`` refuses a
    taken name: nothing is ever replaced).  A read-only descriptor of each stays open as
    its pin; merges read entries back through it, never through the name.

Every other rule (admission, acknowledgement, reachability, reconciliation, the journal's
limits) is version 3's (:mod:`._v3`), which this backend extends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from steerflow import _faults
from steerflow.errors import CheckpointRecoveryError, PersistenceError

from . import _capture, _io
from ._digest import JSON
from ._load_v4 import SEGMENT_PREFIX, fold_v4, seal_manifest
from ._readback import ClosedEntries, Location, entry_of_encoding, entry_of_member
from ._report import Report
from ._state import Item, State, Ticket, dumps_compact
from ._v3 import _KIND_ENTRY, V3Backend

__all__ = ["PUBLISH_JOURNALS", "SEGMENT_FANOUT", "SegmentState", "V4Backend"]

#: Segments of one level merged into one of the next (decision 340): at 128 records per
#: compaction, one merge level below 4,096 x 32 entries, and at most 31 segments a level.
SEGMENT_FANOUT = 32

#: A compaction publishes the journal it replaces as a level-0 segment (decision 395).
#: False writes its entries into a new segment instead, as stops 49-53 did (tests write
#: that form with it: readers keep reading it).
PUBLISH_JOURNALS = True

_Id = tuple[str, str]  # ("op", agent_id) or ("spawn", node_id)
#: What a version 4 writer's state keeps in place of an entry it has encoded.
_FORGOTTEN: dict[str, JSON] = {}


@dataclass
class SegmentState(State):
    """:class:`State` that also keeps the encodings upserted since the last manifest."""

    dirty: dict[_Id, bytes] = field(default_factory=dict, repr=False)
    #: The seeded entries (a resume's) until the first manifest names their segment:
    #: encoded one at a time as it is written, never all at once (a resumed batch's
    #: every response would otherwise be held a second time, as bytes).
    seeded: dict[_Id, dict[str, JSON]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, state: State) -> SegmentState:
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.init}
        made = cls(**fields)
        for key, entry in made.ops.items():
            made.seeded["op", key] = entry
        for entry in made.spawned:
            made.seeded["spawn", str(entry["node_id"])] = entry
        made.forget_all()
        return made

    def apply(self, item: Item, encoded: bytes | None = None) -> None:
        if item.kind in ("op", "spawn"):
            enc = encoded if encoded is not None else self.encode_entry(item.entry)
            self.dirty[item.kind, item.key] = enc
            super().apply(item, enc)
            self._forget(item.kind, item.key)
            return
        super().apply(item, encoded)

    def _forget(self, kind: str, key: str) -> None:
        """Keep an entry's place, not the entry (issue 43 item 2: no response held twice).

        A version 4 writer never reads an entry back from memory: the next segment takes
        its encoding from ``dirty``, a merge reads it from its segment, a reconciliation
        from disk. Only its position (ops order, spawn index) is kept.
        """
        if kind == "op":
            self.ops[key] = _FORGOTTEN
        else:
            self.spawned[self.spawn_index[key]] = _FORGOTTEN

    def forget_all(self) -> None:
        """:meth:`_forget` every entry (after a seed or a reconciliation encoded them)."""
        for key in self.ops:
            self.ops[key] = _FORGOTTEN
        self.spawned = [_FORGOTTEN] * len(self.spawned)


@dataclass
class _Segment:
    """One published segment: its reference in the manifest, its pin and its members."""

    name: str
    level: int  # -1: the meta segment
    size: int
    sha256: str
    fd: int  # read-only, identity checked: the pin
    ident: _io.Identity
    #: Each identity's member (``"key":{...}`` or ``{...}``) as (offset, length), in order.
    members: dict[_Id, tuple[int, int]] = field(default_factory=dict)
    #: A journal published as a segment: the generation its records carry (decision 395).
    journal: str | None = None

    def ref(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {"name": self.name, "bytes": self.size, "sha256": self.sha256}
        if self.level >= 0:
            out["level"] = self.level
        if self.journal is not None:
            out["journal"] = self.journal
        return out


class V4Backend(V3Backend):
    """The version 3 backend with a segmented base (see the module docstring)."""

    version = 4
    fold_batch_rest = False  # the records behind go to the new journal (decision 395)

    def __init__(self, path: str, state: State, *, max_records: int, max_bytes: int) -> None:
        super().__init__(path, SegmentState.of(state), max_records=max_records, max_bytes=max_bytes)
        self.state: SegmentState
        self._meta: _Segment | None = None
        self._segments: list[_Segment] = []  # entry segments, in manifest order
        self._retired: list[_Segment] = []  # no longer named once the next manifest is out
        self._orphans: list[_Segment] = []  # written by a compaction that did not publish
        # Held by a read-back (on the event loop) while it reads through a pin, and here
        # while a pin is closed: a descriptor number closed under a reader could be
        # another file's by the time it reads (decision 393).
        self._pins_lock = threading.Lock()
        self._closed: ClosedEntries | None = None
        # The current journal as a segment-to-be (decision 395): the SHA-256 of what is
        # written (its size is ``jbytes`` once ``_spill`` wrote the batch's lines), each
        # entry's range in it with the encoding written there, and the ranges of lines
        # buffered but not yet written.
        self._jdigest = hashlib.sha256()
        self._jentries: dict[_Id, tuple[int, int, bytes]] = {}
        self._jbuffered: list[tuple[_Id, int, int, bytes]] = []

    # -- the journal line: version 4 --------------------------------------------------------

    def _line(self, tail: bytes, seq: int) -> bytes:
        if self._head[0] != self.generation:
            gen = dumps_compact(self.generation)
            self._head = (self.generation, b'{"version":4,"generation":' + gen + b',"seq":')
        return b"".join((self._head[1], str(seq).encode("ascii"), tail))

    def _adopt_base(self) -> None:
        """Nothing to adopt: entries live in segments, which keep their own pins."""

    def _buffered(self, item: Item, entry: bytes, line: bytes) -> None:
        if item.kind not in ("op", "spawn"):
            return  # intents and steps: the manifest restates what is open
        # ``line`` is head + seq + ``,"kind":..,"entry":`` + entry + the rest (``_tail``).
        at = len(self._head[1]) + len(str(self.seq + 1)) + len(_KIND_ENTRY[item.kind])
        assert line.startswith(entry, at), "the entry is not where the line puts it"
        self._jbuffered.append(((item.kind, item.key), self.jbytes + at, len(entry), entry))

    def _write_lines(self, buf: list[bytes], pending: list[Ticket]) -> None:
        digest = self._jdigest.copy()
        for line in buf:
            digest.update(line)
        buffered, self._jbuffered = self._jbuffered, []
        super()._write_lines(buf, pending)  # raises, and the writer stops, unless durable
        self._jdigest = digest
        for ident, offset, length, entry in buffered:
            self._jentries[ident] = (offset, length, entry)

    def _spill(self, buf: list[bytes], pending: list[Ticket]) -> None:
        """Write the batch's lines so far: the journal about to be published holds them.

        Dropping them (version 3) would put their entries in a second new segment; they
        are acknowledged with the rest of the batch, after the compaction.
        """
        if buf:
            self._write_lines(buf, pending)

    def _new_journal(self) -> None:
        """Forget the journal just replaced: its lines are a segment now, or folded."""
        self._jdigest = hashlib.sha256()
        self._jentries = {}
        self._jbuffered = []

    # -- publication ------------------------------------------------------------------------

    def _initialize(self) -> None:
        """Publish an empty journal, then the segments and the first manifest."""
        self._open_dirs()
        self.generation = uuid.uuid4().hex
        old_journal = self._journal
        self._journal = self._publish(self.jname, b"", "journal", previous=old_journal)
        self._new_journal()
        if old_journal is not None:
            _io.close(old_journal[0], "pin")
        self._publish_manifest()
        self.seq = self.jbytes = self.outcomes = 0

    def _compact(self, *, replace: bool = False) -> None:
        """Publish the new entries as segments, a new manifest, then an empty journal.

        ``replace``: the new segments hold every entry (a reconciliation's), so the new
        manifest names only them.
        """
        self._jbuffered = []  # none: ``_spill`` wrote the batch's lines before this
        old_generation, self.generation = self.generation, uuid.uuid4().hex
        old_journal = self._journal
        self._publish_manifest(old_generation, replace=replace)
        self._journal = self._publish(self.jname, b"", "journal", previous=old_journal)
        self._new_journal()
        self.seq = self.jbytes = self.outcomes = 0
        self.compactions += 1
        if old_journal is not None:
            _io.close(old_journal[0], "pin")
        self._unlink_retired()

    def _publish_manifest(self, journal_generation: str = "", *, replace: bool = False) -> None:
        """Write the new segments, sync the directory, then swap the manifest in.

        ``journal_generation``: the generation of the journal being replaced (a
        compaction's), whose entry lines become the first new segment (decision 395).
        ``replace``: name only the new segments; the current ones are retired once the
        manifest is out. Nothing changes before that: a failed attempt leaves
        ``_segments`` naming what the published manifest names (a reconciliation retried
        after a failed one folds them again).
        """
        old = self._base
        new: list[_Segment] = []
        if self._meta is None:
            self._meta = self._write_segment(self._meta_pieces(), -1)
            new.append(self._meta)
            self._orphans.append(self._meta)  # until the manifest naming it is published
        segments = [] if replace else list(self._segments)
        retired: list[_Segment] = list(self._segments) if replace else []

        def add(seg: _Segment) -> None:
            nonlocal retired
            new.append(seg)
            self._orphans.append(seg)
            segments.append(seg)
            while len(segments) >= SEGMENT_FANOUT and (
                len({s.level for s in segments[-SEGMENT_FANOUT:]}) == 1
            ):
                group = segments[-SEGMENT_FANOUT:]
                merged = self._write_segment(self._merged_pieces(group), group[0].level + 1)
                new.append(merged)
                self._orphans.append(merged)
                retired += group
                segments[-SEGMENT_FANOUT:] = [merged]

        if self.state.seeded:  # the first publication (decision 43): they come first
            add(self._write_segment(self._seeded_pieces(), 0))
        elif self.state.dirty:
            rest = self.state.dirty
            if PUBLISH_JOURNALS and self._jentries and journal_generation:
                add(self._journal_segment(journal_generation))
                # What the journal holds as it is now needs no second copy; an entry
                # folded in since (a batch compacted without its lines) does.
                lines = self._jentries
                rest = {
                    ident: enc
                    for ident, enc in rest.items()
                    if (line := lines.get(ident)) is None or line[2] is not enc
                }
            if rest:
                add(self._write_segment(self._entry_pieces(rest), 0))
        if new:
            _io.fsync_dir(self._pfd_checked())  # their names are durable before any use
        data = seal_manifest(dumps_compact(self._manifest(segments)))
        self._base = self._publish(self.name, data, "manifest", previous=old)
        # Published: the new segments are named, the retired ones (merged away, an
        # intermediate merge of a cascade included) no longer are.
        # An earlier attempt's segment that this manifest names (the meta segment of an
        # initialization that failed after writing it) is no orphan either: only what no
        # manifest names may be retired by a reconciliation.
        # Nor is a cascade's intermediate merge, retired below: every segment is in at
        # most one list, so its pin is closed exactly once (a descriptor number closed
        # twice could be another file's by then).
        leftover = [
            s
            for s in self._orphans
            if s is not self._meta and s not in segments and s not in retired
        ]
        if replace:  # what a failed compaction left: no manifest names it now either
            retired, leftover = retired + leftover, []
        self._orphans = leftover
        self._segments = segments
        self._retired += retired
        self.state.dirty = {}
        self.state.seeded = {}
        if old is not None:
            _io.close(old[0], "pin")

    def _manifest(self, segments: list[_Segment]) -> dict[str, JSON]:
        assert self._meta is not None
        doc: dict[str, JSON] = {
            "version": 4,
            "generation": self.generation,
            "journal_seq": 0,
            "meta": self._meta.ref(),
            "segments": [s.ref() for s in segments],
            "flow_context": self.state.to_json(self.state.context),
        }
        if self.state.intents:
            doc["in_flight"] = list(self.state.intents.values())
        if self.state.steps:
            doc["steps"] = self.state.steps.entries()
        return doc

    def _pfd_checked(self) -> int:
        assert self._pfd is not None
        return self._pfd

    # -- segments ---------------------------------------------------------------------------

    def _meta_pieces(self) -> Iterator[bytes | _Id]:
        meta = self.state.meta
        doc: dict[str, JSON] = {k: meta[k] for k in ("session_id", "prompt", "plan", "config")}
        if meta.get("max_spawn") is not None:
            doc["max_spawn"] = meta["max_spawn"]
        body = dumps_compact(doc)
        yield body[1:]  # after the segment's own head

    def _entry_pieces(self, dirty: dict[_Id, bytes]) -> Iterator[bytes | _Id]:
        """The pieces of a segment holding ``dirty`` (in upsert order, ops first)."""
        ops = (
            (ident, dumps_compact(ident[1]) + b":" + enc)
            for ident, enc in dirty.items()
            if ident[0] == "op"
        )
        spawned = ((ident, enc) for ident, enc in dirty.items() if ident[0] == "spawn")
        return self._sections(ops, spawned)

    def _seeded_pieces(self) -> Iterator[bytes | _Id]:
        """The seeded entries (each encoded as it is written), then anything upserted since."""
        seeded, dirty, state = self.state.seeded, self.state.dirty, self.state

        def members(kind: str) -> Iterator[tuple[_Id, bytes]]:
            for ident, entry in seeded.items():
                if ident[0] == kind:  # a later upsert keeps the seeded entry's place
                    yield ident, dirty.get(ident) or state.encode_entry(entry)
            for ident, enc in dirty.items():
                if ident[0] == kind and ident not in seeded:
                    yield ident, enc

        ops = ((ident, dumps_compact(ident[1]) + b":" + enc) for ident, enc in members("op"))
        return self._sections(ops, members("spawn"))

    def _merged_pieces(self, group: list[_Segment]) -> Iterator[bytes | _Id]:
        """The current entry of every identity ``group`` names, read back from its pin."""
        order: dict[_Id, None] = {}
        for seg in group:
            for ident in seg.members:
                order.setdefault(ident, None)
        holder: dict[_Id, _Segment] = {}
        for seg in group:  # later segments win: the latest upsert
            for ident in seg.members:
                holder[ident] = seg

        def read(ident: _Id) -> bytes:
            seg = holder[ident]
            offset, length = seg.members[ident]
            data = os.pread(seg.fd, length, offset)
            if len(data) != length:
                raise OSError(5, f"segment {seg.name!r} is shorter than its members")
            if seg.journal is not None and ident[0] == "op":
                return dumps_compact(ident[1]) + b":" + data  # a journal line holds it bare
            return data

        ops = ((i, read(i)) for i in order if i[0] == "op")
        spawned = ((i, read(i)) for i in order if i[0] == "spawn")
        return self._sections(ops, spawned)

    @staticmethod
    def _sections(
        ops: Iterator[tuple[_Id, bytes]], spawned: Iterator[tuple[_Id, bytes]]
    ) -> Iterator[bytes | _Id]:
        """``"ops":{...},"spawned":[...]}``; each member preceded by its identity marker.

        The markers (tuples) let :meth:`_write_segment` record where each member lands.
        """
        yield b'"ops":{'
        first = True
        for ident, member in ops:
            if not first:
                yield b","
            first = False
            yield ident
            yield member
        yield b'},"spawned":['
        first = True
        for ident, member in spawned:
            if not first:
                yield b","
            first = False
            yield ident
            yield member
        yield b"]}"

    def _journal_segment(self, generation: str) -> _Segment:
        """Name the journal being replaced as a level-0 segment (decision 395).

        Every line of it is written and fsync'd (each acknowledgement required it) and
        nothing appends to it once the compaction replaces it, so it is as immutable as a
        segment written for the purpose: a second copy of its entries would only cost
        their bytes again.  ``linkat`` gives it a fresh name (refusing a taken one).
        """
        assert self._journal is not None
        jfd, jid = self._journal
        pfd = self._pfd_checked()
        name = SEGMENT_PREFIX + uuid.uuid4().hex
        _io.link_fd(jfd, pfd, name, "journal-segment")
        pin = os.open(f"/proc/self/fd/{jfd}", os.O_RDONLY | os.O_CLOEXEC)
        if _io.identity(pin) != jid or _io.lstat_identity(pfd, name) != jid:
            os.close(pin)
            raise PersistenceError(f"{name!r} does not hold the journal this writer wrote")
        members = {ident: (at, length) for ident, (at, length, _) in self._jentries.items()}
        digest = self._jdigest.hexdigest()
        # Every line counted in ``jbytes`` is written: ``_spill`` wrote the batch's.
        return _Segment(name, 0, self.jbytes, digest, pin, jid, members, generation)

    def _write_segment(self, pieces: Iterable[bytes | _Id], level: int) -> _Segment:
        """Create, write, fsync and name one segment; return it pinned (read-only fd)."""
        assert self._pfd is not None and self._sfd is not None
        hexid = uuid.uuid4().hex
        name = SEGMENT_PREFIX + hexid
        head = b'{"version":4,"segment":"' + hexid.encode("ascii") + b'",'
        digest = hashlib.sha256()
        members: dict[_Id, tuple[int, int]] = {}
        offset = 0
        pending: _Id | None = None

        def stream() -> Iterator[bytes]:
            nonlocal offset, pending
            for piece in _after(head, pieces):
                if isinstance(piece, tuple):
                    pending = piece  # the next piece is this identity's member
                    continue
                if pending is not None:
                    members[pending] = (offset, len(piece))
                    pending = None
                digest.update(piece)
                offset += len(piece)
                yield piece

        sfd, pfd = self._sfd, self._pfd
        temp = _io.unique_name("segment")
        fd = _io.create_tmpfile(sfd, "segment")
        named = fd is None  # created under ``temp`` in staging
        linked = False  # named in the run directory
        if fd is None:
            fd = _io.create_exclusive(sfd, temp, "segment")
        created = _io.identity(fd)
        try:
            self.bytes_written += _io.write_all(fd, stream(), "segment")
            _faults.seam("segment-flush", "before")  # raw fd: nothing buffered
            _faults.seam("segment-flush", "after")
            _io.fsync(fd, "segment")
            if named:  # made under a staging name (no O_TMPFILE): move it, never replacing
                if not _io.rename_noreplace(sfd, temp, pfd, name, "segment"):
                    raise PersistenceError(f"cannot name the segment {name!r} without replacing")
            else:  # unnamed: linkat refuses a taken name, so nothing is ever replaced
                _io.link_fd(fd, pfd, name, "segment")
            named = linked = True
            pin = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
                if named and not linked and _io.lstat_identity(sfd, temp) == created:
                    _io.unlink(sfd, temp, "cleanup")
            raise
        os.close(fd)
        if _io.identity(pin) != created or _io.lstat_identity(pfd, name) != created:
            os.close(pin)
            raise PersistenceError(f"{name!r} does not hold the segment this writer created")
        return _Segment(name, level, offset, digest.hexdigest(), pin, created, members)

    def _unlink_retired(self) -> None:
        """Remove the segments the published manifest no longer names (ours only)."""
        pfd = self._pfd_checked()
        for seg in self._retired:
            if _io.lstat_identity(pfd, seg.name) == seg.ident:
                _io.unlink(pfd, seg.name, "segment")
            with self._pins_lock, contextlib.suppress(OSError):
                os.close(seg.fd)
        self._retired = []

    # -- read-back (decision 393) -----------------------------------------------------------

    def read_entry(self, kind: str, key: str) -> dict[str, JSON]:
        """The last entry recorded for ``(kind, key)``, read back from this writer's files.

        Safe from another thread than the one persisting: the encodings are swapped whole
        (``dirty`` only after ``_segments`` names their segment), and pins close under
        the lock this holds.

        Raises:
            PersistenceError: Nothing was recorded for it, or it cannot be read back.
        """
        ident = (kind, key)
        with self._pins_lock:
            if self._closed is not None:
                return self._closed.read(ident)
            encoded = self.state.dirty.get(ident)
            if encoded is not None:
                return entry_of_encoding(ident, encoded)
            seeded = self.state.seeded.get(ident)
            if seeded is not None:  # before the first publication
                return dict(seeded)
            for seg in reversed(self._segments):
                where = seg.members.get(ident)
                if where is not None:
                    try:
                        member = os.pread(seg.fd, where[1], where[0])
                    except OSError as exc:
                        raise PersistenceError(f"cannot read node {key!r} back: {exc}") from exc
                    return entry_of_member(ident, member)
        raise PersistenceError(f"node {key!r} has no entry in the checkpoint")

    def _closed_entries(self) -> ClosedEntries:
        """Where each entry lies once the pins are closed (the last segment naming it)."""
        locations: dict[_Id, Location] = {}
        for seg in self._segments:
            for ident, (offset, length) in seg.members.items():
                locations[ident] = (seg.name, seg.ident, offset, length)
        return ClosedEntries(os.path.abspath(self.dirname), locations, dict(self.state.dirty))

    # -- reconciliation and close -----------------------------------------------------------

    def reconcile(self) -> None:
        """Fold the durable prefix through the pins; republish it as one new segment."""
        if self.broken is None:
            return
        if self._base is None or self._journal is None or self._meta is None:
            self.broken = None  # initialization never finished: the next write redoes it
            return
        try:
            manifest = self._read_pin(self._base)
            journal = self._read_pin(self._journal)
            pinned = {s.name: _read_all(s.fd) for s in (self._meta, *self._segments)}
            state = fold_v4(manifest, pinned, journal, Report())
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
            dirty: dict[_Id, bytes] = {}
            for key, entry in self.state.ops.items():
                dirty["op", key] = self.state.encode_entry(entry)
            for entry in self.state.spawned:
                dirty["spawn", str(entry["node_id"])] = self.state.encode_entry(entry)
            self.state.dirty = dirty
            self.state.seeded = {}
            self.state.forget_all()
            self._new_journal()  # its lines may be torn: the new segment holds everything
            # Everything is in the new segment: the old ones (and any orphan of the
            # failed compaction) go once the manifest that no longer names them is out.
            self._compact(replace=True)
        except (OSError, ValueError) as exc:
            raise PersistenceError(f"reconciliation failed: {exc}") from exc
        self.resync = True
        self.broken = None

    def close(self) -> None:
        segs = [*self._segments, *self._retired, *self._orphans]
        if self._meta is not None:
            segs.append(self._meta)
        with self._pins_lock:
            self._closed = self._closed_entries()
            for seg in segs:
                with contextlib.suppress(OSError):
                    os.close(seg.fd)
        self._segments, self._retired, self._orphans, self._meta = [], [], [], None
        super().close()


def _after(head: bytes, pieces: Iterable[bytes | _Id]) -> Iterator[bytes | _Id]:
    yield head
    yield from pieces


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
