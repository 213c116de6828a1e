"""The version 4 reader: a manifest naming immutable segments, folded with its journal.

Files (decision 340)
    ``checkpoint.json`` is the manifest: ``version: 4``, ``generation``, ``journal_seq: 0``,
    ``meta`` and ``segments`` (each ``{"name", "bytes", "sha256"}``, segments with a
    ``level``), ``flow_context`` and optionally ``in_flight`` and ``steps``.  Each segment
    ``checkpoint.json.seg.<32 hex>`` is one JSON document naming itself (``segment``):
    the meta segment holds the constant snapshot members, every other one ``ops`` and
    ``spawned`` entries.  The journal is version 3's, its records saying ``version: 4``;
    a reference with a ``journal`` member (a generation) names a journal a compaction
    published as a segment (decision 395): its op and spawn records upsert in order.

Integrity
    A segment is read only through a name the manifest gives (a strict pattern: no
    path), and must have exactly the manifest's length and SHA-256 and name itself;
    otherwise the checkpoint is refused (``missing-segment``,
    ``segment-digest-mismatch``, ``segment-identity``), never partly used.  The
    manifest ends with ``manifest_sha256``, the digest of its own bytes without that
    member (``manifest-digest-mismatch``): every byte of a unit but the journal is
    covered by a digest, and the journal's entries by their ``result_digest``.

Coherent view
    As version 3's: the manifest is read through a pinned descriptor, then its segments
    and the journal, then the manifest name must still hold the pinned object; if a
    compaction published a new manifest meanwhile (and perhaps unlinked a segment the
    old one named), everything is read again (bounded).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from ._load_v3 import (
    _InvalidError,
    check_folded_base,
    check_record,
    fold_journal,
    valid_generation,
)
from ._read import CHECKPOINT_FILENAME, JOURNAL_FILENAME, Parsed, parse_json, read_pinned
from ._report import Report

__all__ = [
    "SEGMENT_PREFIX",
    "fold_v4",
    "load_v4",
    "seal_manifest",
    "segment_names",
    "valid_segment_name",
]

SEGMENT_PREFIX = CHECKPOINT_FILENAME + ".seg."
_SEGMENT_NAME = re.compile(re.escape(SEGMENT_PREFIX) + r"([0-9a-f]{32})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MANIFEST_REQUIRED = frozenset(
    {"version", "generation", "journal_seq", "meta", "segments", "flow_context"}
)
_MANIFEST_ALLOWED = _MANIFEST_REQUIRED | {"in_flight", "steps"}
_META_MEMBERS = ("session_id", "prompt", "plan", "config")
_META_REQUIRED = frozenset({"version", "segment", *_META_MEMBERS})
_ENTRIES_MEMBERS = frozenset({"version", "segment", "ops", "spawned"})
_ATTEMPTS = 5
#: The manifest's last member: the SHA-256 of the manifest's own bytes without it.
_SEAL = b',"manifest_sha256":"'
_SEALED_TAIL = re.compile(rb',"manifest_sha256":"([0-9a-f]{64})"\}\Z')


def seal_manifest(body: bytes) -> bytes:
    """``body`` (a compact JSON object) with its own digest as the last member.

    The manifest is the one file of a unit no other digest covers (segments are covered
    by it, entries by their ``result_digest``), so it covers itself: any change to its
    bytes, the flow context included, is a refusal rather than a different resume.
    """
    digest = hashlib.sha256(body).hexdigest().encode("ascii")
    return body[:-1] + _SEAL + digest + b'"}'


def _unseal(data: bytes) -> bytes:
    """The manifest's bytes as digested, or ``_InvalidError`` if the seal does not match."""
    found = _SEALED_TAIL.search(data)
    if found is None:
        raise _InvalidError("invalid-manifest", "the manifest does not end with its digest")
    body = data[: found.start()] + b"}"
    if hashlib.sha256(body).hexdigest().encode("ascii") != found.group(1):
        raise _InvalidError("manifest-digest-mismatch", "the manifest differs from its digest")
    return body


