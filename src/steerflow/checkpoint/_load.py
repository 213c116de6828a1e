"""``load_checkpoint``: read a checkpoint unit and dispatch on its declared version.

The version is decided before anything else is interpreted: a missing, non-integer,
unknown or duplicated top-level ``version`` member is refused.  Version 2 is read as
one snapshot file (:mod:`._load_v2`), and refused when a journal lies beside it;
version 3 through the base + journal loader (:mod:`._load_v3`); version 4 through the
manifest + segments + journal loader (:mod:`._load_v4`, decision 340).  There is no fallback
from one reader to the other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from ._entries import CheckpointState, EntryError, entry_ref, typed_state, unguarded_splice
from ._load_v2 import load_v2
from ._load_v3 import load_v3
from ._load_v4 import load_v4
from ._read import CHECKPOINT_FILENAME, JOURNAL_FILENAME, Parsed, parse_json, read_pinned
from ._report import Report

__all__ = [
    "CHECKPOINT_FILENAME",
    "JOURNAL_FILENAME",
    "LoadedCheckpoint",
    "load_checkpoint",
    "load_state",
]


class LoadedCheckpoint(NamedTuple):
    """What :func:`load_state` returns: the typed state and the recovery report."""

    state: CheckpointState
    report: dict[str, Any]


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a checkpoint; return ``(state, checkpoint_recovery report)``.

    Args:
        path: the ``checkpoint.json`` path, or the run directory holding it.

    Returns:
        ``state`` in the D4 shape (for version 3: the base folded with the valid
        journal prefix, carrying ``version: 3`` and its ``generation``), and the
        recovery report of CONTRACT §8.  A version 2 snapshot is read leniently (see
        :func:`load_state`); :func:`load_state` gives the same state typed.

    Raises:
        CheckpointRecoveryError: the checkpoint is missing, unreadable, of an unknown
            or ambiguous version, or fails validation; ``.report`` says where.
    """
    state, report = load_state(path, v2_lenient=True)
    return state.as_dict(), report


def load_state(path: str | os.PathLike[str], *, v2_lenient: bool = False) -> LoadedCheckpoint:
    """Load a checkpoint into typed entries; return it with its recovery report.

    Every entry of either version passes one validator (:mod:`._entries`).  With
    ``v2_lenient``, a version 2 snapshot keeps its historical leniency: entries the
    validator refuses are set aside in ``state.rejected`` instead of refusing the
    checkpoint (a resume refuses them itself).  Version 3 is always strict.

    Raises:
        CheckpointRecoveryError: as :func:`load_checkpoint`; and, unless ``v2_lenient``,
            a version 2 entry that fails the validator (``invalid-entry``).
    """
    target = Path(path)
    # os.path.isdir, not Path.is_dir: a path we may not search is reported by the read
    # below as unreadable (``unreadable-checkpoint``), not raised as a bare OSError.
    if os.path.isdir(target):
        target = target / CHECKPOINT_FILENAME
    report = Report(default_file=target.name)
    doc, report_dict = _load_doc(target, report)
    unguarded = unguarded_splice(doc.get("plan"), doc.get("spawned"))
    if unguarded is not None:  # version 2 refused it already; a version 3 base + journal here
        raise report.refuse(
            "unguarded-splice",
            detail="an escalation retry's splice witness (escalated_from) without the "
            "planned node ids (plan[].node_id) it refers to",
            entry=entry_ref("spawn", unguarded),
        )
    try:
        state = typed_state(doc, lenient=v2_lenient and report.checkpoint_version == 2)
    except EntryError as bad:
        raise report.refuse("invalid-entry", detail=bad.detail, entry=bad.ref) from None
    return LoadedCheckpoint(state, report_dict)


def _load_doc(target: Path, report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        first = read_pinned(os.fspath(target))
    except OSError as exc:
        raise report.refuse("unreadable-checkpoint", detail=exc.strerror) from exc
    if first is None:
        raise report.refuse("missing-checkpoint")
    data, pin = first
    try:
        try:
            parsed = parse_json(data)
        except ValueError as exc:
            raise report.refuse("malformed-json", detail=type(exc).__name__) from None
        version = _declared_version(parsed, report)
        report.checkpoint_version = version
        if version == 2:
            _refuse_journal_beside_v2(target, report)
            return load_v2(parsed, report)
    finally:
        os.close(pin)
    if version == 4:
        return load_v4(os.fspath(target), report)
    return load_v3(os.fspath(target), report)


def _refuse_journal_beside_v2(target: Path, report: Report) -> None:
    """A journal beside a version 2 snapshot: refuse rather than ignore it.

    No version 2 writer makes a journal, so one here belongs to some version 3 unit
    (a snapshot copied over its base, a half-restored backup).  Outcomes that exist
    only in it would silently run again if the snapshot were read alone.
    """
    journal = target.parent / JOURNAL_FILENAME
    try:
        os.lstat(journal)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise report.refuse(
            "unreadable-journal", detail=f"{str(journal)!r}: {exc.strerror}", file=JOURNAL_FILENAME
        ) from exc
    raise report.refuse(
        "unexpected-journal",
        detail=f"the journal {str(journal)!r} lies beside a version 2 checkpoint, which has "
        "none; move it away or restore the version 3 base it belongs to",
        file=JOURNAL_FILENAME,
    )


def _declared_version(parsed: Parsed, report: Report) -> int:
    doc = parsed.value
    if not isinstance(doc, dict):
        raise report.refuse("not-an-object")
    if "version" in parsed.top_duplicates:
        raise report.refuse("ambiguous-version")
    if "version" not in doc:
        raise report.refuse("missing-version")
    version = doc["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version not in (2, 3, 4):
        raise report.refuse("unsupported-version")
    return version
