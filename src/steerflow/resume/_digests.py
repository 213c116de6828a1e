"""The settle check of a checkpoint's entries: each still matches its ``result_digest``."""

from __future__ import annotations

from steerflow.checkpoint import CheckpointState, PlannedEntry, SpawnedEntry, entry_digest
from steerflow.errors import FlowResumeError

__all__ = ["check_digests"]


def check_digests(state: CheckpointState) -> None:
    """The Amendment 1 settle check of every entry, before any rule reads one.

    A digest covers what an entry *is* as well as its response (an escalation retry's
    ``escalated_from`` and attempt, say), so an altered entry is named here, as itself,
    rather than by whatever rule its altered members would break later (decision 111).
    """
    for key, entry in state.ops.items():
        _check_digest(f"node {key!r}", entry)
    for spawned in state.spawned:
        _check_digest(spawned.name, spawned)


def _check_digest(where: str, entry: PlannedEntry | SpawnedEntry) -> None:
    """The stored entry still matches its digest."""
    if entry.result_digest is None:
        return  # older checkpoints carry no digest: nothing independent to check
    try:
        actual = entry_digest(dict(entry.raw))
    except ValueError as exc:  # e.g. NaN read from a hand-edited v2 file
        raise FlowResumeError(
            f"{where}: the stored response cannot be encoded canonically ({exc}), so it cannot "
            "be checked against its result_digest"
        ) from None
    if entry.result_digest != actual:
        raise FlowResumeError(
            f"{where}: the stored response does not match its result_digest (the response, "
            "or a member that decides what the entry is, was changed after it was recorded), "
            "so replaying it would not be faithful"
        )
