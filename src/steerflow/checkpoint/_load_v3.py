"""The version 3 reader: a base snapshot folded with the valid prefix of its journal.

Coherent view
    The base is read through a pinned descriptor, then the journal, then the base name
    is checked to still hold the pinned object.  If a compaction replaced the base in
    between, the pair is read again (bounded); a journal from another publication is
    never combined with the wrong base.  Holding the pin keeps the inode number from
    being recycled while the comparison is made.

Journal rules
    Lines end in LF.  A final segment without LF is a torn append: it is left out and
    its size reported.  Every complete line must be a valid record: exact members,
    no duplicate names at any depth, finite numbers, the 32-hex generation, an
    integer ``seq`` in 1..2**63-1, a known ``kind``, a well-formed entry and patch.
    Records of another generation are counted and skipped; records of the base's
    generation must run 1, 2, 3, ... without gaps or repeats.  Anything else refuses
    the whole checkpoint, and the report names the first bad line and the last good
    sequence number.

Naming the entry
    A refusal names the file at fault and, when it lies in one entry, that entry's ids
    (planned ``agent_id``; spawned ``node_id`` and ``spawn_id``), read from whatever
    of the entry was readable.  A journal refusal also gives the record's ``seq`` when
    it could be read unambiguously, even if the record is otherwise invalid.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from . import _entries as entries
from ._entries import EntryKind, entry_ref
from ._intents import IntentError, check_intent, closed_by
from ._patch import PatchError, apply_patch, validate_patch
from ._read import (
    CHECKPOINT_FILENAME,
    JOURNAL_FILENAME,
    SNAPSHOT_TYPES,
    Parsed,
    parse_json,
    read_pinned,
)
from ._report import Report
from ._steps import StepError, StepLog, check_step

__all__ = [
    "MAX_SEQ",
    "check_folded_base",
    "entry_ref",
    "fold_journal",
    "fold_unit",
    "load_v3",
    "valid_generation",
]

MAX_SEQ = 2**63 - 1
_GENERATION = re.compile(r"[0-9a-f]{32}")
_RECORD_REQUIRED = frozenset({"version", "generation", "seq", "kind", "entry"})
_RECORD_ALLOWED = _RECORD_REQUIRED | {"flow_context"}
_ATTEMPTS = 5


class _InvalidError(Exception):
    """A validation failure: ``reason`` is the refusal code.

    ``entry`` (the ids of the entry at fault) and ``seq`` (the record's readable
    sequence number) are filled in by whoever knows them.
    """

    def __init__(self, reason: str, detail: str = "", entry: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.entry = entry
        self.seq: int | None = None


def valid_generation(value: object) -> bool:
    """True for 32 lowercase hexadecimal characters."""
    return isinstance(value, str) and _GENERATION.fullmatch(value) is not None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_entry(kind: EntryKind, entry: object) -> None:
    """:func:`._entries.check_entry`, raising ``_InvalidError("invalid-entry")``."""
    try:
        entries.check_entry(kind, entry)
    except entries.EntryError as bad:
        raise _InvalidError("invalid-entry", bad.detail) from None


def _intent_ref(entry: object) -> dict[str, Any] | None:
    """How a refusal names a call intent: its node and call id, where readable."""
    fields = entry if isinstance(entry, dict) else {}
    node, call_id = fields.get("node"), fields.get("call_id")
    ref = entry_ref("op", {}, node)
    if ref is None:
        return None
    ref = {"kind": "intent", "node": ref["agent_id"]}
    if isinstance(call_id, str) and re.fullmatch(r"[0-9a-f]{32}", call_id):
        ref["call_id"] = call_id
    return ref


def _step_ref(entry: object) -> dict[str, Any] | None:
    """How a refusal names a step: its node and index, where readable."""
    if not isinstance(entry, dict):
        return None
    ref: dict[str, Any] = {"kind": "step"}
    for name in ("node", "index"):
        value = entry.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            ref[name] = value
    return ref


def _ref(kind: object, entry: object) -> dict[str, Any] | None:
    if kind == "step":
        return _step_ref(entry)
    return _intent_ref(entry) if kind == "intent" else entry_ref(kind, entry)


def _check_step(entry: object) -> None:
    try:
        check_step(entry)
    except StepError as bad:
        raise _InvalidError("invalid-step", bad.detail, entry=_step_ref(entry)) from None


def _fold_steps(entries: object) -> StepLog:
    """A base's ``steps``: a non-empty list of valid steps in a valid order."""
    if not isinstance(entries, list) or not entries:
        raise _InvalidError("invalid-base", "steps is not a non-empty list")
    log = StepLog()
    for entry in entries:
        _check_step(entry)
        try:
            log.add(entry)
        except StepError as bad:
            raise _InvalidError("invalid-step", bad.detail, entry=_step_ref(entry)) from None
    return log