def valid_segment_name(name: object) -> bool:
    """True for ``checkpoint.json.seg.`` followed by 32 lowercase hex characters."""
    return isinstance(name, str) and _SEGMENT_NAME.fullmatch(name) is not None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ref(ref: object, *, level: bool) -> dict[str, Any]:
    members = {"name", "bytes", "sha256", *(("level",) if level else ())}
    if level and isinstance(ref, dict) and "journal" in ref:
        members.add("journal")  # a journal published as a segment (decision 395)
    if not isinstance(ref, dict) or set(ref) != members:
        raise _InvalidError(
            "invalid-manifest", f"a segment reference is not exactly {sorted(members)}"
        )
    if not valid_segment_name(ref["name"]):
        raise _InvalidError("invalid-manifest", "a segment name is not seg.<32 hex>")
    if not _is_int(ref["bytes"]) or ref["bytes"] < 0:
        raise _InvalidError("invalid-manifest", "a segment length is not a count")
    if not isinstance(ref["sha256"], str) or not _SHA256.fullmatch(ref["sha256"]):
        raise _InvalidError("invalid-manifest", "a segment digest is not 64 hex")
    if level and (not _is_int(ref["level"]) or not 0 <= ref["level"] <= 64):
        raise _InvalidError("invalid-manifest", "a segment level is not 0..64")
    if "journal" in members and (ref["level"] != 0 or not valid_generation(ref["journal"])):
        raise _InvalidError(
            "invalid-manifest", "a journal segment is not level 0 with its records' generation"
        )
    return ref


def _check_manifest(parsed: Parsed) -> dict[str, Any]:
    if parsed.duplicates:
        raise _InvalidError("duplicate-member")
    if parsed.non_finite:
        raise _InvalidError("non-finite-number")
    doc = parsed.value
    if not isinstance(doc, dict) or doc.get("version") != 4 or not _is_int(doc["version"]):
        raise _InvalidError("unsupported-version")
    if set(doc) - _MANIFEST_ALLOWED:
        raise _InvalidError(
            "invalid-manifest", f"unknown members {sorted(set(doc) - _MANIFEST_ALLOWED)}"
        )
    if _MANIFEST_REQUIRED - set(doc):
        raise _InvalidError("invalid-manifest", f"missing {sorted(_MANIFEST_REQUIRED - set(doc))}")
    if not valid_generation(doc["generation"]):
        raise _InvalidError("invalid-generation")
    if doc["journal_seq"] != 0 or not _is_int(doc["journal_seq"]):
        raise _InvalidError("invalid-base", "journal_seq is not 0")
    if not isinstance(doc["flow_context"], dict):
        raise _InvalidError("invalid-base", "member 'flow_context' missing or mistyped")
    _check_ref(doc["meta"], level=False)
    if not isinstance(doc["segments"], list):
        raise _InvalidError("invalid-manifest", "segments is not a list")
    names = {doc["meta"]["name"]}
    for ref in doc["segments"]:
        _check_ref(ref, level=True)
        if ref["name"] in names:
            raise _InvalidError("invalid-manifest", "a segment is named twice")
        names.add(ref["name"])
    return doc


def segment_names(manifest: Mapping[str, Any]) -> list[str]:
    """Every segment a (checked) manifest names, the meta segment first."""
    return [manifest["meta"]["name"], *(ref["name"] for ref in manifest["segments"])]


def _named_bytes(ref: Mapping[str, Any], data: bytes | None) -> bytes:
    """``data`` if it is exactly the length and SHA-256 ``ref`` names."""
    name = ref["name"]
    if data is None:
        raise _InvalidError("missing-segment", f"{name!r} is named by the manifest but absent")
    if len(data) != ref["bytes"] or hashlib.sha256(data).hexdigest() != ref["sha256"]:
        raise _InvalidError(
            "segment-digest-mismatch", f"{name!r} differs from the length and digest named"
        )
    return data


def _journal_entries(ref: Mapping[str, Any], data: bytes | None) -> list[dict[str, Any]]:
    """The op and spawn records, in order, of a journal published as a segment.

    Every line must be a complete record of the generation ``ref`` names, numbered from 1
    (a writer publishes only what it wrote and fsync'd whole). Intents and steps are
    skipped: the manifest restates what was open when it was published.
    """
    name = ref["name"]
    data = _named_bytes(ref, data)
    if data and not data.endswith(b"\n"):
        raise _InvalidError("invalid-segment", f"{name!r} ends inside a record")
    records: list[dict[str, Any]] = []
    for seq, raw in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            rec = check_record(raw, 4)
        except _InvalidError as bad:
            bad.detail = f"{name!r} record {seq}: {bad.reason}" + (
                f" ({bad.detail})" if bad.detail else ""
            )
            bad.reason = "invalid-segment"
            raise
        if rec["generation"] != ref["journal"] or rec["seq"] != seq:
            raise _InvalidError(
                "segment-identity", f"{name!r} record {seq} is not record {seq} of its journal"
            )
        if rec["kind"] in ("op", "spawn"):
            records.append(rec)
    return records


