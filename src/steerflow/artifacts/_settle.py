"""Settling recorded artifacts (Amendment 1 rows 2, 7, 9): is what a node produced still there?

A completed node whose checkpoint entry records ``artifacts`` is worth what it produced
only while those files are still there, byte for byte. Settling a checkpoint:

1. reads the contract the run that wrote the checkpoint persisted in the state DB (its
   session's ``artifact_contract_json``) and the checkpoint's own copy
   (:func:`~steerflow.artifacts.checkpoint_contract`); they must be equal. Nothing is
   re-derived from roles as they are today, so removing a role's ``artifacts`` between
   runs does not weaken the check;
2. checks every completed entry against it: a leg that recorded artifacts needs a
   contract declaring exactly those paths, and a leg the contract declares files for
   needs a record of them (an absent record is not evidence);
3. looks for each recorded file under the contract's root (the original run's, also
   with ``--save``) at ``<root>/<leg key>/<path>``, never following a symlink, and
   compares size and streamed BLAKE2b digest, so a rewrite that keeps size and mtime
   is caught.

Steps 1 and 2 refuse (:class:`~steerflow.errors.ArtifactContractError`); step 3 returns
:class:`Unsettled` records for the caller to refuse or re-run. Everything here blocks
(it reads whole files): call it off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from steerflow.artifacts._contract import (
    ArtifactContract,
    ContractError,
    checkpoint_contract,
    contract_difference,
)
from steerflow.artifacts._hash import (
    ArtifactProblem,
    ArtifactRecord,
    inspect_artifact,
    records_from_json,
)
from steerflow.checkpoint import CheckpointState
from steerflow.errors import ArtifactContractError
from steerflow.state import NodeKind, StateDB, db_exists

__all__ = [
    "RecordedLeg",
    "Settlement",
    "Unsettled",
    "UnsettledReason",
    "recorded_legs",
    "settle",
    "settle_legs",
    "source_contract",
]

#: ``missing``: nothing at the path; ``not_regular``: a symlink (at the path or on the way),
#: a directory, FIFO or device; ``unreadable``: there but cannot be read; ``size``: another
#: size; ``digest``: the same size, other bytes.
UnsettledReason = Literal["missing", "not_regular", "unreadable", "size", "digest"]


@dataclass(frozen=True)
class RecordedLeg:
    """A completed node that recorded artifacts: its leg key, kind and records."""

    key: str
    kind: NodeKind
    records: tuple[ArtifactRecord, ...]


@dataclass(frozen=True)
class Unsettled:
    """One recorded artifact that is not there as recorded."""

    node: str
    kind: NodeKind
    path: str
    reason: UnsettledReason
    expected: ArtifactRecord
    found_bytes: int | None = None
    found_digest: str | None = None
    detail: str = ""

    def found_text(self) -> str:
        """What was found instead, in words."""
        if self.reason == "size":
            return f"{self.found_bytes} bytes"
        if self.reason == "digest":
            return f"the same size with digest {self.found_digest}"
        said = {"missing": "missing", "not_regular": "not a regular file"}.get(
            self.reason, self.reason
        )
        return f"{said} ({self.detail})" if self.detail else said

    def describe(self) -> str:
        """``node 'b': artifact 'out/x.md': expected N bytes blake2b:..., found ...``."""
        return (
            f"node {self.node!r}: artifact {self.path!r}: expected {self.expected.bytes} bytes "
            f"{self.expected.digest}, found {self.found_text()}"
        )

    def to_json(self) -> dict[str, Any]:
        """The stable object ``verify --json`` and a refused ``resume --json`` print."""
        return {
            "node": self.node,
            "kind": self.kind,
            "path": self.path,
            "reason": self.reason,
            "expected": {"bytes": self.expected.bytes, "digest": self.expected.digest},
            "found": {
                "bytes": self.found_bytes,
                "digest": self.found_digest,
                "detail": self.detail or None,
            },
        }


@dataclass(frozen=True)
class Settlement:
    """A checkpoint settled against its contract: what was checked and what did not match."""

    contract: ArtifactContract | None
    legs: tuple[RecordedLeg, ...]
    unsettled: tuple[Unsettled, ...]

    @property
    def settled(self) -> bool:
        """True when every recorded artifact is there as recorded."""
        return not self.unsettled

    @property
    def checked(self) -> int:
        """How many recorded files were looked at."""
        return sum(len(leg.records) for leg in self.legs)

    def to_json(self) -> dict[str, Any]:
        """``artifact_root``, ``checked``, ``nodes`` (legs with records), ``unsettled``."""
        return {
            "artifact_root": str(self.contract.root) if self.contract else None,
            "checked": self.checked,
            "nodes": [
                {
                    "id": leg.key,
                    "kind": leg.kind,
                    "artifacts": [r.to_json() for r in leg.records],
                }
                for leg in self.legs
            ],
            "unsettled": [u.to_json() for u in self.unsettled],
        }


# -- 1. the persisted contract -------------------------------------------------------------


def _stored_contract(home: Path, session_id: str) -> tuple[ArtifactContract | None, str | None]:
    """The contract in the state DB row of ``session_id``: (contract, why unreadable)."""
    if not session_id or not db_exists(home):
        return None, None
    with StateDB.open(home, create=False) as db:
        row = db.get_session(session_id)
    if row is None or row.artifact_contract_json is None:
        return None, None
    try:
        return ArtifactContract.from_json(json.loads(row.artifact_contract_json)), None
    except (ValueError, ContractError) as exc:  # JSONDecodeError is a ValueError
        return None, str(exc)


def source_contract(home: Path, state: CheckpointState) -> ArtifactContract | None:
    """The contract the run that wrote ``state`` persisted, checked against the copy.

    None when neither the state DB nor the checkpoint holds one (a run from before
    contracts); whether that is acceptable is :func:`recorded_legs`' rule.

    Raises:
        ArtifactContractError: either record is unreadable, or they disagree.
    """
    where = f"session {state.session_id}"
    stored, stored_error = _stored_contract(home, state.session_id)
    if stored_error is not None:
        raise ArtifactContractError(
            f"the artifact contract {where} persisted cannot be read ({stored_error}); "
            "its recorded artifacts cannot be settled"
        )
    try:
        copy = checkpoint_contract(state.config, (e.raw for e in state.spawned))
    except ContractError as exc:
        raise ArtifactContractError(
            f"the checkpoint's copy of the artifact contract cannot be read ({exc})"
        ) from None
    if stored != copy:
        if stored is None:
            why = "the state DB holds no artifact contract for it, but its checkpoint does"
        elif copy is None:
            why = "its checkpoint holds no copy of the artifact contract the state DB records"
        else:
            # Name the leg and file (decision 114): which record to believe is the
            # operator's call, and "they disagree" alone gives nothing to check.
            why = (
                "the state DB's artifact contract (sessions.artifact_contract_json) and the "
                "checkpoint's copy (config.artifact_contract and spawned declarations) "
                f"disagree: {contract_difference(stored, copy)}"
            )
        raise ArtifactContractError(f"{where}: {why}; its recorded artifacts cannot be settled")
    return stored


# -- 2. entries against the contract ---------------------------------------------------------


def _completed(state: CheckpointState) -> Iterable[tuple[str, NodeKind, Mapping[str, Any]]]:
    for key, entry in state.ops.items():
        if entry.status == "completed":
            yield key, "planned", entry.raw
    for spawned in state.spawned:
        if spawned.status == "completed":
            yield spawned.spawn_id or spawned.node_id, "spawned", spawned.raw


def recorded_legs(
    contract: ArtifactContract | None, state: CheckpointState
) -> tuple[RecordedLeg, ...]:
    """Every completed node that recorded artifacts, checked against ``contract``.

    Raises:
        ArtifactContractError: a node recorded artifacts with no contract, or records
            other paths than its contract declares, or declares files it never recorded,
            or its ``artifacts`` member cannot be read.
    """
    legs: list[RecordedLeg] = []
    for key, kind, raw in _completed(state):
        member = raw.get("artifacts")
        try:
            records = records_from_json(member) if member is not None else None
        except ValueError as exc:
            raise ArtifactContractError(
                f"node {key!r}: its recorded artifacts cannot be read ({exc})"
            ) from None
        declared = contract.declared(key) if contract is not None else ()
        if not records and not declared:
            continue
        if contract is None:
            raise ArtifactContractError(
                f"node {key!r} recorded artifacts, but its run persisted no artifact contract; "
                "an absent record is not evidence, so they cannot be settled"
            )
        paths = sorted(r.path for r in records or ())
        if paths != sorted(declared):
            raise ArtifactContractError(
                f"node {key!r}: its artifact contract declares {sorted(declared)} but its "
                f"entry records {paths}; the record cannot settle the contract"
            )
        legs.append(RecordedLeg(key, kind, records or ()))
    return tuple(legs)


# -- 3. the files ------------------------------------------------------------------------------


#: A live-check problem as a settle reason (an empty file is a record, compared by size).
_REASON: dict[str, UnsettledReason] = {
    "missing": "missing",
    "not_regular": "not_regular",
    "unreadable": "unreadable",
    "empty": "size",
}


def _compare(leg: RecordedLeg, expected: ArtifactRecord, root: Path) -> Unsettled | None:
    found = inspect_artifact(root / leg.key, expected.path)

    def unsettled(reason: UnsettledReason, **found_as: Any) -> Unsettled:
        return Unsettled(leg.key, leg.kind, expected.path, reason, expected, **found_as)

    if isinstance(found, ArtifactProblem):
        return unsettled(_REASON[found.kind], detail=found.detail)
    if found.bytes != expected.bytes:
        return unsettled("size", found_bytes=found.bytes)
    if found.digest != expected.digest:
        return unsettled("digest", found_bytes=found.bytes, found_digest=found.digest)
    return None


def settle_legs(contract: ArtifactContract, legs: Iterable[RecordedLeg]) -> list[Unsettled]:
    """Look for every recorded file under the contract's root; what does not match."""
    out: list[Unsettled] = []
    for leg in legs:
        for expected in leg.records:
            problem = _compare(leg, expected, contract.root)
            if problem is not None:
                out.append(problem)
    return out


def settle(home: Path, state: CheckpointState) -> Settlement:
    """Settle every completed node of a loaded checkpoint (``steerflow verify``).

    ``home`` locates the state DB holding the persisted contract of the session that
    wrote ``state``.

    Raises:
        ArtifactContractError: the contract is missing, unreadable or disagrees (see
            :func:`source_contract` and :func:`recorded_legs`).
    """
    contract = source_contract(home, state)
    legs = recorded_legs(contract, state)
    unsettled = settle_legs(contract, legs) if contract is not None else []
    return Settlement(contract, legs, tuple(unsettled))