def _check_intent(entry: object) -> None:
    try:
        check_intent(entry)
    except IntentError as bad:
        raise _InvalidError("invalid-intent", bad.detail, entry=_intent_ref(entry)) from None


def _check_base(parsed: Parsed) -> dict[str, Any]:
    if parsed.duplicates:
        raise _InvalidError("duplicate-member")
    if parsed.non_finite:
        raise _InvalidError("non-finite-number")
    doc = parsed.value
    if not isinstance(doc, dict) or doc.get("version") != 3 or not _is_int(doc["version"]):
        raise _InvalidError("unsupported-version")
    if not valid_generation(doc.get("generation")):
        raise _InvalidError("invalid-generation")
    if doc.get("journal_seq") != 0 or not _is_int(doc["journal_seq"]):
        raise _InvalidError("invalid-base", "journal_seq is not 0")
    for name, kind in SNAPSHOT_TYPES:
        if not isinstance(doc.get(name), kind):
            raise _InvalidError("invalid-base", f"member {name!r} missing or mistyped")
    if doc.get("max_spawn") is not None and not _is_int(doc["max_spawn"]):
        raise _InvalidError("invalid-base", "max_spawn mistyped")
    for key, entry in doc["ops"].items():
        try:
            check_entry("op", entry)
            if entry["agent_id"] != key:
                raise _InvalidError("invalid-base", "an ops key differs from its agent_id")
        except _InvalidError as bad:
            bad.entry = entry_ref("op", {}, key)  # the key is what the base is indexed by
            raise
    seen: set[str] = set()
    for index, entry in enumerate(doc["spawned"]):
        try:
            check_entry("spawn", entry)
            if entry["node_id"] in seen:
                raise _InvalidError("invalid-base", "a spawned node_id repeats")
        except _InvalidError as bad:
            bad.entry = entry_ref("spawn", entry) or {"kind": "spawn", "index": index}
            raise
        seen.add(entry["node_id"])
    if "in_flight" in doc:
        flying = doc["in_flight"]
        if not isinstance(flying, list) or not flying:
            raise _InvalidError("invalid-base", "in_flight is not a non-empty list")
        calls: set[str] = set()
        for intent in flying:
            _check_intent(intent)
            if intent["call_id"] in calls:
                raise _InvalidError(
                    "invalid-base", "an in_flight call_id repeats", entry=_intent_ref(intent)
                )
            calls.add(intent["call_id"])
    if "steps" in doc:
        _fold_steps(doc["steps"])
    return doc


def check_record(raw: bytes, version: int = 3) -> dict[str, Any]:
    """Decode and validate one complete journal line (without its LF).

    ``version`` is the unit's: a version 4 journal's records say 4 (decision 340).
    A refusal carries whatever ids and ``seq`` of the record could be read.
    """
    try:
        parsed = parse_json(raw)
    except ValueError:
        raise _InvalidError("malformed-record") from None
    try:
        return _check_parsed_record(parsed, version)
    except _InvalidError as bad:
        rec = parsed.value
        if isinstance(rec, dict):
            seq = rec.get("seq")
            if (
                isinstance(seq, int)
                and not isinstance(seq, bool)
                and "seq" not in parsed.top_duplicates
                and 1 <= seq <= MAX_SEQ
            ):
                bad.seq = seq
            if bad.entry is None:
                bad.entry = _ref(rec.get("kind"), rec.get("entry"))
        raise