def _segment(ref: Mapping[str, Any], data: bytes | None) -> dict[str, Any]:
    """Check one segment's bytes against its reference and decode it."""
    name = ref["name"]
    data = _named_bytes(ref, data)
    try:
        parsed = parse_json(data)
    except ValueError:
        raise _InvalidError("malformed-json", f"{name!r} is not JSON") from None
    if parsed.duplicates:
        raise _InvalidError("duplicate-member", f"{name!r} repeats a member name")
    if parsed.non_finite:
        raise _InvalidError("non-finite-number", f"{name!r} holds NaN or an infinity")
    doc = parsed.value
    if not isinstance(doc, dict) or doc.get("version") != 4 or not _is_int(doc["version"]):
        raise _InvalidError("invalid-segment", f"{name!r} is not a version 4 segment")
    if doc.get("segment") != name[len(SEGMENT_PREFIX) :]:
        raise _InvalidError("segment-identity", f"{name!r} holds another segment")
    return doc


#: A segment's bytes by name (None: absent), read when the fold reaches it.
_Read = Callable[[str], "bytes | None"]


def _fold_segments(manifest: dict[str, Any], read: _Read) -> dict[str, Any]:
    """The D4 base the manifest's segments make, in the version 3 base shape.

    Each segment is read, checked and folded before the next is read: only one
    segment's bytes are held at a time (a 100,000-node unit's segments are ~450 MB).
    """
    meta = _segment(manifest["meta"], read(manifest["meta"]["name"]))
    if not _META_REQUIRED <= set(meta) <= _META_REQUIRED | {"max_spawn"}:
        raise _InvalidError(
            "invalid-segment", f"{manifest['meta']['name']!r}: its members are not D4's"
        )
    base: dict[str, Any] = {
        "version": 4,
        "generation": manifest["generation"],
        "journal_seq": 0,
    }
    for name in ("session_id", "prompt", "plan"):
        base[name] = meta[name]
    base["flow_context"] = manifest["flow_context"]
    ops: dict[str, Any] = {}
    spawned: list[Any] = []
    index: dict[str, int] = {}

    def upsert_spawned(node_id: str, entry: Any) -> None:
        # In place: a spawned entry keeps the position of its first record.
        at = index.get(node_id)
        if at is None:
            index[node_id] = len(spawned)
            spawned.append(entry)
        else:
            spawned[at] = entry

    for ref in manifest["segments"]:
        if "journal" in ref:
            # Records upsert in order, as the journal they were (an entry may repeat).
            for rec in _journal_entries(ref, read(ref["name"])):
                entry = rec["entry"]
                if rec["kind"] == "op":
                    ops[entry["agent_id"]] = entry
                else:
                    upsert_spawned(entry["node_id"], entry)
            continue
        doc = _segment(ref, read(ref["name"]))
        if set(doc) != _ENTRIES_MEMBERS:
            raise _InvalidError(
                "invalid-segment", f"{ref['name']!r} is not exactly {sorted(_ENTRIES_MEMBERS)}"
            )
        if not isinstance(doc["ops"], dict) or not isinstance(doc["spawned"], list):
            raise _InvalidError("invalid-segment", f"{ref['name']!r}: ops or spawned mistyped")
        # Upserts in manifest order: a later segment's entry replaces an earlier one in
        # place, as a journal record does (the checks of each entry follow, folded).
        ops.update(doc["ops"])
        seen: set[str] = set()
        for entry in doc["spawned"]:
            node_id = entry.get("node_id") if isinstance(entry, dict) else None
            if not isinstance(node_id, str):
                raise _InvalidError(
                    "invalid-entry", f"{ref['name']!r}: a spawned entry without node_id"
                )
            if node_id in seen:
                raise _InvalidError("invalid-segment", f"{ref['name']!r}: a node_id repeats")
            seen.add(node_id)
            upsert_spawned(node_id, entry)
    base["ops"] = ops
    base["spawned"] = spawned
    for name in ("in_flight", "steps"):
        if name in manifest:
            base[name] = manifest[name]
    base["config"] = meta["config"]
    if "max_spawn" in meta:
        base["max_spawn"] = meta["max_spawn"]
    return base