def _check_parsed_record(parsed: Parsed, version: int) -> dict[str, Any]:
    if parsed.duplicates:
        raise _InvalidError("duplicate-member")
    if parsed.non_finite:
        raise _InvalidError("non-finite-number")
    rec = parsed.value
    if not isinstance(rec, dict):
        raise _InvalidError("malformed-record", "not an object")
    if set(rec) - _RECORD_ALLOWED:
        raise _InvalidError("unknown-member")
    if _RECORD_REQUIRED - set(rec):
        raise _InvalidError("missing-member")
    if rec["version"] != version or not _is_int(rec["version"]):
        raise _InvalidError("unsupported-record-version")
    if not valid_generation(rec["generation"]):
        raise _InvalidError("invalid-generation")
    seq = rec["seq"]
    if not _is_int(seq) or not 1 <= seq <= MAX_SEQ:
        raise _InvalidError("invalid-seq")
    if rec["kind"] == "intent":
        if "flow_context" in rec:
            raise _InvalidError("invalid-intent", "an intent record carries flow_context")
        _check_intent(rec["entry"])
        return rec
    if rec["kind"] == "step":
        if "flow_context" in rec:
            raise _InvalidError("invalid-step", "a step record carries flow_context")
        _check_step(rec["entry"])
        return rec
    if rec["kind"] not in ("op", "spawn"):
        raise _InvalidError("unknown-kind")
    check_entry(rec["kind"], rec["entry"])
    if "flow_context" in rec:
        ctx = rec["flow_context"]
        if not isinstance(ctx, dict) or set(ctx) != {"patch"}:
            raise _InvalidError("invalid-patch", "flow_context must be exactly {patch}")
        try:
            validate_patch(ctx["patch"])
        except PatchError as exc:
            raise _InvalidError("invalid-patch", str(exc)) from None
    return rec


class _Fold:
    """The base being advanced by journal records, one validated record at a time."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.ops: dict[str, Any] = dict(base["ops"])
        self.spawned: list[Any] = list(base["spawned"])
        self.index = {entry["node_id"]: i for i, entry in enumerate(self.spawned)}
        self.context: Any = base["flow_context"]
        self.intents: dict[str, Any] = {i["call_id"]: i for i in base.get("in_flight", ())}
        self.closed: set[str] = set()  # call ids an outcome closed in this journal
        self.steps = StepLog.of(base.get("steps", ()))  # _check_base checked them

    def apply(self, rec: dict[str, Any]) -> None:
        if rec["kind"] == "step":
            self._apply_step(rec["entry"])
            return
        if rec["kind"] == "intent":
            intent = rec["entry"]
            call_id = intent["call_id"]
            known = self.intents.get(call_id)
            # The same intent again is a writer's retry after a reconciliation adopted
            # the first copy (its acknowledgement was uncertain): one call, no change.
            if known is not None and known != intent:
                raise _InvalidError("invalid-intent", "a call_id is recorded twice, differently")
            if call_id in self.closed:
                raise _InvalidError("invalid-intent", "a call its outcome closed is recorded again")
            self.intents[call_id] = intent
            return
        context = self.context
        if "flow_context" in rec:
            try:
                context = apply_patch(context, rec["flow_context"]["patch"])
            except PatchError as exc:
                raise _InvalidError("invalid-transition", str(exc)) from None
        # Everything is validated; only now does the record become visible.
        entry = rec["entry"]
        closes = closed_by(rec["kind"], entry) if self.intents else None
        if closes is not None:
            kept = {
                call_id: intent
                for call_id, intent in self.intents.items()
                if (intent["record"], intent["key"]) != closes
            }
            self.closed.update(set(self.intents) - set(kept))
            self.intents = kept
        if rec["kind"] == "op":
            self.ops[entry["agent_id"]] = entry
        elif entry["node_id"] in self.index:
            self.spawned[self.index[entry["node_id"]]] = entry
        else:
            self.index[entry["node_id"]] = len(self.spawned)
            self.spawned.append(entry)
        self.context = context

    def _apply_step(self, step: dict[str, Any]) -> None:
        try:
            self.steps.add(step)
        except StepError as bad:
            raise _InvalidError("invalid-step", bad.detail, entry=_step_ref(step)) from None
        if step["type"] == "model" and self.intents.pop(step["call_id"], None) is not None:
            self.closed.add(step["call_id"])

    def state(self) -> dict[str, Any]:
        base = self.base
        out: dict[str, Any] = {"version": base["version"], "generation": base["generation"]}
        for name in ("session_id", "prompt", "plan"):
            out[name] = base[name]
        out["flow_context"] = self.context
        out["ops"] = self.ops
        out["spawned"] = self.spawned
        if self.intents:
            out["in_flight"] = list(self.intents.values())
        if self.steps:
            out["steps"] = self.steps.entries()
        out["config"] = base["config"]
        if base.get("max_spawn") is not None:
            out["max_spawn"] = base["max_spawn"]
        return out


def _coherent_read(path: str, report: Report) -> tuple[bytes, bytes]:
    """Read (base, journal) such that the journal belongs to that base publication."""
    journal_path = os.path.join(os.path.dirname(path), JOURNAL_FILENAME)
    missing_journal = False
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(0.002 * attempt)
        try:
            base = read_pinned(path)
        except OSError as exc:
            raise report.refuse(
                "unreadable-checkpoint", detail=exc.strerror, file=CHECKPOINT_FILENAME
            ) from exc
        if base is None:
            continue
        base_bytes, base_fd = base
        journal_fd = None
        try:
            try:
                journal = read_pinned(journal_path)
            except OSError as exc:
                raise report.refuse(
                    "unreadable-journal", detail=exc.strerror, file=JOURNAL_FILENAME
                ) from exc
            if journal is not None:
                journal_fd = journal[1]
            st_pin = os.fstat(base_fd)
            try:
                st_now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (st_pin.st_dev, st_pin.st_ino) != (st_now.st_dev, st_now.st_ino):
                continue  # a compaction published a new base meanwhile: read again
            if journal is None:
                missing_journal = True
                continue
            return base_bytes, journal[0]
        finally:
            os.close(base_fd)
            if journal_fd is not None:
                os.close(journal_fd)
    if missing_journal:
        raise report.refuse("missing-journal", file=JOURNAL_FILENAME)
    raise report.refuse("incoherent-read")


def load_v3(path: str, report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a version 3 unit whose base is at ``path``.

    Stale-generation records are what a reader sees between a compaction's base
    publication and its journal reset, so a read that finds them is repeated a few
    times before they are reported.
    """
    report.checkpoint_version = 3
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(0.002 * attempt)
        base_bytes, journal = _coherent_read(path, report)
        state = fold_unit(base_bytes, journal, report)
        if not report.stale_generation_records:
            break
    return state, report.as_dict()


def fold_unit(base_bytes: bytes, journal: bytes, report: Report) -> dict[str, Any]:
    """Fold one base with its journal bytes (raise ``CheckpointRecoveryError`` on refusal)."""
    try:
        base = _check_base(parse_json(base_bytes))
    except ValueError:
        raise report.refuse("malformed-json", file=CHECKPOINT_FILENAME) from None
    except _InvalidError as bad:
        raise report.refuse(
            bad.reason, detail=bad.detail, file=CHECKPOINT_FILENAME, entry=bad.entry
        ) from None
    return fold_journal(base, journal, report)


def check_folded_base(doc: dict[str, Any]) -> dict[str, Any]:
    """:func:`_check_base` for a base a version 4 unit folded from its segments.

    Raises ``_InvalidError`` (the v4 loader names the file at fault itself).
    """
    parsed = Parsed({**doc, "version": 3})
    checked = _check_base(parsed)
    checked["version"] = doc["version"]
    return checked


def fold_journal(
    base: dict[str, Any], journal: bytes, report: Report, version: int = 3
) -> dict[str, Any]:
    """Fold a validated base with its journal bytes (records of ``version``)."""
    generation: str = base["generation"]
    report.generation = generation
    report.records_applied = 0
    report.last_seq = 0
    report.valid_prefix_seq = 0
    report.stale_generation_records = 0
    report.discarded_tail_bytes = 0
    fold = _Fold(base)
    offset = 0
    line_no = 0
    while True:
        end = journal.find(b"\n", offset)
        if end < 0:
            break
        line_no += 1
        seq: int | None = None
        rec: dict[str, Any] | None = None
        try:
            rec = check_record(journal[offset:end], version)
            seq = rec["seq"]
            if rec["generation"] != generation:
                report.stale_generation_records += 1
            else:
                expected = report.last_seq + 1
                if seq != expected:
                    reason = "duplicate-seq" if seq < expected else "sequence-gap"
                    raise _InvalidError(reason)
                fold.apply(rec)
                report.records_applied += 1
                report.last_seq = report.valid_prefix_seq = expected
        except _InvalidError as bad:
            if bad.entry is None and rec is not None:
                bad.entry = _ref(rec["kind"], rec["entry"])
            raise report.refuse(
                bad.reason,
                seq=seq if seq is not None else bad.seq,
                line=line_no,
                byte_offset=offset,
                detail=bad.detail,
                file=JOURNAL_FILENAME,
                entry=bad.entry,
            ) from None
        offset = end + 1
    report.discarded_tail_bytes = len(journal) - offset
    return fold.state()