def fold_v4(
    manifest_bytes: bytes,
    segments: Mapping[str, bytes | None],
    journal: bytes,
    report: Report,
) -> dict[str, Any]:
    """Fold a manifest, its segments' bytes (by name; None: absent) and its journal."""
    manifest = parse_manifest(manifest_bytes, report)
    try:
        base = check_folded_base(_fold_segments(manifest, segments.get))
    except _InvalidError as bad:
        raise _refusal(bad, manifest, report) from None
    return fold_journal(base, journal, report, version=4)


def _refusal(bad: _InvalidError, manifest: Mapping[str, Any], report: Report) -> Exception:
    # A segment's own refusal names it; an entry's names the logical file (decision 387).
    where = _file_at_fault(bad, manifest) or CHECKPOINT_FILENAME
    return report.refuse(bad.reason, detail=bad.detail, file=where, entry=bad.entry)


def _file_at_fault(bad: _InvalidError, manifest: Mapping[str, Any]) -> str | None:
    """The segment a refusal's detail names, if any (reports name files, not paths)."""
    for name in segment_names(manifest):
        if repr(name) in bad.detail:
            return name
    return None


def parse_manifest(data: bytes, report: Report) -> dict[str, Any]:
    """Check a manifest's seal, decode and check it (refusals name ``checkpoint.json``)."""
    try:
        parsed = parse_json(data)  # JSON first: a text that is not JSON says so
        if isinstance(parsed.value, dict) and parsed.value.get("version") != 4:
            raise _InvalidError("unsupported-version")
        body = _unseal(data)
        return _check_manifest(parse_json(body))
    except ValueError:
        raise report.refuse("malformed-json", file=CHECKPOINT_FILENAME) from None
    except _InvalidError as bad:  # the manifest's own checks: no entry to name
        raise report.refuse(bad.reason, detail=bad.detail, file=CHECKPOINT_FILENAME) from None


def _still_named(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (no new publication)."""
    st_pin = os.fstat(fd)
    try:
        st_now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (st_pin.st_dev, st_pin.st_ino) == (st_now.st_dev, st_now.st_ino)


def _read_segment(dirname: str, pins: list[int], report: Report, name: str) -> bytes | None:
    """One segment's bytes (None: absent), its descriptor kept open in ``pins``."""
    try:
        got = read_pinned(os.path.join(dirname, name))
    except OSError as exc:
        raise report.refuse("unreadable-segment", detail=exc.strerror, file=name) from exc
    if got is None:
        return None
    pins.append(got[1])
    return got[0]


def _coherent_load(path: str, report: Report) -> dict[str, Any]:
    """Fold the manifest, its segments and the journal, all of one publication."""
    dirname = os.path.dirname(path)
    journal_path = os.path.join(dirname, JOURNAL_FILENAME)
    missing_journal = False
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(0.002 * attempt)
        try:
            first = read_pinned(path)
        except OSError as exc:
            raise report.refuse(
                "unreadable-checkpoint", detail=exc.strerror, file=CHECKPOINT_FILENAME
            ) from exc
        if first is None:
            continue
        manifest_bytes, manifest_fd = first
        pins: list[int] = []
        read = functools.partial(_read_segment, dirname, pins, report)
        try:
            manifest = parse_manifest(manifest_bytes, report)
            try:
                base = check_folded_base(_fold_segments(manifest, read))
            except _InvalidError as bad:
                if not _still_named(path, manifest_fd):
                    continue  # a compaction published (and unlinked) meanwhile: read again
                raise _refusal(bad, manifest, report) from None
            try:
                journal = read_pinned(journal_path)
            except OSError as exc:
                raise report.refuse(
                    "unreadable-journal", detail=exc.strerror, file=JOURNAL_FILENAME
                ) from exc
            if journal is not None:
                pins.append(journal[1])
            if not _still_named(path, manifest_fd):
                continue  # a compaction published a new manifest meanwhile: read again
            if journal is None:
                missing_journal = True
                continue
            return fold_journal(base, journal[0], report, version=4)
        finally:
            os.close(manifest_fd)
            for fd in pins:
                os.close(fd)
    if missing_journal:
        raise report.refuse("missing-journal", file=JOURNAL_FILENAME)
    raise report.refuse("incoherent-read")


def load_v4(path: str, report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a version 4 unit whose manifest is at ``path`` (see :func:`._load_v3.load_v3`)."""
    report.checkpoint_version = 4
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(0.002 * attempt)
        state = _coherent_load(path, report)
        if not report.stale_generation_records:
            break
    return state, report.as_dict()
